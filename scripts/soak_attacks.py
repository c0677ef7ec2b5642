"""Hostile requests mixed into the soak (`scripts/soak.py --attacks`), one kind per class of hole
that took a server down or let one request starve the others: deep `$ref` chains and nesting in
JSON schemas, long Lark rule chains, `n: 64` forks, multi-megabyte fields stored by the
Responses API, multi-megabyte embedding inputs, unauthenticated `/health_generate` floods,
`count_tokens` on long prompts, hostile ZMTP frames on the KV-events sockets, and run-time LoRA
loads of files that are not regular files.

Each kind names the statuses it may get. A 200 must carry the right body; an error must be in
its API's shape (Anthropic's on /v1/messages/*); anything else, a 5xx other than 503, or a
closed connection is "lost" and fails the run. Standard library only, like soak.py.
"""

import json
import os
import socket
import struct
import tempfile
import time

OVERLOAD = (429, 503)

# (kind, weight) of the attacks; soak.py adds them to its mix when --attacks is given.
ATTACK_KINDS = [
    ("attack_deep_ref", 2),
    ("attack_deep_nesting", 1),
    ("attack_deep_grammar", 1),
    ("attack_huge_n", 2),
    ("attack_big_store", 1),
    ("attack_big_embedding", 1),
    ("attack_health_generate", 2),
    ("attack_count_tokens", 1),
    ("attack_zmtp", 1),
    ("attack_lora", 1),
]

UNDERFLOW = "18446744073709551615"


class Setup:
    """What the attacks need from the server they attack: flags to start it with, and where its
    KV-events sockets and hostile LoRA directories are."""

    def __init__(self, host, free_port):
        self.host = host
        self.publish_port = free_port()
        self.replay_port = free_port()
        self.lora_dir = tempfile.mkdtemp(prefix="pagoda-soak-lora-")
        self.lora_cases = make_hostile_adapters(self.lora_dir)

    def server_flags(self):
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # A `*` host binds (`--host`'s address); a named one would connect to a subscriber.
            "endpoint": f"tcp://*:{self.publish_port}",
            "replay_endpoint": f"tcp://{self.host}:{self.replay_port}",
        }
        return [
            "--pooling", "last",
            "--kv-events-config", json.dumps(events),
            "--enable-lora", "--max-loras", "1",
            "--allow-runtime-lora-updating", "--lora-dirs", self.lora_dir,
        ]


def make_hostile_adapters(root):
    """Adapter directories under `root` whose files are not what they claim: links to endless
    devices, a FIFO nobody writes, a link leaving the directory. Every load must be a quick 400."""
    cases = []

    def adapter(name, config_target=None, fifo=False):
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        cfg = os.path.join(d, "adapter_config.json")
        if fifo:
            os.mkfifo(cfg)
        elif config_target is not None:
            os.symlink(config_target, cfg)
        cases.append(d)

    adapter("urandom", "/dev/urandom")
    adapter("zero", "/dev/zero")
    adapter("fifo", fifo=True)
    adapter("outside", "/etc/hostname")
    return cases


def deep_ref_schema(depth):
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def deep_nested_schema(depth):
    schema = {"type": "string"}
    for i in range(depth):
        schema = {"type": "object", "properties": {"a": schema}} if i % 2 else {"type": "array", "items": schema}
    return schema


def lark_chain(depth):
    rules = [f"r{i}: r{i + 1}" for i in range(depth)]
    return "start: r0\n" + "\n".join(rules) + f'\nr{depth}: "x"\n'


def _json(data):
    try:
        return json.loads(data)
    except ValueError:
        return None


def openai_error(obj):
    e = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"] != ""


def anthropic_error(obj):
    return (isinstance(obj, dict) and obj.get("type") == "error" and isinstance(obj.get("error"), dict)
            and isinstance(obj["error"].get("message"), str))


