#!/usr/bin/env bash
# Run three agent clients against a running Pagoda server, each for one turn:
#
#   claude     Claude Code (npm @anthropic-ai/claude-code), `claude -p ... --bare`, Anthropic's
#              Messages API (POST /v1/messages?beta=true, streamed)
#   codex      Codex CLI (npm @openai/codex), `codex exec`, a custom model provider with
#              wire_api = "responses" (POST /v1/responses, streamed)
#   sdk        the OpenAI Agents SDK (PyPI openai-agents), an agent with one function tool through
#              OpenAIResponsesModel (POST /v1/responses), which must call the tool and then answer
#              (scripts/agents_sdk_check.py)
#
# The clients are installed, pinned, into $PAGODA_TOOLS_DIR/agents (default
# ~/.cache/pagoda-tools/agents): npm packages under npm/, openai-agents in venv/. Installing needs
# the npm registry and PyPI; running needs nothing but the server. Each step prints PASS or FAIL
# with the reason; the script exits 1 if any step failed.
#
#   scripts/agent-clients.sh [--base-url URL] [--model NAME] [--api-key KEY] [--only LIST]
#                            [--timeout SECS] [--full-prompts] [--as-shipped] [--install-only]
#                            [--self-test]
#
#   --base-url URL   server root (default http://127.0.0.1:8000); /v1 is added where a client needs it
#   --model NAME     model name to send (default: the first id of GET /v1/models)
#   --api-key KEY    sent as x-api-key (Claude Code) and Authorization: Bearer (Codex, the SDK)
#   --only LIST      comma-separated subset of claude,codex,sdk
#   --timeout SECS   per client (default 300)
#   --max-output N   output token cap given to the clients (default 1024: Claude Code sends no
#                    temperature, and at the default 1 a small model may ramble for a while)
#   --context-window N  the model's context window, told to Codex (default 8192; with --as-shipped,
#                    told only when given, e.g. 32768 for a server run with --rope-scaling)
#   --full-prompts   run Claude Code with its default tools and Codex with its own instructions and
#                    tools (about 10k tokens each: needs a 32k-context model); by default both are
#                    trimmed to fit an 8k context (see docs/agent-clients.md)
#   --as-shipped     run Claude Code and Codex as they ship: nothing set but the server, the key and
#                    the model (no trimming, no --bare, no output cap, Codex's default tools with
#                    web_search; Codex's and Claude Code's prompts need a 32k-context model). Prints
#                    each client's wall time. The SDK check is ours and runs as ever.
#   --install-only   install (or check) the pinned clients and stop
#   --self-test      run against scripts/agent_fake_server.py on a free port instead of a server
#   --capture FILE   with --self-test: append every request the fake server saw to FILE (JSONL)
#
# Environment: PAGODA_TOOLS_DIR, PYTHON (for the venv, default python3), NPM (default npm).
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
OPENAI_AGENTS_VERSION=0.24.0
OPENAI_VERSION=3.57.0

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS_DIR=${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}/agents
NPM_PREFIX=$TOOLS_DIR/npm
VENV=$TOOLS_DIR/venv
PYTHON=${PYTHON:-python3}
NPM=${NPM:-npm}

BASE_URL=http://127.0.0.1:8000
MODEL=
API_KEY=
ONLY=claude,codex,sdk
TIMEOUT=300
MAX_OUTPUT=1024
CONTEXT_WINDOW=8192
CONTEXT_WINDOW_GIVEN=0
FULL_PROMPTS=0
AS_SHIPPED=0
INSTALL_ONLY=0
SELF_TEST=0
CAPTURE=

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "agent-clients: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
        --base-url) BASE_URL=${2:?}; shift 2 ;;
        --model) MODEL=${2:?}; shift 2 ;;
        --api-key) API_KEY=${2:?}; shift 2 ;;
        --only) ONLY=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --max-output) MAX_OUTPUT=${2:?}; shift 2 ;;
        --context-window) CONTEXT_WINDOW=${2:?}; CONTEXT_WINDOW_GIVEN=1; shift 2 ;;
        --full-prompts) FULL_PROMPTS=1; shift ;;
        --as-shipped) AS_SHIPPED=1; FULL_PROMPTS=1; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --self-test) SELF_TEST=1; shift ;;
        --capture) CAPTURE=${2:?}; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
BASE_URL=${BASE_URL%/}
BASE_URL=${BASE_URL%/v1}
for c in ${ONLY//,/ }; do
    case $c in claude|codex|sdk) ;; *) die "--only: unknown client '$c' (claude, codex, sdk)" ;; esac
done
wants() { [[ ",$ONLY," == *",$1,"* ]]; }

# ------------------------------------------------------------------ install (idempotent)

