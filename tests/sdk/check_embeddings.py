#!/usr/bin/env python3
"""OpenAI's embeddings API through the official OpenAI Python SDK against a running Pagoda
server that serves an embedding model (all-MiniLM-L6-v2).

    python tests/sdk/check_embeddings.py --base-url http://127.0.0.1:8000/v1 --api-key KEY --model NAME

Checks: the SDK's default request (it asks for base64 and decodes it) equals encoding_format
"float"; one embedding per input, in input order, of 384 unit-norm floats; a batch equals its
inputs one by one; token-id inputs equal their text; related sentences lie closer than unrelated
ones; usage counts the input tokens; `dimensions` on a model not trained for it is a
BadRequestError naming the parameter; the raw body validates against the SDK's own type; and
Cohere's SDK (ClientV2.rerank, POST /v2/rerank) ranks the documents by those embeddings' cosine.
One line per check; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import array
import math
import sys
import traceback

import httpx
import cohere
import openai
from openai.types import CreateEmbeddingResponse

TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "I love eating pizza with extra cheese on Friday nights.",
    "北京是中国的首都。",
]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def f32(values):
    return array.array("f", values).tolist()


def close(a, b, tol=1e-5):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=args.timeout, max_retries=0)
    model = args.model
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            print(f"ok   {name}: {fn()}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the next check runs
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc(file=sys.stdout)

    state = {}

    def default_equals_float():
        default = client.embeddings.create(model=model, input=TEXTS)
        floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
        assert [d.index for d in default.data] == list(range(len(TEXTS))), default.data
        for a, b in zip(default.data, floats.data):
            # JSON carries each float32 in its shortest form: as float32 they are the same.
            assert len(a.embedding) == 384 and f32(a.embedding) == f32(b.embedding), "base64 differs from float"
            assert abs(math.sqrt(sum(x * x for x in a.embedding)) - 1.0) < 1e-5
        assert default.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)
        state["batch"] = [d.embedding for d in floats.data]
        return f"{len(TEXTS)} x 384, usage {floats.usage.prompt_tokens} tokens"

    def batch_equals_alone():
        for text, batched in zip(TEXTS, state["batch"]):
            alone = client.embeddings.create(model=model, input=text, encoding_format="float").data[0].embedding
            assert close(alone, batched), f"{text!r}: batched and alone differ"
        return "each input alone gives its batched embedding"

    def tokens_equal_text():
        root = args.base_url.rstrip("/").removesuffix("/v1")
        reply = httpx.post(f"{root}/tokenize", json={"prompt": TEXTS[0]},
                           headers={"Authorization": f"Bearer {args.api_key}"}, timeout=args.timeout)
        reply.raise_for_status()
        ids = reply.json()["tokens"]
        by_ids = client.embeddings.create(model=model, input=[ids], encoding_format="float").data[0].embedding
        assert close(by_ids, state["batch"][0]), "token ids and text differ"
        return f"{len(ids)} token ids"

    def meaning():
        q, related, unrelated = state["batch"][0], state["batch"][1], state["batch"][2]
        assert cosine(q, related) > cosine(q, unrelated) + 0.2, (cosine(q, related), cosine(q, unrelated))
        return f"related {cosine(q, related):.3f} > unrelated {cosine(q, unrelated):.3f}"

    def dimensions_refused():
        try:
            client.embeddings.create(model=model, input="x", dimensions=64)
        except openai.BadRequestError as e:
            assert e.body and e.body.get("param") == "dimensions", e.body
            return f"400: {e.body['message'][:60]}"
        raise AssertionError("dimensions=64 was accepted")

    def raw_shape():
        raw = client.embeddings.with_raw_response.create(model=model, input=TEXTS[:2], encoding_format="float")
        CreateEmbeddingResponse.model_validate(raw.http_response.json(), strict=False)
        body = raw.http_response.json()
        assert body["object"] == "list" and body["data"][0]["object"] == "embedding", body
        return "validates against CreateEmbeddingResponse"

    def cohere_rerank():
        root = args.base_url.rstrip("/").removesuffix("/v1")
        co = cohere.ClientV2(base_url=root, api_key=args.api_key, timeout=args.timeout)
        documents = TEXTS[1:]
        reply = co.rerank(model=model, query=TEXTS[0], documents=documents, top_n=2)
        assert len(reply.results) == 2, reply
        best = reply.results[0]
        assert best.index == 0, f"the Paris sentence ranks first: {reply.results}"
        assert reply.results[0].relevance_score >= reply.results[1].relevance_score
        want = cosine(state["batch"][0], state["batch"][1])
        assert abs(best.relevance_score - want) < 1e-5, (best.relevance_score, want)
        return f"top {best.index} at {best.relevance_score:.3f} (POST /v2/rerank)"

    for name, fn in [("default_equals_float", default_equals_float), ("batch_equals_alone", batch_equals_alone),
                     ("tokens_equal_text", tokens_equal_text), ("meaning", meaning),
                     ("dimensions_refused", dimensions_refused), ("raw_shape", raw_shape),
                     ("cohere_rerank", cohere_rerank)]:
        check(name, fn)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