def check_http(kind, status, data, allowed, ok, anthropic=False):
    """Judges one attack's answer: `allowed` error statuses, `ok(obj)` for a 200's body."""
    obj = _json(data)
    if 200 <= status < 300:
        if ok is None:
            return ("lost", f"{kind}: accepted ({status})", repr(data[:300]))
        why = ok(obj)
        if why:
            return ("lost", f"{kind}: wrong 200 body", f"{why}: {data[:300]!r}")
        return ("finished", "ok", "")
    if status >= 500 and status != 503:
        return ("lost", f"HTTP {status}", f"{kind}: {data[:300]!r}")
    shaped = anthropic_error(obj) if anthropic else openai_error(obj)
    if not shaped:
        return ("lost", f"malformed error body ({status})", f"{kind}: {data[:300]!r}")
    message = obj["error"]["message"]
    if UNDERFLOW in message or "/tmp/" in message or "panicked" in message:
        return ("lost", f"{kind}: error leaks internals", message[:300])
    if status not in allowed and status not in OVERLOAD:
        return ("lost", f"unexpected status {status}", f"{kind}: {message[:300]}")
    return ("errored", str(status), message[:200])


class Attacks:
    """Builds the attack specs; `spec_class` is soak.py's Spec."""

    def __init__(self, model, setup, spec_class):
        self.model = model
        self.setup = setup
        self.Spec = spec_class

    def make(self, rng, kind):
        return getattr(self, kind)(rng, kind)

    def _http(self, kind, method, path, body, allowed, ok, anthropic=False, timeout=120.0):
        s = self.Spec(kind, method, path, body, timeout=timeout)
        s.mode = "attack"
        s.verify = lambda status, data: check_http(kind, status, data, allowed, ok, anthropic)
        return s

    def _chat(self, **extra):
        body = {"model": self.model, "messages": [{"role": "user", "content": "Give me a word."}],
                "max_tokens": 4}
        body.update(extra)
        return body

    def attack_deep_ref(self, rng, kind):
        # Past the 512 levels a schema may reach through `$ref`s.
        schema = deep_ref_schema(rng.choice([600, 1000, 3000]))
        where = rng.random()
        if where < 0.4:
            body = self._chat(response_format={"type": "json_schema",
                                               "json_schema": {"name": "deep", "schema": schema}})
            return self._http(kind, "POST", "/v1/chat/completions", body, (400,), None)
        if where < 0.7:
            body = {"model": self.model, "input": "Give me a word.", "max_output_tokens": 4,
                    "text": {"format": {"type": "json_schema", "name": "deep", "schema": schema}}}
            return self._http(kind, "POST", "/v1/responses", body, (400,), None)
        tool = {"type": "function", "function": {"name": "deep", "parameters": schema}}
        body = self._chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "deep"}})
        return self._http(kind, "POST", "/v1/chat/completions", body, (400,), None)

    def attack_deep_nesting(self, rng, kind):
        # Past the 64 levels a schema may nest; 200 goes past the body parser's 128 levels too.
        body = self._chat(response_format={"type": "json_schema", "json_schema": {
            "name": "nested", "schema": deep_nested_schema(rng.choice([70, 80, 200]))}})
        return self._http(kind, "POST", "/v1/chat/completions", body, (400,), None)

    def attack_deep_grammar(self, rng, kind):
        body = self._chat(guided_grammar=lark_chain(rng.choice([1000, 3000])))
        return self._http(kind, "POST", "/v1/chat/completions", body, (400,), None)

    def attack_huge_n(self, rng, kind):
        n = rng.choice([32, 64])
        body = {"model": self.model, "prompt": "The quick brown fox", "n": n, "max_tokens": 2,
                "temperature": 0.8}

        def ok(obj):
            choices = obj.get("choices") if isinstance(obj, dict) else None
            if not isinstance(choices, list) or len(choices) != n:
                return f"expected {n} choices"
            return None

        return self._http(kind, "POST", "/v1/completions", body, (), ok)

    def attack_big_store(self, rng, kind):
        big = "u" * rng.choice([1, 2, 4]) * 1_000_000
        body = {"model": self.model, "input": "Give me a word.", "max_output_tokens": 4, "store": True,
                rng.choice(["user", "instructions"]): big}

        def ok(obj):
            return None if isinstance(obj, dict) and obj.get("object") == "response" else "not a response"

        return self._http(kind, "POST", "/v1/responses", body, (400, 413), ok)

    def attack_big_embedding(self, rng, kind):
        text = "lorem ipsum dolor sit amet " * (rng.choice([1, 3, 6]) * 40_000)
        body = {"model": self.model, "input": text}

        def ok(obj):
            data = obj.get("data") if isinstance(obj, dict) else None
            if not isinstance(data, list) or len(data) != 1 or not data[0].get("embedding"):
                return "expected one embedding"
            return None

        return self._http(kind, "POST", "/v1/embeddings", body, (400, 413), ok)

    def attack_health_generate(self, rng, kind):
        return self._http(kind, "GET", "/health_generate", None, (), lambda obj: None, timeout=60.0)

    def attack_count_tokens(self, rng, kind):
        words = "river mountain lantern quiet copper harbor meadow signal orbit pebble ".split()
        text = " ".join(rng.choice(words) for _ in range(rng.choice([2500, 3500, 6000])))
        body = {"model": self.model, "messages": [{"role": "user", "content": text}]}

        def ok(obj):
            count = obj.get("input_tokens") if isinstance(obj, dict) else None
            return None if isinstance(count, int) and count > 2000 else "no input_tokens"

        return self._http(kind, "POST", "/v1/messages/count_tokens", body, (400,), ok, anthropic=True)

    def attack_lora(self, rng, kind):
        path = rng.choice(self.setup.lora_cases)
        body = {"lora_name": f"hostile-{rng.randint(0, 1 << 30)}", "lora_path": path}
        s = self.Spec(kind, "POST", "/v1/load_lora_adapter", body, timeout=30.0)
        s.mode = "attack"
        s.verify = lambda status, data: check_lora(kind, status, data, self.setup.lora_dir)
        return s

    def attack_zmtp(self, rng, kind):
        port, socket_type = rng.choice([(self.setup.publish_port, b"SUB"), (self.setup.replay_port, b"DEALER")])
        length = rng.choice([1 << 40, 1 << 62, 64 << 20])
        s = self.Spec(kind, "RAW", f"zmtp:{port}", None, timeout=15.0)
        s.mode = "raw"
        s.run_raw = lambda: zmtp_hostile_frame(self.setup.host, port, socket_type, length)
        return s


