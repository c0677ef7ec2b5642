#!/usr/bin/env python3
"""A capturing fake of the Anthropic Messages and OpenAI Responses endpoints.

Stdlib only. Logs every request (method, path, query, headers, JSON body) as one JSON line to
--log, and answers with a minimal valid reply so that agent clients (Claude Code, Codex CLI, the
OpenAI Agents SDK) finish a turn:

  POST /v1/messages               an Anthropic message, or its SSE stream when "stream": true
  POST /v1/messages/count_tokens  {"input_tokens": N}
  POST /v1/responses              a Responses API response, or its typed SSE events when streaming
  POST /v1/chat/completions       a chat completion (non-streaming only), for completeness
  GET  /v1/models                 a model list (OpenAI's shape, with Anthropic's fields too)
  HEAD / GET anything else        200 with an empty JSON object (--unknown-status to change)

With --anthropic-tool NAME, a Messages request offering tool NAME and holding no tool_result yet
is answered with a tool_use of it (Bash gets {"command": "echo hello-from-tool"}).

When a Responses request offers a function tool named "add" (--responses-tool) and its input holds
no function_call_output yet, the reply is a function_call to add(a=2, b=3) (--responses-tool-args),
so that a tool round trip is exercised; once the output is there, the reply is text that quotes it.

Used by scripts/agent-clients.sh --self-test and for the captures in docs/agent-clients-notes.md.
"""

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ANSWER = "The capital of France is Paris."
LOCK = threading.Lock()
LOG_PATH = None


