#!/usr/bin/env python3
"""Images through the official SDKs against a Pagoda server serving a vision model (the tiny
Idefics3 checkpoint, tests/fixtures/tiny/idefics3).

    python tests/sdk/check_images.py --base-url http://127.0.0.1:8000 --api-key KEY --model NAME

--base-url is the server's root. The checks: OpenAI's chat completions with an `image_url` data
URL, whole and streamed (the stream adds up to the whole answer); two different images with the
same number of image tokens give different greedy answers; Anthropic's Messages with a base64
`image` block, whole and streamed, answering as chat does; OpenAI's Responses with an
`input_image`; a bad image raising each SDK's BadRequestError naming the part. One line is
printed per check; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import base64
import pathlib
import sys
import traceback

import anthropic
import openai

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "media"
# Two images of equal tile grids under the tiny processor (2x2 tiles + the global one).
IMAGE_A = ("image/png", FIXTURES / "landscape.png")
IMAGE_B = ("image/jpeg", FIXTURES / "photo.jpg")
MAX_TOKENS = 8
QUESTION = "what is this"


def b64(image) -> str:
    return base64.b64encode(image[1].read_bytes()).decode()


def data_url(image) -> str:
    return f"data:{image[0]};base64,{b64(image)}"


def chat_messages(image) -> list:
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image), "detail": "auto"}},
        {"type": "text", "text": QUESTION},
    ]}]


def chat(oai: openai.OpenAI, model: str, image, **extra) -> str:
    out = oai.chat.completions.create(
        model=model, messages=chat_messages(image), max_tokens=MAX_TOKENS, temperature=0, **extra
    )
    assert out.usage.prompt_tokens > 80, f"an image of 5 tiles is 80 placeholders: {out.usage}"
    return out.choices[0].message.content or ""


def check_chat_whole_and_streamed(oai, anth, model) -> str:
    whole = chat(oai, model, IMAGE_A)
    stream = oai.chat.completions.create(
        model=model, messages=chat_messages(IMAGE_A), max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole, f"stream {streamed!r} != whole {whole!r}"
    return f"chat {whole!r}, streamed the same"


def check_images_differ(oai, anth, model) -> str:
    a = chat(oai, model, IMAGE_A, extra_body={"ignore_eos": True})
    b = chat(oai, model, IMAGE_B, extra_body={"ignore_eos": True})
    assert a != b, f"images A and B gave the same greedy answer {a!r}"
    return f"A {a!r} vs B {b!r}"


def check_anthropic_base64(oai, anth, model) -> str:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": IMAGE_A[0], "data": b64(IMAGE_A)}},
        {"type": "text", "text": QUESTION},
    ]
    messages = [{"role": "user", "content": content}]
    # This SDK's messages.create takes no sampling parameters; the API takes temperature.
    greedy = {"extra_body": {"temperature": 0}}
    msg = anth.messages.create(model=model, max_tokens=MAX_TOKENS, messages=messages, **greedy)
    text = "".join(b.text for b in msg.content if b.type == "text")
    with anth.messages.stream(model=model, max_tokens=MAX_TOKENS, messages=messages, **greedy) as s:
        streamed = "".join(s.text_stream)
    assert streamed == text, f"stream {streamed!r} != whole {text!r}"
    expected = chat(oai, model, IMAGE_A)
    assert text == expected, f"Anthropic {text!r} != chat {expected!r} for the same prompt"
    # Anthropic counts prefix-cache reads apart: the image's tokens were read from the cache.
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 80, msg.usage
    assert (msg.usage.cache_read_input_tokens or 0) > 0, f"the repeated image missed the prefix cache: {msg.usage}"
    return f"messages {text!r} (= chat), streamed the same, {msg.usage.cache_read_input_tokens} tokens cached"


def check_responses_input_image(oai, anth, model) -> str:
    items = [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(IMAGE_A), "detail": "auto"},
        {"type": "input_text", "text": QUESTION},
    ]}]
    r = oai.responses.create(model=model, input=items, max_output_tokens=MAX_TOKENS, temperature=0, store=False)
    expected = chat(oai, model, IMAGE_A)
    assert r.output_text == expected, f"Responses {r.output_text!r} != chat {expected!r}"
    return f"responses {r.output_text!r} (= chat)"


def check_bad_images_are_named(oai, anth, model) -> str:
    bad = "data:image/png;base64," + base64.b64encode(IMAGE_A[1].read_bytes()[:100]).decode()
    try:
        oai.chat.completions.create(
            model=model, max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": bad}}]}],
        )
        raise AssertionError("a truncated PNG was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "messages[0].content[0].image_url", e.body
    try:
        anth.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zz4="}},
        ]}])
        raise AssertionError("an SVG was accepted")
    except anthropic.BadRequestError as e:
        assert "messages[0].content[0].source" in str(e), e
    return "openai and anthropic BadRequestError naming the part"


CHECKS = [
    check_chat_whole_and_streamed,
    check_images_differ,
    check_anthropic_base64,
    check_responses_input_image,
    check_bad_images_are_named,
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    root = a.base_url.rstrip("/")
    oai = openai.OpenAI(base_url=root + "/v1", api_key=a.api_key, timeout=a.timeout, max_retries=0)
    anth = anthropic.Anthropic(base_url=root, api_key=a.api_key, timeout=a.timeout, max_retries=0)
    failed = 0
    for check in CHECKS:
        try:
            print(f"ok   {check.__name__}: {check(oai, anth, a.model)}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the next check runs
            failed += 1
            print(f"FAIL {check.__name__}:\n{traceback.format_exc()}")
    print(f"{len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
