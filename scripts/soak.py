#!/usr/bin/env python3
"""Soak test for a Pagoda server: long mixed load with disconnects and overload.

Not part of `make test`. Python 3 standard library only. See scripts/README-soak.md.

Either starts the server itself:

    scripts/soak.py --binary target/release/pagoda --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --server-args "--max-model-len 1024 --kv-cache-memory 128MiB --max-waiting-requests 64"

or attaches to a running one (the pid is needed for RSS / fd / thread samples):

    scripts/soak.py --url http://127.0.0.1:8000 --pid 12345

Every request the load sends ends in exactly one outcome:

  finished      2xx and complete: `data: [DONE]` seen for a stream (every choice with a
                finish_reason), or a JSON body with the expected choices.
  errored       an expected HTTP error status (429/503 under load, 400/404/405 for the bad
                requests) with an OpenAI-shaped body {"error": {"message","type","param","code"}},
                or a stream that carried such an error event; counted by status.
  disconnected  we closed the connection on purpose before the answer was complete (mid-stream
                disconnects, slow readers that give up, burst requests past their short timeout).
  lost          anything else: connection reset or closed without an answer, a stream that ended
                without [DONE] and without an error event, a client timeout, a 5xx other than
                503, a malformed error body, an unexpected status, a 200 with a wrong body.

The run FAILS (exit 1) if any request is lost, any 500 is seen, sent != the sum of the outcomes,
the KV cache is not empty or requests are still running/waiting once the server is idle, the
open fds grew by more than --fd-margin, /health or a normal request fails after the run, or (when
the script started the server) the server died, panicked or did not exit cleanly on SIGTERM.
RSS growth above --rss-warn-mib is a warning only (allocators keep memory).
"""

import argparse
import http.client
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

import soak_attacks

# --------------------------------------------------------------------------------------------
# Outcomes and statistics
# --------------------------------------------------------------------------------------------

FINISHED, ERRORED, DISCONNECTED, LOST = "finished", "errored", "disconnected", "lost"
OUTCOMES = (FINISHED, ERRORED, DISCONNECTED, LOST)


class Stats:
    """Thread-safe counters: every sent request is recorded exactly once with an outcome."""

    def __init__(self, max_samples=30):
        self.lock = threading.Lock()
        self.sent = 0
        self.outcomes = {o: 0 for o in OUTCOMES}
        self.by_kind = {}  # kind -> {outcome: n}
        self.errored_by = {}  # "429" / "stream-error:queue_full" -> n
        self.disconnected_by = {}  # reason -> n
        self.lost_by = {}  # short reason -> n
        self.lost_samples = []  # (t, kind, reason, detail)
        self.status_500 = 0
        self.status_503 = 0
        self.max_samples = max_samples
        self.completion_tokens = 0

    def on_sent(self):
        with self.lock:
            self.sent += 1

    def record(self, kind, outcome, key, detail="", tokens=0):
        with self.lock:
            self.outcomes[outcome] += 1
            k = self.by_kind.setdefault(kind, {o: 0 for o in OUTCOMES})
            k[outcome] += 1
            self.completion_tokens += tokens
            if outcome == ERRORED:
                self.errored_by[key] = self.errored_by.get(key, 0) + 1
            elif outcome == DISCONNECTED:
                self.disconnected_by[key] = self.disconnected_by.get(key, 0) + 1
            elif outcome == LOST:
                self.lost_by[key] = self.lost_by.get(key, 0) + 1
                if len(self.lost_samples) < self.max_samples:
                    self.lost_samples.append((round(time.time(), 3), kind, key, detail[:600]))
                    sys.stderr.write(f"[soak] LOST {kind}: {key}: {detail[:300]}\n")

    def snapshot(self):
        with self.lock:
            return {
                "sent": self.sent,
                **dict(self.outcomes),
                "in_flight": self.sent - sum(self.outcomes.values()),
                "completion_tokens": self.completion_tokens,
            }


class Outcome(Exception):
    """Raised inside a request to end it with a classification."""

    def __init__(self, outcome, key, detail="", tokens=0):
        super().__init__(f"{outcome}: {key}: {detail}")
        self.outcome, self.key, self.detail, self.tokens = outcome, key, detail, tokens


# --------------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------------


