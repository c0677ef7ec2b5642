#!/usr/bin/env python3
"""Multi-turn agent traces for scripts/bench-agent-turns.sh, built from captured client requests.

The fixtures in tests/fixtures/agent-traces/ are the first request bodies Claude Code 2.1.332
(Anthropic Messages) and Codex 0.171.0 (OpenAI Responses) sent, as shipped (their own system
prompts and tools), to scripts/agent_fake_server.py. This script

  clean RAW.jsonl DIR   takes the first /v1/messages and /v1/responses request of a capture
                        (scripts/agent-clients.sh --self-test --as-shipped --capture RAW.jsonl)
                        and writes DIR/claude-code.json and DIR/codex.json with everything
                        machine-specific or secret replaced: paths, user and home, the capture
                        date, the kernel version, client ids and metadata;
  build DIR OUT         writes OUT/<trace>.jsonl, one replay request per line, turn by turn;
  self-test [DIR]       checks that the fixtures hold nothing machine-specific and that the
                        turns build, deterministically, each repeating the one before.

Turn 1 is the capture with its question replaced by a coding task; turn k+1 is turn k's
conversation plus the assistant's answer (a short text and one tool call) and the tool's result,
a few hundred tokens, as an agent loop sends them (STEPS below, the same for both clients; the
replay is fixed, not the model's answers, so both servers see the same requests).

Replay form: the servers under test are given the same plain chat template, which knows no tools,
and Pagoda and llama.cpp describe tools to such a model in different words (and constrain the
answer with different grammars). So that both do the same work, a replay request carries no
`tools` field: the tool definitions are written into the system text (as JSON, tool by tool),
and the tool calls and results in the history are text. The request otherwise keeps the client's
API: Claude Code's turns go to /v1/messages, Codex's to /v1/responses. Each asks for
`max_tokens` (`max_output_tokens`) tokens at temperature 0, streamed.

--max-prompt-tokens N cuts the system text so that turn 1 holds about N tokens (4 characters a
token; later turns add their messages to it), for smoke runs; --turns N keeps the first N turns.
"""

import argparse
import copy
import json
import re
import sys
from pathlib import Path

TRACES = {"claude-code": "/v1/messages", "codex": "/v1/responses"}

TASK = (
    "In this repository, `parse_duration` in src/util.rs rejects inputs like \"1h30m\" that "
    "combine units. Find it, make it accept a sequence of number-unit pairs, and add a test."
)

UTIL_RS = """use std::time::Duration;

/// Parses a duration such as "90s", "5m" or "2h" (one number, one unit).
pub fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or(ParseError::MissingUnit)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| ParseError::BadNumber(number.to_string()))?;
    let seconds = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        other => return Err(ParseError::UnknownUnit(other.to_string())),
    };
    Ok(Duration::from_secs(seconds))
}

#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    MissingUnit,
    BadNumber(String),
    UnknownUnit(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    }

    #[test]
    fn rejects_unknown_units() {
        assert_eq!(parse_duration("3w"), Err(ParseError::UnknownUnit("w".into())));
    }
}
"""

GREP_OUT = """src/util.rs:4:pub fn parse_duration(text: &str) -> Result<Duration, ParseError> {
src/config.rs:88:        let timeout = util::parse_duration(&raw.timeout).map_err(ConfigError::Timeout)?;
src/config.rs:97:        let retry_after = util::parse_duration(&raw.retry_after).map_err(ConfigError::RetryAfter)?;
src/cli.rs:41:    #[arg(long, value_parser = util::parse_duration, default_value = "30s")]
src/cli.rs:52:    #[arg(long, value_parser = util::parse_duration, default_value = "5m")]
tests/config.rs:17:    assert_eq!(cfg.timeout, Duration::from_secs(30));
tests/config.rs:33:    // "1h30m" is what operators write; it fails today with UnknownUnit("h30m").
tests/config.rs:34:    let err = Config::from_str("timeout = \\"1h30m\\"").unwrap_err();
tests/config.rs:35:    assert!(err.to_string().contains("h30m"), "{err}");
"""