npm_pkg_version() {  # the installed version of npm package $1, or nothing
    local f=$NPM_PREFIX/node_modules/$1/package.json
    [ -f "$f" ] && "$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$f" 2>/dev/null || true
}

install_npm() {
    local want=()
    wants claude && [ "$(npm_pkg_version @anthropic-ai/claude-code)" != "$CLAUDE_CODE_VERSION" ] \
        && want+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
    wants codex && [ "$(npm_pkg_version @openai/codex)" != "$CODEX_VERSION" ] \
        && want+=("@openai/codex@$CODEX_VERSION")
    if [ ${#want[@]} -gt 0 ]; then
        command -v "$NPM" >/dev/null || die "npm not found (needed to install ${want[*]})"
        echo "agent-clients: installing ${want[*]} into $NPM_PREFIX"
        mkdir -p "$NPM_PREFIX"
        # Keep whatever is already installed there: name the other pinned package too.
        local all=()
        [ -d "$NPM_PREFIX/node_modules/@anthropic-ai/claude-code" ] || wants claude \
            && all+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
        [ -d "$NPM_PREFIX/node_modules/@openai/codex" ] || wants codex \
            && all+=("@openai/codex@$CODEX_VERSION")
        "$NPM" install --prefix "$NPM_PREFIX" --save-exact --no-fund --no-audit --loglevel=error "${all[@]}" >&2
    fi
    # Claude Code's postinstall copies the native binary over bin/claude.exe; run it by hand if
    # npm skipped install scripts (the placeholder then fails --version).
    if wants claude && ! "$NPM_PREFIX/node_modules/.bin/claude" --version >/dev/null 2>&1; then
        (cd "$NPM_PREFIX/node_modules/@anthropic-ai/claude-code" && node install.cjs) >&2 \
            || die "claude: the native binary did not install (node install.cjs failed)"
    fi
}

install_venv() {
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$OPENAI_AGENTS_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(version("openai-agents") != sys.argv[1])
EOF
    then
        return 0
    fi
    echo "agent-clients: installing openai-agents==$OPENAI_AGENTS_VERSION into $VENV"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "openai-agents==$OPENAI_AGENTS_VERSION" "openai==$OPENAI_VERSION" >&2
}

if wants claude || wants codex; then install_npm; fi
if wants sdk; then install_venv; fi
CLAUDE=$NPM_PREFIX/node_modules/.bin/claude
CODEX=$NPM_PREFIX/node_modules/.bin/codex
if [ $INSTALL_ONLY = 1 ]; then
    wants claude && echo "claude: $("$CLAUDE" --version)"
    wants codex && echo "codex: $("$CODEX" --version)"
    wants sdk && echo "openai-agents: $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(v("openai-agents"), "(openai", v("openai") + ")")')"
    exit 0
fi

# ------------------------------------------------------------------ server

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agent-clients.XXXXXX")
FAKE_PID=
cleanup() {
    if [ -n "$FAKE_PID" ]; then kill "$FAKE_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ $SELF_TEST = 1 ]; then
    "$PYTHON" "$SCRIPT_DIR/agent_fake_server.py" --port 0 --port-file "$WORK/port" \
        --log "${CAPTURE:-$WORK/requests.jsonl}" --model fake-model >"$WORK/fake.log" 2>&1 &
    FAKE_PID=$!
    for _ in $(seq 100); do [ -s "$WORK/port" ] && break; sleep 0.1; done
    [ -s "$WORK/port" ] || die "the fake server did not start: $(cat "$WORK/fake.log")"
    BASE_URL=http://127.0.0.1:$(cat "$WORK/port")
    echo "agent-clients: self-test against the fake server at $BASE_URL"
fi

# Fail fast when nothing listens there (Codex would otherwise wait for the network until its timeout).
if ! "$PYTHON" - "$BASE_URL" <<'EOF'
import socket, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
try:
    socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=10).close()
except OSError as e:
    sys.exit("cannot connect to %s: %s" % (sys.argv[1], e))
EOF
then
    for c in ${ONLY//,/ }; do echo "FAIL $c: no server at $BASE_URL"; done
    exit 1
fi

if [ -z "$MODEL" ]; then
    MODEL=$("$PYTHON" - "$BASE_URL" "$API_KEY" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/models")
if sys.argv[2]:
    req.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    print(json.load(urllib.request.urlopen(req, timeout=10))["data"][0]["id"])
except Exception as e:
    sys.exit("cannot list models at %s/v1/models: %s" % (sys.argv[1], e))
EOF
    ) || die "no --model given and GET $BASE_URL/v1/models failed"
fi
echo "agent-clients: server $BASE_URL, model $MODEL"

FAILED=0
pass() { echo "PASS $1: $2"; }
fail() { echo "FAIL $1: $2"; FAILED=1; }
tail_of() { tail -c 600 "$1" | tr '\n' ' '; }

# ------------------------------------------------------------------ Claude Code

run_claude() {
    local home=$WORK/claude-home out=$WORK/claude.json err=$WORK/claude.err rc=0
    mkdir -p "$home"
    local tools=() settings=(--bare --append-system-prompt "Answer in one short sentence.")
    local limits=(CLAUDE_CODE_MAX_OUTPUT_TOKENS="$MAX_OUTPUT" CLAUDE_CODE_MAX_RETRIES=1)
    [ $FULL_PROMPTS = 1 ] || tools=(--tools "")
    # As shipped: its own system prompt, tools, max_tokens and retries.
    [ $AS_SHIPPED = 0 ] || { settings=(); limits=(); }
    # --bare: no hooks, plugins, CLAUDE.md or background prefetches; the key is only
    # ANTHROPIC_API_KEY. The DISABLE_* variables stop telemetry, error reports and update checks
    # (and the HEAD /api/hello probe). CLAUDE_CODE_MAX_OUTPUT_TOKENS replaces max_tokens 32000.
    local started=$SECONDS
    (cd "$WORK" && env HOME="$home" CLAUDE_CONFIG_DIR="$home/.claude" \
        ANTHROPIC_BASE_URL="$BASE_URL" ANTHROPIC_API_KEY="${API_KEY:-sk-pagoda-local}" \
        ANTHROPIC_MODEL="$MODEL" ANTHROPIC_SMALL_FAST_MODEL="$MODEL" \
        ANTHROPIC_DEFAULT_HAIKU_MODEL="$MODEL" ANTHROPIC_DEFAULT_SONNET_MODEL="$MODEL" \
        ANTHROPIC_DEFAULT_OPUS_MODEL="$MODEL" \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
        DISABLE_AUTOUPDATER=1 "${limits[@]}" \
        timeout "$TIMEOUT" "$CLAUDE" -p "What is the capital of France?" --model "$MODEL" \
        "${settings[@]}" "${tools[@]}" --output-format json --no-session-persistence \
        >"$out" 2>"$err" </dev/null) || rc=$?
    [ $AS_SHIPPED = 0 ] || echo "agent-clients: claude took $((SECONDS - started)) s"
    if [ $rc = 124 ]; then fail claude "timed out after ${TIMEOUT}s: $(tail_of "$err")"; return; fi
    local verdict
    verdict=$("$PYTHON" - "$out" "$rc" <<'EOF'
import json, sys
rc = int(sys.argv[2])
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    print("FAIL exit %d, no JSON result on stdout" % rc); sys.exit()
text = (r.get("result") or "").strip()
if rc != 0 or r.get("is_error") or r.get("subtype") != "success":
    print("FAIL exit %d, %s, api_error_status=%s: %s" % (rc, r.get("subtype"), r.get("api_error_status"), text[:300]))
elif not text:
    print("FAIL empty answer (stop_reason %s)" % r.get("stop_reason"))
else:
    print("PASS %d turn(s), answer: %r" % (r.get("num_turns", 0), text[:200]))
EOF
    )
    case $verdict in
        PASS*) pass claude "${verdict#PASS }" ;;
        *) fail claude "${verdict#FAIL } $(tail_of "$err")" ;;
    esac
}

# ------------------------------------------------------------------ Codex CLI

run_codex() {
    local home=$TOOLS_DIR/codex-home work=$WORK/codex-work rc=0
    mkdir -p "$home" "$work"
    local key_line=
    [ -z "$API_KEY" ] || key_line='env_key = "PAGODA_API_KEY"'
    if [ $AS_SHIPPED = 1 ]; then
        # Codex as it ships: the model and where to reach it, nothing else.
        {
            echo "# Written by scripts/agent-clients.sh --as-shipped on each run."
            echo "model = \"$MODEL\""
            echo 'model_provider = "pagoda"'
            # Only when asked: Codex otherwise assumes a context far above a small model's.
            [ $CONTEXT_WINDOW_GIVEN = 0 ] || echo "model_context_window = $CONTEXT_WINDOW"
            echo
            echo '[model_providers.pagoda]'
            echo 'name = "Pagoda"'
            echo "base_url = \"$BASE_URL/v1\""
            echo 'wire_api = "responses"'
            echo "$key_line"
        } >"$home/config.toml"
    else
        {
            echo "# Written by scripts/agent-clients.sh on each run."
            echo "model = \"$MODEL\""
            echo 'model_provider = "pagoda"'
            echo "model_context_window = $CONTEXT_WINDOW"
            echo 'approval_policy = "never"'
            echo 'sandbox_mode = "read-only"'
            echo 'check_for_update_on_startup = false'
            echo 'model_reasoning_summary = "none"'
            if [ $FULL_PROMPTS = 0 ]; then
                # Codex's own instructions and tools come to ~10k tokens; an 8k model needs these.
                # web_search stays: the server leaves it out of the prompt (--hosted-tools).
                echo "model_instructions_file = \"$home/instructions.md\""
                echo 'include_permissions_instructions = false'
                echo 'include_apps_instructions = false'
                echo 'include_environment_context = false'
                echo 'include_collaboration_mode_instructions = false'
            fi
            echo
            echo '[model_providers.pagoda]'
            echo 'name = "Pagoda"'
            echo "base_url = \"$BASE_URL/v1\""
            echo 'wire_api = "responses"'
            echo 'request_max_retries = 1'
            echo 'stream_max_retries = 1'
            echo "$key_line"
            echo
            echo '[analytics]'
            echo 'enabled = false'
            if [ $FULL_PROMPTS = 0 ]; then
                echo
                echo '[features]'
                # view_image and request_user_input are the last two tools: without them a small
                # model is not tempted to call a tool it cannot use well.
                for f in goals apps plugins image_generation skill_search tool_suggest \
                    hooks shell_tool view_image; do
                    echo "$f = false"
                done
                echo
                echo '[tools.experimental_request_user_input]'
                echo 'enabled = false'
                echo
                echo '[agents]'
                echo 'enabled = false'
                echo
                echo '[skills]'
                echo 'include_instructions = false'
                echo
                echo '[skills.bundled]'
                echo 'enabled = false'
            fi
        } >"$home/config.toml"
    fi
    echo "You are a helpful assistant. Answer briefly." >"$home/instructions.md"
    local prompt="What is the capital of France?" started=$SECONDS
    [ $AS_SHIPPED = 0 ] || prompt="Say hello in one word."
    (cd "$work" && env CODEX_HOME="$home" PAGODA_API_KEY="$API_KEY" \
        timeout "$TIMEOUT" "$CODEX" exec --skip-git-repo-check --ephemeral --strict-config \
        --color never -o "$WORK/codex-last.txt" "$prompt" \
        >"$WORK/codex.out" 2>&1 </dev/null) || rc=$?
    [ $AS_SHIPPED = 0 ] || echo "agent-clients: codex took $((SECONDS - started)) s"
    local answer=
    [ -f "$WORK/codex-last.txt" ] && answer=$(tr '\n' ' ' <"$WORK/codex-last.txt" | head -c 200)
    if [ $rc = 124 ]; then
        fail codex "timed out after ${TIMEOUT}s: $(tail_of "$WORK/codex.out")"
    elif [ $rc != 0 ]; then
        fail codex "exit $rc: $(tail_of "$WORK/codex.out")"
    elif [ -z "${answer// /}" ]; then
        fail codex "the turn ended without an answer: $(tail_of "$WORK/codex.out")"
    else
        pass codex "answer: '$answer'"
    fi
}

# ------------------------------------------------------------------ Agents SDK

run_sdk() {
    # Once with Runner.run, once with Runner.run_streamed (the typed SSE events).
    local mode name rc line
    for mode in "" --stream; do
        name=sdk${mode:+-stream}
        rc=0
        env OPENAI_AGENTS_DISABLE_TRACING=1 timeout "$TIMEOUT" "$VENV/bin/python" \
            "$SCRIPT_DIR/agents_sdk_check.py" --base-url "$BASE_URL" --model "$MODEL" \
            --api-key "${API_KEY:-sk-pagoda-local}" --max-tokens "$MAX_OUTPUT" $mode \
            >"$WORK/$name.out" 2>&1 </dev/null || rc=$?
        line=$(grep -E '^(PASS|FAIL):' "$WORK/$name.out" | tail -1 || true)
        if [ $rc = 124 ]; then
            fail "$name" "timed out after ${TIMEOUT}s: $(tail_of "$WORK/$name.out")"
        elif [ $rc = 0 ] && [[ $line == PASS:* ]]; then
            pass "$name" "${line#PASS: }"
        elif [ -n "$line" ]; then
            fail "$name" "${line#*: }"
        else
            fail "$name" "exit $rc: $(tail_of "$WORK/$name.out")"
        fi
    done
}

wants claude && run_claude
wants codex && run_codex
wants sdk && run_sdk

if [ $SELF_TEST = 1 ]; then
    echo "agent-clients: the fake server saw $(wc -l <"${CAPTURE:-$WORK/requests.jsonl}") request(s)"
fi
exit $FAILED
