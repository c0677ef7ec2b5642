#!/usr/bin/env python3
"""OpenAI's Files and Batch APIs through the official OpenAI Python SDK against a running Pagoda
server started with --batch-dir (and --pooling, so that one model also embeds).

    python tests/sdk/check_batch.py --base-url http://127.0.0.1:8000/v1 --api-key KEY --model NAME [--suite S]

Suites:
  full (default): chat, completions and embeddings batches (output lines in OpenAI's shape, a
    malformed line, a wrong url and a bad parameter in the error file, the rest done), the input
    file retrieved, downloaded and deleted, refusals as the SDK's BadRequestError/NotFoundError,
    a batch cancelled while it runs, the batches listed.
  restart-start: uploads a long chat batch, waits until some lines are done, prints
    `BATCH_ID=<id>` and exits (the caller stops the server mid-batch).
  restart-finish --batch-id ID: waits for the resumed batch and checks every line answered once.
One line per check; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import traceback

import openai

RESTART_LINES = 12


def jsonl(lines) -> bytes:
    return "".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines).encode()


def chat_line(custom_id, text, model, max_tokens=8, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def upload(client, lines, name="in.jsonl"):
    return client.files.create(file=(name, io.BytesIO(jsonl(lines))), purpose="batch")


def wait(client, batch_id, until, timeout):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} stuck: {batch.status} {batch.request_counts}"
        time.sleep(0.3)


def done(batch):
    return batch.status in ("completed", "failed", "cancelled")


def read_lines(client, file_id):
    if file_id is None:
        return []
    return [json.loads(l) for l in client.files.content(file_id).text.splitlines() if l.strip()]


def run_batch(client, lines, endpoint, timeout):
    f = upload(client, lines)
    batch = client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h")
    assert batch.status in ("validating", "in_progress"), batch.status
    batch = wait(client, batch.id, done, timeout)
    assert batch.status == "completed", batch
    return batch, read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)


def full(client, model, timeout):
    checks = []

    def check(fn):
        checks.append(fn)
        return fn

    @check
    def chat_batch_with_bad_lines():
        lines = [chat_line(f"chat-{i}", f"Say the number {i}.", model) for i in range(3)]
        lines.append('{"custom_id": "broken", "method": "POST", ')
        lines.append({**chat_line("wrong-url", "Hi", model), "url": "/v1/completions"})
        lines.append(chat_line("bad-param", "Hi", model, temperature=-1))
        batch, out, err = run_batch(client, lines, "/v1/chat/completions", timeout)
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (6, 3, 3), counts
        assert batch.completed_at and batch.in_progress_at and batch.finalizing_at, batch
        assert sorted(o["custom_id"] for o in out) == ["chat-0", "chat-1", "chat-2"], out
        for o in out:
            assert o["error"] is None and o["id"].startswith("batch_req_"), o
            assert o["response"]["status_code"] == 200 and o["response"]["request_id"], o
            body = o["response"]["body"]
            assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"], body
        by_id = {e["custom_id"]: e for e in err}
        assert set(by_id) == {None, "wrong-url", "bad-param"}, err
        assert by_id[None]["response"] is None and by_id[None]["error"]["code"] == "invalid_request", by_id[None]
        assert by_id["wrong-url"]["error"]["code"] == "invalid_url", by_id["wrong-url"]
        bad = by_id["bad-param"]["response"]
        assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "temperature", bad
        return f"{batch.id}: 3 answers, 3 errors"

    @check
    def completions_batch():
        lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}}
                 for i in range(2)]
        batch, out, err = run_batch(client, lines, "/v1/completions", timeout)
        assert batch.error_file_id is None and not err, err
        texts = {o["response"]["body"]["choices"][0]["text"] for o in out}
        assert len(out) == 2 and len(texts) == 1, out
        assert all(o["response"]["body"]["object"] == "text_completion" for o in out), out
        return f"{batch.id}: {texts.pop()!r} twice"

    @check
    def embeddings_batch():
        lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": model, "input": text}} for i, text in enumerate(["Paris", "pizza"])]
        batch, out, _ = run_batch(client, lines, "/v1/embeddings", timeout)
        vectors = {o["custom_id"]: o["response"]["body"]["data"][0]["embedding"] for o in out}
        assert set(vectors) == {"e0", "e1"} and vectors["e0"] != vectors["e1"], vectors.keys()
        return f"{batch.id}: {len(vectors['e0'])}-d vectors"

    @check
    def files_retrieve_download_delete():
        content = jsonl([chat_line("x", "Hi", model)])
        f = client.files.create(file=("mine.jsonl", io.BytesIO(content)), purpose="batch")
        got = client.files.retrieve(f.id)
        assert (got.filename, got.bytes, got.purpose) == ("mine.jsonl", len(content), "batch"), got
        assert client.files.content(f.id).content == content
        assert f.id in [x.id for x in client.files.list()]
        assert client.files.delete(f.id).deleted
        try:
            client.files.retrieve(f.id)
            raise AssertionError("a deleted file was found")
        except openai.NotFoundError:
            pass
        return f.id

    @check
    def refusals():
        for call, param in [
            (lambda: client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune"), "purpose"),
            (lambda: client.files.create(file=("a.jsonl", io.BytesIO(b"\n\n")), purpose="batch"), "file"),
            (lambda: client.batches.create(input_file_id="file-0", endpoint="/v1/chat/completions",
                                           completion_window="24h"), "input_file_id"),
            (lambda: client.batches.create(input_file_id=upload(client, ["{}"]).id, endpoint="/v1/responses",
                                           completion_window="24h"), "endpoint"),
        ]:
            try:
                call()
                raise AssertionError(f"{param}: accepted")
            except openai.BadRequestError as e:
                assert e.body["param"] == param, e.body
        for call in [lambda: client.batches.retrieve("batch_00"), lambda: client.files.content("file-00")]:
            try:
                call()
                raise AssertionError("an unknown id was found")
            except openai.NotFoundError:
                pass
        return "400s and 404s"

    @check
    def cancel_a_running_batch():
        lines = [chat_line(f"long-{i}", "Write a long story about a cat.", model, max_tokens=48) for i in range(16)]
        f = upload(client, lines)
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled"), cancelling.status
        batch = wait(client, batch.id, done, timeout)
        assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at, batch
        out = read_lines(client, batch.output_file_id)
        assert batch.request_counts.completed == len(out) < 16, (batch.request_counts, len(out))
        return f"{batch.id}: {len(out)} of 16 lines ran"

    @check
    def list_batches():
        ids = [b.id for b in client.batches.list()]
        assert len(ids) >= 4, ids
        return f"{len(ids)} batches"

    failed = 0
    for fn in checks:
        try:
            print(f"ok   {fn.__name__}: {fn()}")
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__}")
            traceback.print_exc(file=sys.stdout)
    return failed


def restart_start(client, model, timeout):
    lines = [chat_line(f"r{i}", f"Count from {i} to {i + 20}.", model, max_tokens=24) for i in range(RESTART_LINES)]
    f = upload(client, lines)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait(client, batch.id, lambda b: b.request_counts.completed >= 2 or done(b), timeout)
    assert batch.status == "in_progress", f"the batch ended before the restart: {batch}"
    print(f"ok   restart_start: {batch.request_counts.completed} of {RESTART_LINES} done before the stop")
    print(f"BATCH_ID={batch.id}")
    return 0


def restart_finish(client, batch_id, timeout):
    batch = wait(client, batch_id, done, timeout)
    assert batch.status == "completed", batch
    out = read_lines(client, batch.output_file_id)
    ids = [o["custom_id"] for o in out]
    assert sorted(ids) == sorted(f"r{i}" for i in range(RESTART_LINES)), ids
    assert batch.request_counts.completed == RESTART_LINES, batch.request_counts
    print(f"ok   restart_finish: {batch_id}: every one of {RESTART_LINES} lines answered once")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--suite", default="full", choices=["full", "restart-start", "restart-finish"])
    p.add_argument("--batch-id")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=args.timeout, max_retries=0)
    try:
        if args.suite == "full":
            failed = full(client, args.model, args.timeout)
        elif args.suite == "restart-start":
            failed = restart_start(client, args.model, args.timeout)
        else:
            failed = restart_finish(client, args.batch_id, args.timeout)
    except Exception:
        traceback.print_exc(file=sys.stdout)
        failed = 1
    print("FAILED" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