PATCH = """--- a/src/util.rs
+++ b/src/util.rs
@@ -1,19 +1,27 @@
-/// Parses a duration such as "90s", "5m" or "2h" (one number, one unit).
+/// Parses a duration such as "90s", "5m" or "1h30m": one or more number-unit pairs, summed.
 pub fn parse_duration(text: &str) -> Result<Duration, ParseError> {
-    let text = text.trim();
-    let split = text
-        .find(|c: char| !c.is_ascii_digit())
-        .ok_or(ParseError::MissingUnit)?;
-    let (number, unit) = text.split_at(split);
-    let n: u64 = number.parse().map_err(|_| ParseError::BadNumber(number.to_string()))?;
-    let seconds = match unit {
-        "s" => n,
-        "m" => n * 60,
-        "h" => n * 3600,
-        "d" => n * 86_400,
-        other => return Err(ParseError::UnknownUnit(other.to_string())),
-    };
-    Ok(Duration::from_secs(seconds))
+    let mut rest = text.trim();
+    if rest.is_empty() {
+        return Err(ParseError::MissingUnit);
+    }
+    let mut seconds = 0u64;
+    while !rest.is_empty() {
+        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or(ParseError::MissingUnit)?;
+        let (number, tail) = rest.split_at(digits);
+        let n: u64 = number.parse().map_err(|_| ParseError::BadNumber(number.to_string()))?;
+        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
+        let (unit, next) = tail.split_at(unit_len);
+        seconds += n * match unit {
+            "s" => 1,
+            "m" => 60,
+            "h" => 3600,
+            "d" => 86_400,
+            other => return Err(ParseError::UnknownUnit(other.to_string())),
+        };
+        rest = next;
+    }
+    Ok(Duration::from_secs(seconds))
 }
"""

TEST_OUT = """   Compiling durations v0.3.1 (/home/user/project)
    Finished `test` profile [unoptimized + debuginfo] target(s) in 2.71s
     Running unittests src/lib.rs (target/debug/deps/durations-5f0c2a9d1e7b3c44)

running 4 tests
test util::tests::single_units ... ok
test util::tests::rejects_unknown_units ... ok
test util::tests::combined_units ... ok
test util::tests::rejects_trailing_number ... ok

test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

     Running tests/config.rs (target/debug/deps/config-0b9e4d3a77c1f260)

running 3 tests
test parses_defaults ... ok
test combined_timeout ... ok
test rejects_bad_retry_after ... ok

test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s
"""

# One step per follow-up turn: what the assistant said and called, and what the tool returned.
# `claude` is the call in Claude Code's tools, `codex` the same in Codex's exec_command.
STEPS = [
    {
        "text": "I'll start by finding where `parse_duration` is defined and used.",
        "claude": ("Bash", {"command": "grep -rn parse_duration src tests", "description": "Find parse_duration"}),
        "codex": {"cmd": "rg -n parse_duration src tests", "workdir": "/home/user/project"},
        "output": GREP_OUT,
    },
    {
        "text": "It is in src/util.rs; config.rs and cli.rs call it. Let me read the whole function.",
        "claude": ("Read", {"file_path": "/home/user/project/src/util.rs"}),
        "codex": {"cmd": "sed -n '1,200p' src/util.rs", "workdir": "/home/user/project"},
        "output": UTIL_RS,
    },
    {
        "text": "The parser splits once at the first non-digit, so \"1h30m\" leaves the unit \"h30m\". "
        "I'll loop over number-unit pairs and sum them.",
        "claude": (
            "Edit",
            {"file_path": "/home/user/project/src/util.rs", "old_string": UTIL_RS.split("\n#[derive")[0],
             "new_string": "(see patch)", "replace_all": False},
        ),
        "codex": {"cmd": "apply_patch <<'EOF'\n" + PATCH + "EOF", "workdir": "/home/user/project"},
        "output": "The file /home/user/project/src/util.rs has been updated.\n" + PATCH,
    },
    {
        "text": "Now the tests, including a new one for combined units.",
        "claude": ("Bash", {"command": "cargo test", "description": "Run the tests"}),
        "codex": {"cmd": "cargo test", "workdir": "/home/user/project"},
        "output": TEST_OUT,
    },
]
MAX_TURNS = len(STEPS) + 1


# ---------------------------------------------------------------- clean


def scrub_text(s: str, date: str) -> str:
    s = re.sub(r"/tmp/agent-clients\.[A-Za-z0-9]+/claude-home/\.claude/projects/[-A-Za-z0-9]+",
               "/home/user/.claude/projects/-home-user-project", s)
    s = re.sub(r"/tmp/agent-clients\.[A-Za-z0-9]+(/codex-work)?", "/home/user/project", s)
    s = re.sub(r"/root/\.cache/pagoda-tools/agents/codex-home", "/home/user/.codex", s)
    # Not the closing tag `</root>` of the environment context.
    s = re.sub(r"(?<!<)/root\b", "/home/user", s)
    s = re.sub(r"OS Version: [^\n]*", "OS Version: Linux 6.8.0", s)
    if date:
        s = s.replace(date, "2026-01-01")
    return s


