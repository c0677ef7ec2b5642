#!/usr/bin/env python3
"""Pagoda's KV events as a vLLM consumer reads them: pyzmq for the sockets, msgspec with vLLM's
own KVEventBatch schema (vLLM 0.24+, events as maps tagged by "type") for the payloads, and
cbor2 + hashlib for an independent computation of vLLM's sha256_cbor block hashes.

    python tests/sdk/check_kv_events.py --base-url http://127.0.0.1:8000 --api-key KEY --model NAME \
        --endpoint tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 --block-size 16

It subscribes, sends a mixed load (prompts sharing prefixes, and more distinct text than the
KV cache holds, so blocks are evicted), then checks: every message is [topic, seq, payload] with
seq 0, 1, 2, ... and decodes with the schema; every BlockStored's hashes equal the chain
recomputed from its token ids (from the seed for a first block, else from the digest of the
parent block reported earlier); every BlockRemoved names a stored block; each request's
prompt blocks (from /tokenize) were stored; evictions happened; stored minus removed equals the
blocks a prefix-cache flush then drops (/flush_cache), and the flush publishes
AllBlocksCleared; a late subscriber's replay from seq 0 returns every batch byte for byte and
ends with the end-of-sequence frame. One line per check; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import cbor2
import msgspec
import zmq

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def sha256_cbor(obj) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def as_int(digest: bytes) -> int:
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
    if not ok:
        FAILURES.append(name)


def post(base: str, key: str, path: str, body: dict | None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"POST {path} -> {e.code}: {e.read().decode(errors='replace')}") from None


def drain(sub: zmq.Socket, into: list, quiet_s: float) -> None:
    """Receives until nothing arrives for `quiet_s`."""
    while sub.poll(int(quiet_s * 1000)):
        into.append(sub.recv_multipart())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    base, key, bs = args.base_url, args.api_key, args.block_size

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.endpoint)
    time.sleep(1.0)  # ZMQ's slow joiner: let the subscription reach the publisher first

    # Shared prefixes (hits), then more distinct text than the cache holds (evictions).
    shared = "The history of the lighthouse keepers of the northern coast is long. " * 6
    prompts = [shared + f"Chapter {i}: the storm." for i in range(3)]
    prompts += [f"Story {i}: " + " ".join(f"word{i}x{j}" for j in range(40)) for i in range(10)]
    prompts += [shared + "Epilogue."]
    prompt_ids = []
    for p in prompts:
        prompt_ids.append(post(base, key, "/tokenize", {"model": args.model, "prompt": p})["tokens"])
        post(base, key, "/v1/completions", {"model": args.model, "prompt": p, "max_tokens": 4, "temperature": 0})
    messages: list[list[bytes]] = []
    drain(sub, messages, 1.5)
    flushed = post(base, key, "/flush_cache", None)["flushed_blocks"]
    drain(sub, messages, 1.5)

    # Wire: three frames, the topic, contiguous sequence numbers from 0, schema-valid payloads.
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    check("messages arrived", len(messages) > 0, "none")
    check("three frames each", all(len(m) == 3 for m in messages))
    check("topic frame", all(m[0] == args.topic.encode() for m in messages))
    seqs = [int.from_bytes(m[1], "big") for m in messages]
    check("sequence numbers 0, 1, 2, ...", seqs == list(range(len(seqs))), str(seqs[:10]))
    batches = []
    try:
        batches = [decoder.decode(m[2]) for m in messages]
        check("payloads decode with vLLM's schema", True)
    except msgspec.ValidationError as e:
        check("payloads decode with vLLM's schema", False, str(e))

    # Hashes: recomputed from the token ids, chained on the parents reported before.
    none_hash = sha256_cbor("vllm-none-hash")
    digests: dict[int, bytes] = {}
    resident: set[int] = set()
    stored = removed = cleared = 0
    bad_hashes, unknown_parent, unknown_removed = [], 0, 0
    for batch in batches:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                if ev.parent_block_hash is None:
                    parent = none_hash
                elif ev.parent_block_hash in digests:
                    parent = digests[ev.parent_block_hash]
                else:
                    unknown_parent += 1
                    continue
                check_len = len(ev.token_ids) == bs * len(ev.block_hashes) and ev.block_size == bs
                if not check_len:
                    bad_hashes.append(("length", ev.block_hashes))
                for i, h in enumerate(ev.block_hashes):
                    parent = sha256_cbor((parent, tuple(ev.token_ids[i * bs:(i + 1) * bs]), None))
                    if as_int(parent) != h:
                        bad_hashes.append((h, as_int(parent)))
                    digests[h] = parent
                    resident.add(h)
                    stored += 1
                if ev.medium != "GPU" or ev.group_idx != 0 or ev.kv_cache_spec_kind != "full_attention":
                    bad_hashes.append(("fields", ev.medium, ev.group_idx, ev.kv_cache_spec_kind))
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    if h in resident:
                        resident.discard(h)
                        removed += 1
                    else:
                        unknown_removed += 1
            elif isinstance(ev, AllBlocksCleared):
                cleared += 1
                resident_before_clear = len(resident)
                resident.clear()
    check("block hashes equal an independent sha256_cbor chain", not bad_hashes and stored > 0,
          f"{len(bad_hashes)} bad of {stored}: {bad_hashes[:3]}")
    check("every parent was reported before", unknown_parent == 0, f"{unknown_parent} unknown")
    check("every removal names a stored block", unknown_removed == 0, f"{unknown_removed} unknown")
    check("evictions were reported", removed > 0, f"stored {stored}, removed {removed}")

    # Each prompt's full blocks (the very ids /tokenize gives) were stored at some point.
    missing = 0
    for ids in prompt_ids:
        parent = none_hash
        for i in range(len(ids) // bs):
            parent = sha256_cbor((parent, tuple(ids[i * bs:(i + 1) * bs]), None))
            missing += as_int(parent) not in digests
    check("every prompt block was stored", missing == 0, f"{missing} missing")

    # Stored minus removed is what the cache held: the flush dropped exactly that many.
    check("one AllBlocksCleared, from the flush", cleared == 1, f"{cleared}")
    if cleared == 1:
        check("stored - removed == blocks resident", resident_before_clear == flushed,
              f"{stored} stored - {removed} removed = {resident_before_clear}, flush dropped {flushed}")

    # Replay: a late subscriber asks from 0 and gets every batch, then the end marker.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(args.replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    ended = False
    while dealer.poll(5000):
        frames = dealer.recv_multipart()[1:]
        if len(frames) == 3 and frames[1] == b"\xff" * 8 and frames[2] == b"":
            ended = True
            break
        replayed.append(frames)
    check("replay ends with the end-of-sequence frame", ended)
    check("replay returns every batch byte for byte", replayed == messages,
          f"{len(replayed)} replayed, {len(messages)} seen")
    print(f"summary: {len(messages)} batches, {stored} blocks stored, {removed} removed, "
          f"{resident_before_clear if cleared else '?'} resident at the flush")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