class Conn(http.client.HTTPConnection):
    """HTTPConnection with TCP_NODELAY and an optional small receive buffer (slow readers)."""

    def __init__(self, host, port, timeout, rcvbuf=None):
        super().__init__(host, port, timeout=timeout)
        self.rcvbuf = rcvbuf
        self.last_used = 0.0

    def connect(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            s.settimeout(self.timeout)
            s.connect((self.host, self.port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            s.close()
            raise
        self.sock = s


def hard_close(conn, rst=False):
    """Close a connection now: FIN (shutdown) or, with rst, an abortive close (RST)."""
    sock = conn.sock
    try:
        if sock is not None:
            if rst:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except Exception:
        pass


def set_deadline(conn, deadline, cap=None):
    """Make the next socket operation time out at the request's deadline (or after cap s)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("request deadline passed")
    if cap is not None:
        remaining = min(remaining, cap)
    if conn.sock is not None:
        conn.sock.settimeout(remaining)


def is_error_body(obj):
    if not isinstance(obj, dict) or set(obj.keys()) != {"error"}:
        return False
    e = obj["error"]
    if not isinstance(e, dict):
        return False
    for k in ("message", "type", "param", "code"):
        if k not in e:
            return False
    return (
        isinstance(e["message"], str)
        and e["message"] != ""
        and isinstance(e["type"], str)
        and (e["param"] is None or isinstance(e["param"], str))
        and (e["code"] is None or isinstance(e["code"], (str, int)))
    )


# --------------------------------------------------------------------------------------------
# Request specs
# --------------------------------------------------------------------------------------------


class Spec:
    """One request to send and how to treat it."""

    def __init__(self, kind, method, path, body=None, *, stream=False, n=1, expect=(),
                 mode="normal", timeout=120.0, chat=True, logprobs=False, stop=None,
                 content_type="application/json", keepalive=False, timeout_is_disconnect=False):
        self.kind = kind
        self.method = method
        self.path = path
        self.body = body  # dict / bytes / None
        self.stream = stream
        self.n = n
        # Error statuses that count as "errored" (with a well-formed body); others are lost.
        self.expect = set(expect)
        # normal | after_send | after_delay | after_events | slow_reader
        self.mode = mode
        self.timeout = timeout
        self.chat = chat
        self.logprobs = logprobs
        self.stop = stop
        self.content_type = content_type
        self.keepalive = keepalive
        self.timeout_is_disconnect = timeout_is_disconnect
        # mode parameters
        self.delay = 0.0
        self.events = 0
        self.slow_seconds = 0.0
        self.rst = False
        self.ok_status = 200


WORDS = (
    "river mountain lantern quiet copper harbor meadow signal orbit pebble window garden "
    "engine ladder violet thunder marble canyon whisper falcon velvet anchor ember glacier "
    "compass prairie saddle tunnel beacon cedar"
).split()

TOPICS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count to ten.",
    "Explain photosynthesis in one sentence.",
    "List three colors.",
    "What is 17 times 3?",
    "Tell me a short joke.",
    "Describe a cat in five words.",
    "Why is the sky blue?",
    "Give me a name for a dog.",
    "Translate 'good morning' into Spanish.",
    "What is a prime number?",
    "Summarize the plot of Cinderella.",
    "Write one line of Python that prints hello.",
    "What do bees make?",
    "Name a planet in the solar system.",
]

COMPLETION_PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a small village,",
    "The capital of Germany is",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "The best way to learn a language is",
    "In the beginning",
    "Water boils at",
]

SYSTEM_PROMPT = (
    "You are a helpful, concise assistant working for a museum of natural history. Answer "
    "visitors' questions briefly and accurately. If a question is outside your knowledge, say so. "
    "Never invent exhibits. The museum is open from nine to five, every day but Monday. Tickets "
    "cost twelve euros for adults and six for children; members enter free. The cafe is on the "
    "second floor and the dinosaur hall on the ground floor, next to the minerals."
)

STOPS = [["."], ["\n"], [" the"], [",", "!"], ["and"], [" is"]]


class Mix:
    """Chooses request specs at random (per worker RNG)."""

    def __init__(self, args, model, max_model_len, attacks=None):
        self.args = args
        self.attacks = attacks
        self.model = model
        self.max_model_len = max_model_len
        # Long prompts use at most ~40% of the context (about 4 chars per token, stay under).
        self.long_chars = max(200, min(4000, int(max_model_len * 0.4 * 3.0)))
        self.kinds = [
            ("chat_stream", 22),
            ("chat", 8),
            ("completion", 10),
            ("completion_stream", 6),
            ("n_multi", 8),
            ("stop_logprobs", 10),
            ("long_prompt", 4),
            ("disconnect", 12),
            ("slow_reader", 5),
            ("slow_sender", 4),
            ("invalid", 9),
            ("not_found", 3),
            ("info", 3),
        ]
        if attacks is not None:
            self.kinds += soak_attacks.ATTACK_KINDS
        if args.only:
            wanted = set(args.only.split(","))
            unknown = wanted - {k for k, _ in self.kinds}
            if unknown:
                raise SystemExit(f"--only: unknown kinds {sorted(unknown)}")
            self.kinds = [(k, w) for k, w in self.kinds if k in wanted]
        self.total = sum(w for _, w in self.kinds)

    def max_tokens(self, rng):
        return rng.randint(self.args.min_tokens, self.args.max_tokens)

    def sampling(self, rng, body):
        t = rng.choice([0.0, 0.0, 0.7, 1.0])
        body["temperature"] = t
        if t > 0 and rng.random() < 0.3:
            body["top_p"] = rng.choice([0.9, 0.95])
        if rng.random() < 0.3:
            body["seed"] = rng.randint(0, 2**31 - 1)
        return body

    def messages(self, rng, long=False):
        msgs = []
        if rng.random() < 0.35:
            msgs.append({"role": "system", "content": SYSTEM_PROMPT})
        if long:
            parts = []
            while sum(len(p) + 1 for p in parts) < self.long_chars:
                parts.append(" ".join(rng.choice(WORDS) for _ in range(12)) + ".")
            text = " ".join(parts)[: self.long_chars]
            msgs.append({"role": "user", "content": "Summarize this text in one line: " + text})
        else:
            msgs.append({"role": "user", "content": rng.choice(TOPICS)})
        return msgs

    def chat_body(self, rng, stream, long=False):
        body = {"model": self.model, "messages": self.messages(rng, long), "max_tokens": self.max_tokens(rng)}
        if stream:
            body["stream"] = True
            if rng.random() < 0.6:
                body["stream_options"] = {"include_usage": True}
        return self.sampling(rng, body)

    def completion_body(self, rng, stream):
        body = {"model": self.model, "prompt": rng.choice(COMPLETION_PROMPTS), "max_tokens": self.max_tokens(rng)}
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        return self.sampling(rng, body)

    def pick(self, rng):
        r = rng.uniform(0, self.total)
        for kind, w in self.kinds:
            r -= w
            if r <= 0:
                break
        return self.make(rng, kind)

    def make(self, rng, kind):
        if kind.startswith("attack_"):
            return self.attacks.make(rng, kind)
        return getattr(self, "make_" + kind)(rng, kind)

    OVERLOAD = (429, 503)

    def make_chat_stream(self, rng, kind):
        return Spec(kind, "POST", "/v1/chat/completions", self.chat_body(rng, True), stream=True,
                    expect=self.OVERLOAD, timeout=self.args.request_timeout)

    def make_chat(self, rng, kind):
        return Spec(kind, "POST", "/v1/chat/completions", self.chat_body(rng, False),
                    expect=self.OVERLOAD, timeout=self.args.request_timeout,
                    keepalive=rng.random() < 0.5)

    def make_completion(self, rng, kind):
        return Spec(kind, "POST", "/v1/completions", self.completion_body(rng, False), chat=False,
                    expect=self.OVERLOAD, timeout=self.args.request_timeout,
                    keepalive=rng.random() < 0.5)

    def make_completion_stream(self, rng, kind):
        return Spec(kind, "POST", "/v1/completions", self.completion_body(rng, True), chat=False,
                    stream=True, expect=self.OVERLOAD, timeout=self.args.request_timeout)

    def make_long_prompt(self, rng, kind):
        stream = rng.random() < 0.5
        return Spec(kind, "POST", "/v1/chat/completions", self.chat_body(rng, stream, long=True),
                    stream=stream, expect=self.OVERLOAD, timeout=self.args.request_timeout)

    def make_n_multi(self, rng, kind):
        n = rng.choice([2, 3, 4])
        chat = rng.random() < 0.5
        stream = rng.random() < 0.5
        body = self.chat_body(rng, stream) if chat else self.completion_body(rng, stream)
        body["n"] = n
        if body.get("temperature", 0) == 0:
            body["temperature"] = 0.8
        return Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                    stream=stream, n=n, chat=chat, expect=self.OVERLOAD,
                    timeout=self.args.request_timeout)

    def make_stop_logprobs(self, rng, kind):
        chat = rng.random() < 0.5
        stream = rng.random() < 0.5
        body = self.chat_body(rng, stream) if chat else self.completion_body(rng, stream)
        stop = rng.choice(STOPS)
        body["stop"] = stop if len(stop) > 1 or rng.random() < 0.5 else stop[0]
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = rng.choice([0, 1, 2, 5])
        else:
            body["logprobs"] = rng.choice([0, 1, 2, 5])
        if rng.random() < 0.3:
            body["n"] = 2
            body["temperature"] = 0.8
        return Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                    stream=stream, n=body.get("n", 1), chat=chat, logprobs=True, stop=stop,
                    expect=self.OVERLOAD, timeout=self.args.request_timeout)

    def make_disconnect(self, rng, kind):
        chat = rng.random() < 0.6
        r = rng.random()
        if r < 0.55:
            # Read a few SSE events, then close mid-stream.
            body = self.chat_body(rng, True) if chat else self.completion_body(rng, True)
            body["max_tokens"] = max(body["max_tokens"], 32)
            if rng.random() < 0.3:
                body["n"] = 2
                body["temperature"] = 0.8
            s = Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                     stream=True, n=body.get("n", 1), chat=chat, expect=self.OVERLOAD,
                     mode="after_events", timeout=self.args.request_timeout)
            s.events = rng.randint(1, 6)
        elif r < 0.8:
            # Close right after sending (the request is queued or just admitted).
            stream = rng.random() < 0.5
            body = self.chat_body(rng, stream) if chat else self.completion_body(rng, stream)
            s = Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                     stream=stream, chat=chat, expect=self.OVERLOAD, mode="after_send",
                     timeout=self.args.request_timeout)
            s.delay = rng.uniform(0.0, 0.5)
        else:
            # Non-streamed request abandoned before its answer (an impatient client).
            body = self.chat_body(rng, False) if chat else self.completion_body(rng, False)
            body["max_tokens"] = self.args.max_tokens
            s = Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                     chat=chat, expect=self.OVERLOAD, mode="after_delay",
                     timeout=self.args.request_timeout)
            s.delay = rng.uniform(0.05, 1.5)
        s.rst = rng.random() < 0.3
        return s

    def make_slow_reader(self, rng, kind):
        chat = rng.random() < 0.6
        body = self.chat_body(rng, True) if chat else self.completion_body(rng, True)
        body["max_tokens"] = self.args.max_tokens
        if rng.random() < 0.5:
            # Logprobs make the events much larger, so the slow reader really holds back.
            if chat:
                body["logprobs"], body["top_logprobs"] = True, 5
            else:
                body["logprobs"] = 5
        s = Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                 stream=True, chat=chat, expect=self.OVERLOAD, mode="slow_reader",
                 timeout=self.args.request_timeout)
        s.slow_seconds = rng.uniform(2.0, 6.0)
        s.rst = rng.random() < 0.3
        return s

    def make_slow_sender(self, rng, kind):
        """A client that sends its request in pieces: the whole request within a few seconds
        (must be answered normally), or only part of it before closing the connection."""
        chat = rng.random() < 0.5
        stream = rng.random() < 0.5
        body = self.chat_body(rng, stream) if chat else self.completion_body(rng, stream)
        s = Spec(kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                 stream=stream, chat=chat, expect=self.OVERLOAD, timeout=self.args.request_timeout)
        s.mode = "trickle" if rng.random() < 0.6 else "partial"
        s.pieces = rng.randint(2, 8)
        s.slow_seconds = rng.uniform(0.3, 3.0)
        s.cut = rng.random()  # partial: how much of the request gets sent
        s.rst = rng.random() < 0.3
        return s

    def make_invalid(self, rng, kind):
        m = self.model
        msgs = [{"role": "user", "content": "hi"}]
        variants = [
            (400, "/v1/chat/completions", b'{"model": "' + m.encode() + b'", "messages": [', "application/json"),
            (400, "/v1/chat/completions", b"", "application/json"),
            (400, "/v1/chat/completions", {"model": m, "messages": msgs, "temperature": "hot"}, None),
            (400, "/v1/chat/completions", {"model": m, "messages": msgs, "max_tokens": -1}, None),
            (400, "/v1/chat/completions", {"model": m}, None),
            (400, "/v1/chat/completions", {"model": m, "messages": msgs, "n": 0}, None),
            (400, "/v1/chat/completions", {"model": m, "messages": msgs, "max_tokens": 10**6}, None),
            (400, "/v1/chat/completions", {"model": m, "messages": msgs, "top_p": 7}, None),
            (400, "/v1/completions", {"model": m, "prompt": "", "max_tokens": 4}, None),
            (400, "/v1/completions", {"model": m, "prompt": "hi", "logprobs": 1000}, None),
            (400, "/v1/completions", {"model": m, "prompt": "hi", "stream": True, "max_tokens": 10**6}, None),
            (400, "/v1/completions", b"[1, 2, 3]", "application/json"),
            (400, "/v1/completions", b"\xff\xfe garbage", "application/json"),
            (404, "/v1/chat/completions", {"model": "no-such-model", "messages": msgs}, None),
            (404, "/v1/completions", {"model": "no-such-model", "prompt": "hi", "stream": True}, None),
        ]
        status, path, body, ctype = rng.choice(variants)
        s = Spec(kind, "POST", path, body, expect=(status,), timeout=30.0,
                 content_type=ctype or "application/json", keepalive=rng.random() < 0.5)
        s.ok_status = None  # a 2xx is wrong here
        return s

    def make_not_found(self, rng, kind):
        method, path, status = rng.choice([
            ("GET", "/v1/nope", 404),
            ("POST", "/v2/chat/completions", 404),
            ("GET", "/v1/chat/completions", 405),
            ("DELETE", "/v1/models", 405),
            ("GET", "/" + "x" * rng.randint(1, 300), 404),
        ])
        s = Spec(kind, method, path, None, expect=(status,), timeout=30.0)
        s.ok_status = None
        return s

    def make_info(self, rng, kind):
        path = rng.choice(["/health", "/v1/models", "/version", "/metrics"])
        s = Spec(kind, "GET", path, None, timeout=30.0, keepalive=rng.random() < 0.5)
        s.mode = "info"
        return s

    def make_burst(self, rng):
        chat = rng.random() < 0.5
        stream = rng.random() < 0.5
        body = self.chat_body(rng, stream) if chat else self.completion_body(rng, stream)
        body["max_tokens"] = rng.randint(4, 16)
        s = Spec("burst", "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                 stream=stream, chat=chat, expect=self.OVERLOAD, timeout=self.args.burst_timeout,
                 timeout_is_disconnect=True)
        return s


# --------------------------------------------------------------------------------------------
# Running one request
# --------------------------------------------------------------------------------------------


class Client:
    def __init__(self, host, port, stats, stop_event):
        self.host, self.port = host, port
        self.stats = stats
        self.stop_event = stop_event

    def run(self, spec, ka=None, count=True):
        """Send one request; returns (outcome, key, detail). ka: a per-worker dict holding a
        keep-alive connection."""
        if count:
            self.stats.on_sent()
        try:
            self._run(spec, ka)
            raise Outcome(LOST, "no outcome", "internal: request ended without a classification")
        except Outcome as o:
            res = o
        except socket.timeout as e:  # TimeoutError
            if spec.timeout_is_disconnect:
                res = Outcome(DISCONNECTED, "burst-timeout", str(e))
            else:
                res = Outcome(LOST, "client timeout", f"{spec.timeout:.0f}s: {e}")
        except http.client.RemoteDisconnected as e:
            res = Outcome(LOST, "closed without a response", repr(e))
        except http.client.IncompleteRead as e:
            res = Outcome(LOST, "incomplete body", repr(e))
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
            res = Outcome(LOST, "connection reset", repr(e))
        except ConnectionRefusedError as e:
            res = Outcome(LOST, "connection refused", repr(e))
        except Exception as e:  # anything else, including bugs in this script
            res = Outcome(LOST, "exception " + type(e).__name__, traceback.format_exc(limit=4))
        if count:
            self.stats.record(spec.kind, res.outcome, res.key, res.detail, res.tokens)
            if res.key.startswith("HTTP 500"):
                with self.stats.lock:
                    self.stats.status_500 += 1
            if res.key == "503":
                with self.stats.lock:
                    self.stats.status_503 += 1
        return res

    def _connect(self, spec, ka):
        if spec.keepalive and ka is not None:
            c = ka.get("conn")
            if c is not None and time.monotonic() - c.last_used < 30.0 and c.sock is not None:
                return c, True
            if c is not None:
                c.close()
                ka["conn"] = None
        rcvbuf = 4096 if spec.mode == "slow_reader" else None
        c = Conn(self.host, self.port, timeout=min(spec.timeout, 30.0), rcvbuf=rcvbuf)
        return c, False

    def _run(self, spec, ka):
        deadline = time.monotonic() + spec.timeout
        if spec.mode == "raw":
            raise Outcome(*spec.run_raw())
        conn, reused = self._connect(spec, ka)
        keep = False
        resp = None
        try:
            headers = {"Accept": "text/event-stream" if spec.stream else "application/json"}
            body = spec.body
            if isinstance(body, dict):
                body = json.dumps(body).encode()
            if body is not None:
                headers["Content-Type"] = spec.content_type
            if not (spec.keepalive and ka is not None):
                headers["Connection"] = "close"
            if spec.mode in ("trickle", "partial"):
                resp = self._trickle(spec, conn, body, deadline)
            else:
                try:
                    if conn.sock is None:
                        conn.connect()
                    set_deadline(conn, deadline)
                    conn.request(spec.method, spec.path, body=body, headers=headers)
                except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
                    if reused:
                        raise Outcome(LOST, "reused keep-alive connection dropped", repr(e))
                    raise

                if spec.mode == "after_send":
                    time.sleep(spec.delay)
                    hard_close(conn, spec.rst)
                    raise Outcome(DISCONNECTED, "closed after sending")

                if spec.mode == "after_delay":
                    set_deadline(conn, deadline, cap=spec.delay)
                    try:
                        resp = conn.getresponse()
                    except socket.timeout:
                        hard_close(conn, spec.rst)
                        raise Outcome(DISCONNECTED, "impatient (closed before the answer)")
                    set_deadline(conn, deadline)
                else:
                    set_deadline(conn, deadline)
                    try:
                        resp = conn.getresponse()
                    except http.client.RemoteDisconnected as e:
                        if reused:
                            raise Outcome(LOST, "reused keep-alive connection dropped", repr(e))
                        raise

            status = resp.status
            if spec.mode == "attack":
                data = self._read_all(conn, resp, deadline)
                raise Outcome(*spec.verify(status, data))
            if spec.mode == "info":
                data = self._read_all(conn, resp, deadline)
                if status != 200:
                    self._error(spec, status, data)
                keep = not resp.will_close
                raise Outcome(FINISHED, "ok")

            if status < 200 or status >= 300:
                data = self._read_all(conn, resp, deadline)
                keep = not resp.will_close
                self._error(spec, status, data)

            if spec.ok_status is None:
                data = self._read_all(conn, resp, deadline)
                raise Outcome(LOST, f"accepted a bad request ({status})", f"{spec.method} {spec.path} "
                              f"{json.dumps(spec.body) if isinstance(spec.body, dict) else spec.body!r}"
                              f" -> {data[:300]!r}")

            if spec.stream:
                ctype = resp.getheader("Content-Type", "")
                if not ctype.startswith("text/event-stream"):
                    data = self._read_all(conn, resp, deadline)
                    raise Outcome(LOST, "stream without text/event-stream", f"{ctype}: {data[:300]!r}")
                self._stream(spec, conn, resp, deadline)
            else:
                data = self._read_all(conn, resp, deadline)
                keep = not resp.will_close
                self._check_body(spec, data)
        finally:
            if keep and spec.keepalive and ka is not None:
                conn.last_used = time.monotonic()
                ka["conn"] = conn
            else:
                if ka is not None and ka.get("conn") is conn:
                    ka["conn"] = None
                if resp is not None:
                    resp.close()
                conn.close()

    def _trickle(self, spec, conn, body, deadline):
        """Send the request by hand in pieces spread over spec.slow_seconds; "partial" sends only
        a prefix and closes. Returns the response (trickle)."""
        head = (f"{spec.method} {spec.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Accept: {'text/event-stream' if spec.stream else 'application/json'}\r\n"
                f"Content-Type: {spec.content_type}\r\nContent-Length: {len(body or b'')}\r\n"
                f"Connection: close\r\n\r\n").encode()
        raw = head + (body or b"")
        if spec.mode == "partial":
            raw = raw[: max(1, int(len(raw) * spec.cut * 0.98))]
        cuts = sorted(random.sample(range(1, len(raw)), min(spec.pieces - 1, len(raw) - 1)))
        pieces = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)])]
        conn.connect()
        for i, piece in enumerate(pieces):
            set_deadline(conn, deadline)
            conn.sock.sendall(piece)
            if i + 1 < len(pieces):
                time.sleep(spec.slow_seconds / len(pieces))
        if spec.mode == "partial":
            time.sleep(random.uniform(0.0, 0.5))
            hard_close(conn, spec.rst)
            raise Outcome(DISCONNECTED, "closed mid-request")
        set_deadline(conn, deadline)
        resp = http.client.HTTPResponse(conn.sock, method=spec.method)
        resp.begin()
        return resp

    def _read_all(self, conn, resp, deadline):
        chunks = []
        while True:
            set_deadline(conn, deadline)
            b = resp.read1(65536)
            if not b:
                break
            chunks.append(b)
        # read1 does not mark a Content-Length body as done when it ends exactly; close the
        # response so the connection can carry the next request (keep-alive).
        resp.close()
        return b"".join(chunks)

    def _error(self, spec, status, data):
        try:
            obj = json.loads(data)
        except ValueError:
            obj = None
        shaped = is_error_body(obj)
        code = obj["error"].get("code") if shaped else None
        msg = obj["error"].get("message") if shaped else data[:300].decode("utf-8", "replace")
        if status >= 500 and status != 503:
            raise Outcome(LOST, f"HTTP {status}", f"{spec.kind} {spec.path}: {msg}")
        if not shaped:
            raise Outcome(LOST, f"malformed error body ({status})", f"{spec.kind} {spec.path}: {data[:300]!r}")
        if status not in spec.expect:
            raise Outcome(LOST, f"unexpected status {status} ({code})",
                          f"{spec.kind} {spec.method} {spec.path}: {msg}; body="
                          f"{json.dumps(spec.body)[:300] if isinstance(spec.body, dict) else spec.body!r}")
        raise Outcome(ERRORED, str(status), msg)

    def _check_choice_common(self, spec, ch, where):
        fr = ch.get("finish_reason")
        if fr not in ("stop", "length"):
            raise Outcome(LOST, f"bad finish_reason {fr!r}", f"{where}: {json.dumps(ch)[:300]}")

    def _check_body(self, spec, data):
        try:
            obj = json.loads(data)
        except ValueError:
            raise Outcome(LOST, "200 with a non-JSON body", repr(data[:300]))
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not isinstance(choices, list) or len(choices) != spec.n:
            raise Outcome(LOST, "200 with wrong choices", f"n={spec.n}: {data[:300]!r}")
        if sorted(c.get("index") for c in choices) != list(range(spec.n)):
            raise Outcome(LOST, "200 with wrong choice indexes", repr(data[:300]))
        tokens = 0
        for ch in choices:
            self._check_choice_common(spec, ch, spec.kind)
            if spec.chat:
                text = (ch.get("message") or {}).get("content")
            else:
                text = ch.get("text")
            if not isinstance(text, str):
                raise Outcome(LOST, "200 without text", json.dumps(ch)[:300])
            self._check_stop(spec, text, ch)
            if spec.logprobs:
                lp = ch.get("logprobs")
                if not isinstance(lp, dict):
                    raise Outcome(LOST, "logprobs missing", json.dumps(ch)[:300])
        usage = obj.get("usage") or {}
        tokens = usage.get("completion_tokens", 0) or 0
        raise Outcome(FINISHED, "ok", tokens=tokens)

    def _check_stop(self, spec, text, ch):
        if spec.stop:
            for s in spec.stop:
                if s in text:
                    raise Outcome(LOST, "stop string in output",
                                  f"stop={spec.stop!r} text={text!r} choice={json.dumps(ch)[:200]}")

    def _stream(self, spec, conn, resp, deadline):
        buf = b""
        events = 0
        finished = {}
        texts = {}
        error = None
        usage_tokens = 0
        slow_until = time.monotonic() + spec.slow_seconds if spec.mode == "slow_reader" else None
        while True:
            if slow_until is not None:
                if time.monotonic() >= slow_until:
                    hard_close(conn, spec.rst)
                    raise Outcome(DISCONNECTED, "slow reader gave up")
                time.sleep(random.uniform(0.1, 0.4))
                set_deadline(conn, deadline)
                b = resp.read1(128)
            else:
                set_deadline(conn, deadline)
                b = resp.read1(65536)
            if not b:
                if error is not None:
                    raise Outcome(ERRORED, "stream-error:" + str(error.get("code")), error.get("message", ""))
                raise Outcome(LOST, "stream ended without [DONE]",
                              f"{spec.kind}: {events} events, finished={finished}")
            buf += b
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.rstrip(b"\r")
                if not line.startswith(b"data:"):
                    continue  # blank separators, ": keep-alive" comments, event:/id: fields
                payload = line[5:].strip()
                events += 1
                if payload == b"[DONE]":
                    if error is not None:
                        raise Outcome(ERRORED, "stream-error:" + str(error.get("code")), error.get("message", ""))
                    missing = [i for i in range(spec.n) if i not in finished]
                    if missing:
                        raise Outcome(LOST, "[DONE] before every choice finished",
                                      f"missing finish_reason for {missing}")
                    for i, fr in finished.items():
                        if fr not in ("stop", "length"):
                            raise Outcome(LOST, f"bad finish_reason {fr!r}", f"choice {i}")
                        self._check_stop(spec, texts.get(i, ""), {"index": i})
                    raise Outcome(FINISHED, "ok", tokens=usage_tokens)
                try:
                    obj = json.loads(payload)
                except ValueError:
                    raise Outcome(LOST, "non-JSON SSE event", repr(payload[:300]))
                if isinstance(obj, dict) and "error" in obj:
                    if not is_error_body(obj):
                        raise Outcome(LOST, "malformed stream error event", repr(payload[:300]))
                    error = obj["error"]
                    continue
                if error is not None:
                    raise Outcome(LOST, "data after an error event", repr(payload[:300]))
                choices = obj.get("choices") if isinstance(obj, dict) else None
                if not isinstance(choices, list):
                    raise Outcome(LOST, "SSE chunk without choices", repr(payload[:300]))
                for ch in choices:
                    i = ch.get("index")
                    if not isinstance(i, int) or not 0 <= i < spec.n:
                        raise Outcome(LOST, "SSE chunk with a bad index", repr(payload[:300]))
                    if i in finished:
                        raise Outcome(LOST, "SSE chunk after its choice finished", repr(payload[:300]))
                    piece = (ch.get("delta") or {}).get("content") if spec.chat else ch.get("text")
                    if piece:
                        texts[i] = texts.get(i, "") + piece
                    if ch.get("finish_reason") is not None:
                        finished[i] = ch["finish_reason"]
                u = obj.get("usage")
                if isinstance(u, dict):
                    usage_tokens = u.get("completion_tokens", 0) or 0
                if spec.mode == "after_events" and events >= spec.events:
                    hard_close(conn, spec.rst)
                    raise Outcome(DISCONNECTED, "closed mid-stream")


# --------------------------------------------------------------------------------------------
# Server process, metrics, samples
# --------------------------------------------------------------------------------------------


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(host, port, path, timeout=10.0):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def http_post_json(host, port, path, body, timeout=120.0):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            continue
        out.setdefault(name, []).append((dict(LABEL.findall(labels)), v))
    return out


def metric_sum(metrics, suffix, where=None):
    """Sum of every series whose name ends with `:suffix` (any prefix) or equals suffix."""
    total, found = 0.0, False
    for name, series in metrics.items():
        if name == suffix or name.endswith(":" + suffix):
            for labels, v in series:
                if where is None or all(labels.get(k) == val for k, val in where.items()):
                    total += v
                    found = True
    return total if found else None


def proc_stats(pid):
    out = {"rss_mib": None, "fds": None, "threads": None}
    if pid is None:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_mib"] = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError as e:
        out["error"] = str(e)
    return out


def sample(host, port, pid, t0, stats):
    s = {"t": round(time.monotonic() - t0, 1), "wall": round(time.time(), 3)}
    s.update(proc_stats(pid))
    try:
        st, data = http_get(host, port, "/metrics")
        m = parse_metrics(data.decode("utf-8", "replace")) if st == 200 else {}
        s["metrics_status"] = st
    except Exception as e:
        m = {}
        s["metrics_error"] = repr(e)
    kv = metric_sum(m, "kv_cache_usage_perc")
    if kv is None:
        kv = metric_sum(m, "gpu_cache_usage_perc")
    s["kv_usage"] = kv
    s["running"] = metric_sum(m, "num_requests_running")
    s["waiting"] = metric_sum(m, "num_requests_waiting")
    s["preemptions"] = metric_sum(m, "num_preemptions_total")
    s["generation_tokens"] = metric_sum(m, "generation_tokens_total")
    s["success"] = {}
    for name, series in m.items():
        if name.endswith("request_success_total"):
            for labels, v in series:
                s["success"][labels.get("finished_reason", "?")] = v
    s["http"] = {}
    for name, series in m.items():
        if name == "http_requests_total" or name.endswith(":http_requests_total"):
            for labels, v in series:
                key = f'{labels.get("method")} {labels.get("handler")} {labels.get("status")}'
                s["http"][key] = v
    if stats is not None:
        s["load"] = stats.snapshot()
    return s


def fmt(v, spec="{:.1f}", none="-"):
    return none if v is None else spec.format(v)


def print_header():
    print(f'{"t(s)":>7} {"sent":>7} {"fin":>6} {"err":>6} {"disc":>6} {"lost":>5} {"infl":>5} '
          f'{"RSS MiB":>8} {"fds":>5} {"thr":>4} {"kv%":>6} {"run":>4} {"wait":>5} {"preempt":>7}', flush=True)


def print_row(s, label=""):
    ld = s.get("load") or {}
    kv = s.get("kv_usage")
    print(f'{s["t"]:>7.0f} {ld.get("sent", 0):>7} {ld.get("finished", 0):>6} {ld.get("errored", 0):>6} '
          f'{ld.get("disconnected", 0):>6} {ld.get("lost", 0):>5} {ld.get("in_flight", 0):>5} '
          f'{fmt(s.get("rss_mib")):>8} {fmt(s.get("fds"), "{}"):>5} {fmt(s.get("threads"), "{}"):>4} '
          f'{fmt(None if kv is None else kv * 100, "{:.2f}"):>6} {fmt(s.get("running"), "{:.0f}"):>4} '
          f'{fmt(s.get("waiting"), "{:.0f}"):>5} {fmt(s.get("preemptions"), "{:.0f}"):>7} {label}', flush=True)


def probe_request(host, port, model):
    """One normal greedy request; returns (ok, text or reason)."""
    body = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16, "temperature": 0}
    try:
        st, data = http_post_json(host, port, "/v1/chat/completions", body, timeout=120)
        if st != 200:
            return False, f"status {st}: {data[:300]!r}"
        obj = json.loads(data)
        ch = obj["choices"][0]
        text = ch["message"]["content"]
        if not isinstance(text, str) or not text or ch.get("finish_reason") not in ("stop", "length"):
            return False, f"bad answer: {data[:300]!r}"
        return True, text
    except Exception as e:
        return False, repr(e)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="Soak test for a Pagoda server (mixed load, disconnects, overload).")
    ap.add_argument("--binary", help="pagoda binary to start (with --model)")
    ap.add_argument("--model", help="model path for the started server")
    ap.add_argument("--server-args", default="", help="extra `pagoda serve` flags, one string")
    ap.add_argument("--server-log", help="where the started server's output goes (default: a temp file)")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--url", help="attach to a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, help="pid of the attached server (for RSS, fds, threads)")
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load (default 1800)")
    ap.add_argument("--concurrency", type=int, default=16, help="worker threads (default 16)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--request-timeout", type=float, default=120.0, help="client timeout per request")
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--burst-interval", type=float, default=60.0, help="seconds between bursts (0: none)")
    ap.add_argument("--burst-size", type=int, default=200)
    ap.add_argument("--burst-timeout", type=float, default=10.0, help="client timeout of burst requests")
    ap.add_argument("--sample-interval", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=5.0, help="idle seconds before the end sample")
    ap.add_argument("--drain-timeout", type=float, default=120.0,
                    help="how long to wait for running/waiting to reach 0 after the load")
    ap.add_argument("--fd-margin", type=int, default=8, help="allowed fd growth, start to end")
    ap.add_argument("--rss-warn-mib", type=float, default=64.0, help="RSS growth that prints a warning")
    ap.add_argument("--only", help="comma-separated request kinds to send (default: the whole mix: "
                    "chat_stream,chat,completion,completion_stream,n_multi,stop_logprobs,long_prompt,"
                    "disconnect,slow_reader,slow_sender,invalid,not_found,info)")
    ap.add_argument("--attacks", action="store_true",
                    help="mix hostile requests into the load (scripts/soak_attacks.py); needs --binary: "
                    "the server is started with the flags they need (KV events, run-time LoRA, pooling)")
    ap.add_argument("--out", help="write a JSON summary here")
    args = ap.parse_args()

    if bool(args.binary) == bool(args.url):
        ap.error("give either --binary and --model (start a server) or --url (attach)")
    if args.binary and not args.model:
        ap.error("--binary needs --model")
    if args.min_tokens > args.max_tokens:
        ap.error("--min-tokens > --max-tokens")
    if args.attacks and not args.binary:
        ap.error("--attacks needs --binary (the server must start with the attacks' flags)")

    stop_event = threading.Event()
    hard_stop = threading.Event()
    interrupted = {"n": 0}

    def on_signal(signum, frame):
        interrupted["n"] += 1
        if interrupted["n"] == 1:
            sys.stderr.write(f"\n[soak] signal {signum}: stopping the load, then the summary "
                             "(again: stop waiting for requests in flight)\n")
            stop_event.set()
        else:
            hard_stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    proc = None
    attack_setup = None
    log_path = None
    log_file = None
    failures = []
    warnings = []

    # ---- server ----
    if args.binary:
        host, port = "127.0.0.1", free_port()
        if args.server_log:
            log_path = args.server_log
        else:
            fd, log_path = tempfile.mkstemp(prefix="pagoda-soak-", suffix=".log")
            os.close(fd)
        log_file = open(log_path, "wb")
        cmd = [args.binary, "serve", "--model", args.model, "--host", host, "--port", str(port)]
        cmd += shlex.split(args.server_args)
        if args.attacks:
            attack_setup = soak_attacks.Setup(host, free_port)
            cmd += attack_setup.server_flags()
        print(f"[soak] starting: {shlex.join(cmd)}  (log: {log_path})", flush=True)
        # Own session: a Ctrl-C in the terminal must reach only this script, not the server.
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        pid = proc.pid
        t_start = time.monotonic()
        while True:
            if proc.poll() is not None:
                print(f"[soak] server exited with {proc.returncode} during startup; log tail:", flush=True)
                print(tail(log_path), flush=True)
                return 1
            try:
                st, _ = http_get(host, port, "/health", timeout=2)
                if st == 200:
                    break
            except OSError:
                pass
            if stop_event.is_set() or time.monotonic() - t_start > args.startup_timeout:
                print("[soak] server did not become healthy; stopping it", flush=True)
                stop_server(proc, 30)
                return 1
            time.sleep(0.5)
        print(f"[soak] server pid {pid} healthy on {host}:{port} after {time.monotonic() - t_start:.1f}s", flush=True)
    else:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
        pid = args.pid
        if pid is None:
            warnings.append("no --pid: RSS, fds and threads are not sampled")

    def server_alive():
        if proc is not None:
            return proc.poll() is None
        return pid is None or os.path.exists(f"/proc/{pid}")

    # ---- model name and context ----
    try:
        st, data = http_get(host, port, "/v1/models")
        card = json.loads(data)["data"][0]
        model = card["id"]
        max_model_len = int(card.get("max_model_len") or 1024)
    except Exception as e:
        print(f"[soak] GET /v1/models failed: {e!r}", flush=True)
        if proc is not None:
            stop_server(proc, 30)
        return 1
    print(f"[soak] model {model!r}, max_model_len {max_model_len}", flush=True)

    stats = Stats()
    warm_stats = Stats(max_samples=10)
    attacks = soak_attacks.Attacks(model, attack_setup, Spec) if args.attacks else None
    mix = Mix(args, model, max_model_len, attacks)
    client = Client(host, port, stats, stop_event)
    t0 = time.monotonic()

    # ---- warm-up (not counted) ----
    ok0, probe0 = probe_request(host, port, model)
    if not ok0:
        failures.append(f"probe request before the run failed: {probe0}")
    warm_client = Client(host, port, warm_stats, stop_event)
    wrng = random.Random(args.seed - 1)
    for kind, _ in mix.kinds:
        for _ in range(2):
            spec = mix.make(wrng, kind)
            res = warm_client.run(spec, ka=None, count=True)
            if res.outcome == LOST:
                warnings.append(f"warm-up {kind} lost: {res.key}: {res.detail[:200]}")
    wait_idle(host, port, 60)
    time.sleep(min(args.settle, 3))
    print(f"[soak] warm-up done in {time.monotonic() - t0:.1f}s", flush=True)

    start = sample(host, port, pid, t0, stats)
    samples = [start]
    print_header()
    print_row(start, "start (after warm-up)")

    # ---- load ----
    load_t0 = time.monotonic()
    load_end = load_t0 + args.duration
    threads = []
    burst_threads = []
    burst_threads_lock = threading.Lock()

    def worker(wid):
        rng = random.Random(args.seed * 1000 + wid)
        ka = {"conn": None}
        try:
            while not stop_event.is_set() and time.monotonic() < load_end:
                try:
                    spec = mix.pick(rng)
                except Exception:
                    stats.on_sent()
                    stats.record("?", LOST, "exception building a request", traceback.format_exc(limit=3))
                    continue
                res = client.run(spec, ka=ka)
                if res.outcome == ERRORED and res.key in ("429", "503"):
                    # Back off like a real client instead of hammering a full queue.
                    stop_event.wait(rng.uniform(0.2, 1.0))
        finally:
            c = ka.get("conn")
            if c is not None:
                c.close()

    def burst_loop():
        rng = random.Random(args.seed * 7 + 1)
        next_at = load_t0 + min(args.burst_interval / 2, 30.0)
        k = 0
        while not stop_event.is_set():
            now = time.monotonic()
            if next_at >= load_end:
                return
            if now < next_at:
                stop_event.wait(min(1.0, next_at - now))
                continue
            k += 1
            specs = [mix.make_burst(rng) for _ in range(args.burst_size)]
            gate = threading.Event()

            def one(s):
                gate.wait()
                client.run(s)

            ts = [threading.Thread(target=one, args=(s,), daemon=True, name=f"burst{k}") for s in specs]
            for t in ts:
                t.start()
            gate.set()
            with burst_threads_lock:
                burst_threads.extend(ts)
            print(f"[soak] t={time.monotonic() - t0:.0f}s burst {k}: {len(ts)} requests "
                  f"(timeout {args.burst_timeout:.0f}s)", flush=True)
            next_at += args.burst_interval

    for w in range(args.concurrency):
        t = threading.Thread(target=worker, args=(w,), daemon=True, name=f"worker{w}")
        t.start()
        threads.append(t)
    if args.burst_interval > 0 and args.burst_size > 0:
        bt = threading.Thread(target=burst_loop, daemon=True, name="bursts")
        bt.start()
        threads.append(bt)

    next_sample = load_t0 + args.sample_interval
    died = False
    try:
        while time.monotonic() < load_end and not stop_event.is_set():
            stop_event.wait(min(1.0, max(0.0, load_end - time.monotonic())))
            if not server_alive():
                died = True
                failures.append("server process died during the load")
                print("[soak] server process is gone; stopping the load", flush=True)
                stop_event.set()
                break
            if time.monotonic() >= next_sample:
                s = sample(host, port, pid, t0, stats)
                samples.append(s)
                print_row(s)
                next_sample += args.sample_interval
    except KeyboardInterrupt:
        stop_event.set()
    stop_event.set()
    load_seconds = time.monotonic() - load_t0
    print(f"[soak] load stopped after {load_seconds:.0f}s; waiting for requests in flight", flush=True)

    # ---- wind down ----
    join_deadline = time.monotonic() + args.request_timeout + 15
    with burst_threads_lock:
        all_threads = threads + list(burst_threads)
    for t in all_threads:
        while t.is_alive() and time.monotonic() < join_deadline and not hard_stop.is_set():
            t.join(0.5)
    still = [t.name for t in all_threads if t.is_alive()]
    snap = stats.snapshot()
    if snap["in_flight"]:
        failures.append(f"{snap['in_flight']} requests still in flight at the end ({', '.join(still[:5])})")

    end = None
    after = {}
    if not died and server_alive():
        drained = wait_idle(host, port, args.drain_timeout)
        if not drained:
            warnings.append(f"server not idle {args.drain_timeout:.0f}s after the load")
        time.sleep(args.settle)
        end = sample(host, port, pid, t0, stats)
        samples.append(end)
        print_row(end, "end (idle)")
        try:
            st, _ = http_get(host, port, "/health")
        except Exception as e:
            st = repr(e)
        after["health"] = st
        ok1, probe1 = probe_request(host, port, model)
        after["probe_ok"] = ok1
        after["probe"] = probe1
        after["probe_same_as_start"] = ok0 and ok1 and probe0 == probe1
        if st != 200:
            failures.append(f"/health after the run: {st}")
        if not ok1:
            failures.append(f"normal request after the run failed: {probe1}")
    elif not died:
        failures.append("server not running at the end")

    # ---- stop the server we started ----
    server_exit = None
    if proc is not None:
        server_exit = stop_server(proc, 60)
        if server_exit is None:
            failures.append("server did not exit within 60s of SIGTERM (killed)")
        elif server_exit != 0 and not died:
            failures.append(f"server exited with status {server_exit} after SIGTERM")
        log_file.close()

    # ---- summary ----
    snap = stats.snapshot()
    total = snap["finished"] + snap["errored"] + snap["disconnected"] + snap["lost"]
    if total != snap["sent"]:
        failures.append(f"sent {snap['sent']} != finished + errored + disconnected + lost = {total}")
    if snap["lost"]:
        failures.append(f"{snap['lost']} requests lost")
    if stats.status_500:
        failures.append(f"{stats.status_500} responses with status 500")
    if stats.status_503:
        warnings.append(f"{stats.status_503} responses with status 503 (engine unavailable or shutting down)")

    delta = {}
    if end is not None:
        for k in ("rss_mib", "fds", "threads"):
            if start.get(k) is not None and end.get(k) is not None:
                delta[k] = end[k] - start[k]
        if end.get("kv_usage") is None:
            warnings.append("no kv_cache_usage_perc gauge in /metrics")
        elif end["kv_usage"] != 0:
            failures.append(f"KV cache usage {end['kv_usage'] * 100:.2f}% at the end (expected 0)")
        for g in ("running", "waiting"):
            if end.get(g):
                failures.append(f"num_requests_{g} = {end[g]:.0f} at the end (expected 0)")
        if "fds" in delta and delta["fds"] > args.fd_margin:
            failures.append(f"open fds grew by {delta['fds']} (start {start['fds']}, end {end['fds']}, "
                            f"margin {args.fd_margin})")
        # RSS from the middle of the run to the end: first-touch of KV cache pages and allocator
        # pools make the early growth; a leak keeps growing in the second half too.
        mid = samples[len(samples) // 2] if len(samples) >= 3 else None
        if mid is not None and mid.get("rss_mib") is not None and end.get("rss_mib") is not None:
            delta["rss_mib_second_half"] = end["rss_mib"] - mid["rss_mib"]
            delta["second_half_from_t"] = mid["t"]
        if "rss_mib" in delta and delta["rss_mib"] > args.rss_warn_mib:
            warnings.append(f"RSS grew by {delta['rss_mib']:.1f} MiB (start {start['rss_mib']:.1f}, "
                            f"end {end['rss_mib']:.1f}); allocators keep memory, check the trend in the table")

    panics = []
    if log_path:
        panics = grep(log_path, ("panicked", "RUST_BACKTRACE"))
        if panics:
            failures.append(f"{len(panics)} panic lines in the server log")

    server_delta = {}
    if end is not None:
        for k, v in end.get("http", {}).items():
            d = v - start.get("http", {}).get(k, 0)
            if d:
                server_delta[k] = d
        succ = {k: v - start.get("success", {}).get(k, 0) for k, v in end.get("success", {}).items()}
    else:
        succ = {}

    print()
    print("=" * 78)
    print(f"SOAK SUMMARY  duration {load_seconds:.0f}s of load, concurrency {args.concurrency}, seed {args.seed}"
          + ("  (interrupted)" if interrupted["n"] else ""))
    print(f"  sent {snap['sent']} = finished {snap['finished']} + errored {snap['errored']} + "
          f"disconnected {snap['disconnected']} + lost {snap['lost']}  "
          f"({'ok' if total == snap['sent'] else 'MISMATCH'}; in flight {snap['in_flight']})")
    gen = None
    if end is not None and end.get("generation_tokens") is not None and start.get("generation_tokens") is not None:
        gen = end["generation_tokens"] - start["generation_tokens"]
    print(f"  completion tokens received: {snap['completion_tokens']}; server generated "
          f"{fmt(gen, '{:.0f}')} tokens ({fmt(None if gen is None else gen / max(load_seconds, 1e-9), '{:.1f}')} tok/s)")
    print(f"  errored by status: {dict(sorted(stats.errored_by.items()))}")
    print(f"  disconnected by us: {dict(sorted(stats.disconnected_by.items()))}")
    if stats.lost_by:
        print(f"  LOST by reason: {dict(sorted(stats.lost_by.items()))}")
        for t, kind, key, detail in stats.lost_samples[:10]:
            print(f"    - {kind}: {key}: {detail[:240]}")
    print("  by kind (finished/errored/disconnected/lost):")
    for kind, c in sorted(stats.by_kind.items()):
        print(f"    {kind:<18} {c[FINISHED]:>6} {c[ERRORED]:>6} {c[DISCONNECTED]:>6} {c[LOST]:>5}")
    if end is not None:
        def row(name, a, b, f="{:.1f}"):
            print(f"  {name:<22} start {fmt(a, f):>10}   end {fmt(b, f):>10}")
        row("RSS (MiB)", start.get("rss_mib"), end.get("rss_mib"))
        row("open fds", start.get("fds"), end.get("fds"), "{}")
        row("threads", start.get("threads"), end.get("threads"), "{}")
        row("KV cache usage (%)", None if start.get("kv_usage") is None else start["kv_usage"] * 100,
            None if end.get("kv_usage") is None else end["kv_usage"] * 100, "{:.2f}")
        row("requests running", start.get("running"), end.get("running"), "{:.0f}")
        row("requests waiting", start.get("waiting"), end.get("waiting"), "{:.0f}")
        row("preemptions (total)", start.get("preemptions"), end.get("preemptions"), "{:.0f}")
        if "rss_mib" in delta:
            print(f"  RSS growth {delta['rss_mib']:+.1f} MiB (second half, from t={delta.get('second_half_from_t', '-')}s: "
                  f"{fmt(delta.get('rss_mib_second_half'), '{:+.1f}')} MiB); fds {delta.get('fds', 0):+d}; "
                  f"threads {delta.get('threads', 0):+d}")
        print(f"  server request_success_total during the load: {succ}")
        print("  server http_requests_total during the load (incl. the script's own /metrics polls):")
        for k in sorted(server_delta):
            print(f"    {k}: {server_delta[k]:.0f}")
    print(f"  after the run: /health {after.get('health')}, normal request "
          f"{'ok' if after.get('probe_ok') else 'FAILED'}: {str(after.get('probe'))[:80]!r} "
          f"(same greedy text as before the run: {after.get('probe_same_as_start')})")
    if proc is not None:
        print(f"  server exit status after SIGTERM: {server_exit}; log: {log_path}")
    for p in panics[:5]:
        print(f"  panic: {p[:200]}")
    for w in warnings:
        print(f"  WARNING: {w}")
    for f in failures:
        print(f"  FAIL: {f}")
    verdict = "FAIL" if failures else "PASS"
    print(f"RESULT: {verdict}")
    print("=" * 78, flush=True)

    if args.out:
        summary = {
            "result": verdict,
            "failures": failures,
            "warnings": warnings,
            "args": vars(args),
            "load_seconds": load_seconds,
            "interrupted": bool(interrupted["n"]),
            "counts": snap,
            "errored_by": stats.errored_by,
            "disconnected_by": stats.disconnected_by,
            "lost_by": stats.lost_by,
            "lost_samples": stats.lost_samples,
            "by_kind": stats.by_kind,
            "status_500": stats.status_500,
            "start": start,
            "end": end,
            "delta": delta,
            "samples": samples,
            "server_http_delta": server_delta,
            "server_success_delta": succ,
            "after": after,
            "server_exit": server_exit,
            "server_log": log_path,
            "panics": panics[:20],
        }
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
        print(f"[soak] summary written to {args.out}")
    if attack_setup is not None:
        shutil.rmtree(attack_setup.lora_dir, ignore_errors=True)
    return 1 if failures else 0


def wait_idle(host, port, timeout):
    """Wait until the server reports no running or waiting requests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st, data = http_get(host, port, "/metrics")
            m = parse_metrics(data.decode("utf-8", "replace"))
            if not metric_sum(m, "num_requests_running") and not metric_sum(m, "num_requests_waiting"):
                return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def stop_server(proc, timeout):
    """SIGTERM the server this script started (by its pid), SIGKILL it after timeout."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.poll()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return None


def tail(path, n=30):
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
    except OSError as e:
        return repr(e)


def grep(path, needles):
    hits = []
    try:
        with open(path, "rb") as f:
            for line in f:
                s = line.decode("utf-8", "replace")
                if any(n in s for n in needles):
                    hits.append(s.rstrip())
    except OSError:
        pass
    return hits


if __name__ == "__main__":
    sys.exit(main())