def log_request(entry):
    if LOG_PATH is None:
        return
    with LOCK:
        with open(LOG_PATH, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")


def new_id(prefix):
    return prefix + uuid.uuid4().hex[:24]


def rough_tokens(obj):
    return max(1, len(json.dumps(obj)) // 4)


# ---------------------------------------------------------------- Anthropic Messages


def anthropic_tool_use(body, tool):
    """A tool_use block for the first tool named `tool` when no tool_result is in the messages yet."""
    if not tool:
        return None
    names = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    if tool not in names:
        return None
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in content):
            return None
    args = {"command": "echo hello-from-tool", "description": "Print a greeting"} if tool == "Bash" else {}
    return {"type": "tool_use", "id": new_id("toolu_"), "name": tool, "input": args}


def anthropic_message(body, text, tool=None):
    use = anthropic_tool_use(body, tool)
    if use is not None:
        return {
            "id": new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": [use],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": rough_tokens(body.get("messages", [])), "output_tokens": 20,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": rough_tokens(body.get("messages", [])),
            "output_tokens": max(1, len(text) // 4),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def anthropic_events(body, text, tool=None):
    msg = anthropic_message(body, text, tool)
    start = dict(msg, content=[], stop_reason=None)
    start["usage"] = dict(msg["usage"], output_tokens=1)
    yield "message_start", {"type": "message_start", "message": start}
    if msg["stop_reason"] == "tool_use":
        use = msg["content"][0]
        yield "content_block_start", {
            "type": "content_block_start",
            "index": 0,
            "content_block": dict(use, input={}),
        }
        yield "content_block_delta", {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": json.dumps(use["input"])},
        }
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": msg["usage"]["output_tokens"]},
        }
        yield "message_stop", {"type": "message_stop"}
        return
    yield "content_block_start", {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    yield "ping", {"type": "ping"}
    words = text.split(" ")
    for i, w in enumerate(words):
        piece = w if i == 0 else " " + w
        yield "content_block_delta", {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": piece},
        }
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": msg["usage"]["output_tokens"]},
    }
    yield "message_stop", {"type": "message_stop"}


# ---------------------------------------------------------------- OpenAI Responses


def input_items(body):
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": inp}]
    return inp if isinstance(inp, list) else []


RESPONSES_TOOL = "add"
RESPONSES_TOOL_ARGS = {"a": 2, "b": 3}


def responses_output(body):
    """The output items this fake answers with."""
    items = input_items(body)
    outputs = [it for it in items if isinstance(it, dict) and it.get("type") == "function_call_output"]
    tools = body.get("tools") or []
    has_tool = any(
        t.get("type") == "function" and t.get("name") == RESPONSES_TOOL for t in tools if isinstance(t, dict)
    )
    if has_tool and not outputs:
        return [
            {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": new_id("call_"),
                "name": RESPONSES_TOOL,
                "arguments": json.dumps(RESPONSES_TOOL_ARGS),
                "status": "completed",
            }
        ]
    text = ANSWER
    if outputs:
        text = "The tool returned %s." % outputs[-1].get("output")
    return [
        {
            "type": "message",
            "id": new_id("msg_"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }
    ]


def response_object(body, rid, created, status, output):
    out_tokens = sum(max(1, len(json.dumps(o)) // 4) for o in output)
    in_tokens = rough_tokens(body.get("input", "")) + rough_tokens(body.get("instructions") or "")
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", "fake"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None
        if status != "completed"
        else {
            "input_tokens": in_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": in_tokens + out_tokens,
        },
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def responses_events(body):
    rid = new_id("resp_")
    created = int(time.time())
    output = responses_output(body)
    seq = [0]

    def ev(kind, **fields):
        d = {"type": kind, "sequence_number": seq[0]}
        d.update(fields)
        seq[0] += 1
        return kind, d

    yield ev("response.created", response=response_object(body, rid, created, "in_progress", []))
    yield ev("response.in_progress", response=response_object(body, rid, created, "in_progress", []))
    for idx, item in enumerate(output):
        if item["type"] == "function_call":
            yield ev("response.output_item.added", output_index=idx, item=dict(item, arguments="", status="in_progress"))
            yield ev(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=idx,
                delta=item["arguments"],
            )
            yield ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=idx,
                name=item["name"],
                arguments=item["arguments"],
            )
            yield ev("response.output_item.done", output_index=idx, item=item)
            continue
        text = item["content"][0]["text"]
        yield ev("response.output_item.added", output_index=idx, item=dict(item, status="in_progress", content=[]))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)
        words = text.split(" ")
        for i, w in enumerate(words):
            yield ev(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=idx,
                content_index=0,
                delta=w if i == 0 else " " + w,
                logprobs=[],
            )
        yield ev(
            "response.output_text.done",
            item_id=item["id"],
            output_index=idx,
            content_index=0,
            text=text,
            logprobs=[],
        )
        yield ev(
            "response.content_part.done",
            item_id=item["id"],
            output_index=idx,
            content_index=0,
            part=dict(part, text=text),
        )
        yield ev("response.output_item.done", output_index=idx, item=item)
    yield ev("response.completed", response=response_object(body, rid, created, "completed", output))


# ---------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agent-fake/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw and self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            raw = b"".join(chunks)
        return raw

    def _capture(self, raw):
        u = urlsplit(self.path)
        entry = {
            "ts": time.time(),
            "method": self.command,
            "path": u.path,
            "query": parse_qs(u.query),
            "raw_query": u.query,
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }
        body = None
        if raw:
            try:
                body = json.loads(raw)
                entry["body"] = body
            except ValueError:
                entry["body_raw"] = raw[:4000].decode("latin-1")
                entry["body_len"] = len(raw)
        log_request(entry)
        return u.path, body if isinstance(body, dict) else {}

    def _json(self, code, obj, head=False):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", new_id("req_"))
        self.send_header("x-request-id", new_id("req_"))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _sse(self, events):
        named = self.server.event_lines
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", new_id("req_"))
        self.end_headers()
        for name, data in events:
            text = ("event: %s\n" % name if named else "") + "data: %s\n\n" % json.dumps(data)
            chunk = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _unknown(self, path, head=False):
        code = self.server.unknown_status
        self._json(code, {} if code < 400 else {"error": {"type": "not_found_error", "message": "no route " + path}}, head)

    def do_HEAD(self):
        path, _ = self._capture(b"")
        self._unknown(path, head=True)

    def do_GET(self):
        path, _ = self._capture(b"")
        if path.rstrip("/").endswith("/models"):
            now = int(time.time())
            models = [
                {
                    "id": m,
                    "object": "model",
                    "created": now,
                    "owned_by": "pagoda",
                    "type": "model",
                    "display_name": m,
                    "created_at": "2025-01-01T00:00:00Z",
                }
                for m in self.server.models
            ]
            self._json(
                200,
                {"object": "list", "data": models, "has_more": False, "first_id": models[0]["id"], "last_id": models[-1]["id"]},
            )
        else:
            self._unknown(path)

    def do_DELETE(self):
        self._capture(b"")
        self._json(200, {"deleted": True})

    def do_POST(self):
        path, body = self._capture(self._read_body())
        if path.endswith("/messages/count_tokens"):
            self._json(200, {"input_tokens": rough_tokens(body)})
        elif path.endswith("/messages"):
            tool = self.server.anthropic_tool
            if body.get("stream"):
                self._sse(anthropic_events(body, ANSWER, tool))
            else:
                self._json(200, anthropic_message(body, ANSWER, tool))
        elif path.endswith("/responses"):
            if body.get("stream"):
                self._sse(responses_events(body))
            else:
                rid = new_id("resp_")
                self._json(200, response_object(body, rid, int(time.time()), "completed", responses_output(body)))
        elif path.endswith("/chat/completions"):
            self._json(
                200,
                {
                    "id": new_id("chatcmpl-"),
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )
        else:
            self._json(404, {"error": {"type": "not_found_error", "message": "no route " + path}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--log", help="JSONL file to append every request to")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--model", action="append", default=None, help="model ids for /v1/models")
    ap.add_argument("--no-event-lines", action="store_true", help="SSE without 'event:' lines (data only)")
    ap.add_argument("--unknown-status", type=int, default=200, help="status for unknown GET/HEAD paths")
    ap.add_argument("--responses-tool", default="add", help="function tool a Responses request is answered with a call of")
    ap.add_argument("--responses-tool-args", default='{"a": 2, "b": 3}', help="its JSON arguments")
    ap.add_argument(
        "--anthropic-tool",
        help="answer a Messages request offering this tool (e.g. Bash) with a tool_use first",
    )
    args = ap.parse_args()
    global LOG_PATH, RESPONSES_TOOL, RESPONSES_TOOL_ARGS
    LOG_PATH = args.log
    RESPONSES_TOOL = args.responses_tool
    RESPONSES_TOOL_ARGS = json.loads(args.responses_tool_args)
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.daemon_threads = True
    srv.models = args.model or ["fake-model"]
    srv.unknown_status = args.unknown_status
    srv.event_lines = not args.no_event_lines
    srv.anthropic_tool = args.anthropic_tool
    port = srv.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os

        os.replace(args.port_file + ".tmp", args.port_file)
    print("listening on http://%s:%d" % (args.host, port), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