def check_lora(kind, status, data, lora_dir):
    """A hostile adapter load: a quick 400 whose text names no path of ours."""
    text = data.decode("utf-8", "replace")
    if status == 200:
        return ("lost", f"{kind}: a hostile adapter loaded", text[:300])
    if status >= 500 and status != 503:
        return ("lost", f"HTTP {status}", f"{kind}: {text[:300]}")
    if lora_dir in text:
        return ("lost", f"{kind}: the error names a server path", text[:300])
    if status not in (400,) + OVERLOAD:
        return ("lost", f"unexpected status {status}", f"{kind}: {text[:300]}")
    return ("errored", str(status), text[:200])


def zmtp_hostile_frame(host, port, socket_type, length):
    """Connects to a ZMTP 3 socket, completes the NULL handshake as a SUB/DEALER peer would, and
    announces a frame of `length` bytes that never comes. The server must neither reserve it nor
    die; it may close the connection."""
    greeting = (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
                + b"\x00" + b"\x00" * 31)
    sock = socket.create_connection((host, port), timeout=5.0)
    try:
        sock.sendall(greeting)
        got = b""
        while len(got) < 64:
            chunk = sock.recv(64 - len(got))
            if not chunk:
                return ("lost", "zmtp: closed during the greeting", f"port {port}")
            got += chunk
        ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
        sock.sendall(bytes([0x04, len(ready)]) + ready)
        sock.sendall(bytes([0x02]) + struct.pack(">Q", length) + b"x" * 16)
        time.sleep(0.2)
        return ("finished", "ok", "")
    except (ConnectionResetError, BrokenPipeError):
        # The server may drop a peer that breaks its limits: that is the point.
        return ("finished", "ok", "reset")
    except ConnectionRefusedError as e:
        return ("lost", "zmtp: connection refused", repr(e))
    except socket.timeout as e:
        return ("lost", "zmtp: timeout", repr(e))
    finally:
        sock.close()