def scrub(obj, date):
    if isinstance(obj, str):
        return scrub_text(obj, date)
    if isinstance(obj, list):
        return [scrub(x, date) for x in obj]
    if isinstance(obj, dict):
        return {k: scrub(v, date) for k, v in obj.items()}
    return obj


def clean(raw: Path, out: Path) -> None:
    import datetime

    found = {}
    for line in raw.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        name = {"/v1/messages": "claude-code", "/v1/responses": "codex"}.get(e.get("path"))
        if name and name not in found and isinstance(e.get("body"), dict):
            date = datetime.datetime.fromtimestamp(e["ts"], datetime.timezone.utc).strftime("%Y-%m-%d")
            body = copy.deepcopy(e["body"])
            # Client and session ids, the installation id and the prompt-cache key: per machine.
            for k in ("metadata", "client_metadata", "prompt_cache_key"):
                body.pop(k, None)
            for item in body.get("input") or []:
                item.pop("id", None)
            body["model"] = "MODEL"
            found[name] = scrub(body, date)
    missing = set(TRACES) - set(found)
    if missing:
        sys.exit("no request for %s in %s" % (", ".join(sorted(missing)), raw))
    out.mkdir(parents=True, exist_ok=True)
    for name, body in found.items():
        (out / (name + ".json")).write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print("wrote %s (%d chars)" % (out / (name + ".json"), len(json.dumps(body))))


# ---------------------------------------------------------------- build


def tool_text(tools) -> str:
    """The tool definitions as the system text's last section: one JSON line per tool."""
    lines = ["# Tools", "", "You can call these tools. Each is given as one JSON object."]
    for t in tools:
        if t.get("type") == "namespace":
            for sub in t.get("tools") or []:
                lines.append(json.dumps(dict(sub, namespace=t.get("name")), ensure_ascii=False))
        elif t.get("type") in (None, "function"):
            lines.append(json.dumps(t, ensure_ascii=False))
        # Hosted tools (Codex's web_search) run at the provider, not in the prompt.
    return "\n".join(lines)


def call_text(name, args) -> str:
    return "<tool_call>%s</tool_call>" % json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def result_text(output) -> str:
    return "<tool_result>\n%s</tool_result>" % output


def block_text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


def cut(system: str, conversation_chars: int, max_tokens: int) -> str:
    """The system text cut so that turn 1 (conversation_chars besides it) is about max_tokens.

    Cut once, for every turn alike: later turns must keep turn 1's prompt as their prefix."""
    if not max_tokens:
        return system
    keep = max(0, max_tokens * 4 - conversation_chars)
    return system[:keep]


def claude_turns(cap, n, max_tokens, max_prompt_tokens):
    # The billing header block is attribution, not prompt (CLAUDE_CODE_ATTRIBUTION_HEADER=0 drops
    # it in the client), and llama.cpp rewrites it; left out so both servers see the same text.
    blocks = [b["text"] for b in cap["system"] if not b["text"].startswith("x-anthropic-billing-header:")]
    system = "\n\n".join(blocks)
    messages = []
    for m in cap["messages"]:
        if m["role"] == "system":  # Claude Code's environment message: part of the system text here
            system += "\n\n" + block_text(m["content"])
        else:
            messages.append({"role": m["role"], "content": block_text(m["content"])})
    # The captured question ("What is the capital of France?") becomes the coding task.
    messages[-1]["content"] = messages[-1]["content"].rsplit("\n", 1)[0] + "\n" + TASK
    system += "\n\n" + tool_text(cap["tools"])
    system = cut(system, sum(len(m["content"]) for m in messages), max_prompt_tokens)
    for k in range(n):
        if k > 0:
            step = STEPS[k - 1]
            name, args = step["claude"]
            messages.append({"role": "assistant", "content": step["text"] + "\n" + call_text(name, args)})
            messages.append({"role": "user", "content": result_text(step["output"])})
        yield {"model": "MODEL", "system": system, "messages": copy.deepcopy(messages),
               "max_tokens": max_tokens, "temperature": 0, "stream": True}


def codex_turns(cap, n, max_tokens, max_prompt_tokens):
    system_parts, user_parts = [], []
    for item in cap["input"]:
        text = "\n".join(c.get("text", "") for c in item.get("content") or [])
        (system_parts if item.get("role") in ("developer", "system") else user_parts).append(text)
    system = "\n\n".join(system_parts) + "\n\n" + tool_text(cap["tools"])
    # The environment context and the question, one user message (the question becomes the task).
    user_parts[-1] = TASK
    items = [{"type": "message", "role": "user", "content": "\n\n".join(user_parts)}]
    system = cut(system, len(items[0]["content"]), max_prompt_tokens)
    for k in range(n):
        if k > 0:
            step = STEPS[k - 1]
            items.append({"type": "message", "role": "assistant",
                          "content": step["text"] + "\n" + call_text("exec_command", step["codex"])})
            items.append({"type": "message", "role": "user", "content": result_text(step["output"])})
        sys_item = {"type": "message", "role": "system", "content": system}
        yield {"model": "MODEL", "input": [sys_item] + copy.deepcopy(items), "max_output_tokens": max_tokens,
               "temperature": 0, "stream": True, "store": False}


def build(fixtures: Path, out: Path, turns: int, max_tokens: int, max_prompt_tokens: int, only) -> None:
    if not 1 <= turns <= MAX_TURNS:
        sys.exit("--turns must be 1 to %d" % MAX_TURNS)
    out.mkdir(parents=True, exist_ok=True)
    for name, endpoint in TRACES.items():
        if only and name not in only:
            continue
        cap = json.loads((fixtures / (name + ".json")).read_text(encoding="utf-8"))
        gen = claude_turns if name == "claude-code" else codex_turns
        with open(out / (name + ".jsonl"), "w", encoding="utf-8") as f:
            for k, body in enumerate(gen(cap, turns, max_tokens, max_prompt_tokens), 1):
                f.write(json.dumps({"trace": name, "turn": k, "endpoint": endpoint, "body": body},
                                   ensure_ascii=False) + "\n")


def self_test(fixtures: Path) -> None:
    """The fixtures hold nothing machine-specific, and every trace builds MAX_TURNS turns in
    which turn k+1 repeats turn k's conversation and adds an answer and a result."""
    import tempfile

    for name in TRACES:
        text = (fixtures / (name + ".json")).read_text(encoding="utf-8")
        for pattern in (r"/tmp/", r"(?<!<)/root\b", r"agent-clients\.", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-",
                        r"device_id", r"2026-(?!01-01)\d\d-\d\d"):
            m = re.search(pattern, text)
            assert m is None, "%s.json holds %r" % (name, m.group(0))
    with tempfile.TemporaryDirectory() as out:
        build(fixtures, Path(out), MAX_TURNS, 64, 0, [])
        for name, endpoint in TRACES.items():
            reqs = [json.loads(line) for line in open(Path(out) / (name + ".jsonl"), encoding="utf-8")]
            assert [r["turn"] for r in reqs] == list(range(1, MAX_TURNS + 1)), name
            conv = "messages" if endpoint == "/v1/messages" else "input"
            for prev, cur in zip(reqs, reqs[1:]):
                a, b = prev["body"][conv], cur["body"][conv]
                assert b[: len(a)] == a and len(b) == len(a) + 2, (name, cur["turn"])
                assert b[-2]["role"] == "assistant" and "<tool_call>" in b[-2]["content"], (name, cur["turn"])
            first = reqs[0]["body"]
            assert "tools" not in first and first[conv][-1]["content"].endswith(TASK), name
            system = first.get("system") or first["input"][0]["content"]
            tool = '"name": "Bash"' if endpoint == "/v1/messages" else '"name": "exec_command"'
            assert "\n# Tools\n" in system and tool in system, name
        again = Path(out) / "again"
        build(fixtures, again, MAX_TURNS, 64, 0, [])
        for name in TRACES:
            assert (again / (name + ".jsonl")).read_bytes() == (Path(out) / (name + ".jsonl")).read_bytes(), name
    print("agent_traces.py self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("clean", help="fixtures from a fake-server capture")
    c.add_argument("raw", type=Path)
    c.add_argument("out", type=Path)
    b = sub.add_parser("build", help="replay requests from the fixtures")
    b.add_argument("fixtures", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--turns", type=int, default=MAX_TURNS)
    b.add_argument("--max-tokens", type=int, default=64)
    b.add_argument("--max-prompt-tokens", type=int, default=0, help="cut the system text to about this (0: whole)")
    b.add_argument("--traces", default="", help="comma-separated subset of claude-code,codex")
    t = sub.add_parser("self-test", help="check the fixtures and the turn builder")
    t.add_argument("fixtures", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent
                   / "tests" / "fixtures" / "agent-traces")
    a = ap.parse_args()
    if a.cmd == "self-test":
        self_test(a.fixtures)
    elif a.cmd == "clean":
        clean(a.raw, a.out)
    else:
        only = [t for t in a.traces.split(",") if t]
        for t in only:
            if t not in TRACES:
                sys.exit("--traces: unknown trace %r (claude-code, codex)" % t)
        build(a.fixtures, a.out, a.turns, a.max_tokens, a.max_prompt_tokens, only)


if __name__ == "__main__":
    main()
