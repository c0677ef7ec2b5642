#!/usr/bin/env python3
"""Background responses of the OpenAI Responses API through the official OpenAI Python SDK
against a running Pagoda server.

    python tests/sdk/check_background.py --base-url http://127.0.0.1:8000 --api-key KEY --model NAME \\
        --max-stored 3

--base-url is the server's root (the client gets it with /v1 added); --max-stored is the
server's --max-stored-responses, for the eviction check (the server should serve nothing else
meanwhile). The checks: `responses.create(background=True)` answered at once and polled with
`responses.retrieve` to the same output as a foreground response; a background stream
(`stream=True`) closed by the client mid-answer, the response finishing anyway, and its stream
resumed with `responses.retrieve(id, stream=True, starting_after=N)`; `responses.cancel` (at once
`cancelled`, idempotent, a `BadRequestError` for a foreground response); the errors as the SDK's
typed exceptions; and the least recently used finished response evicted past --max-stored.
Every check runs; one line is printed per check, and the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import openai


class CheckFailed(Exception):
    """A check saw something wrong; the message says what."""


@dataclass
class Context:
    client: openai.OpenAI
    model: str
    max_stored: int


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def text_of(response: Any) -> str:
    return "".join(
        part.text for item in response.output if item.type == "message" for part in item.content
        if part.type == "output_text"
    )


def create(ctx: Context, prompt: str, **kwargs: Any) -> Any:
    args = {"model": ctx.model, "input": prompt, "max_output_tokens": 40, "temperature": 0}
    args.update(kwargs)
    return ctx.client.responses.create(**args)


def poll(ctx: Context, response_id: str, until: Callable[[Any], bool] = lambda r: False) -> Any:
    deadline = time.monotonic() + 240
    while True:
        r = ctx.client.responses.retrieve(response_id)
        if until(r) or r.status not in ("queued", "in_progress"):
            return r
        expect(time.monotonic() < deadline, f"{response_id} still {r.status} after 240 s")
        time.sleep(0.05)


def long_kwargs() -> dict:
    """A background response that cannot end early: its schema asks for more than it may say."""
    schema = {"type": "object", "additionalProperties": False, "required": ["n"],
              "properties": {"n": {"type": "array", "items": {"type": "integer"}, "minItems": 600}}}
    return {"background": True, "max_output_tokens": 700,
            "text": {"format": {"type": "json_schema", "name": "numbers", "schema": schema}}}


def create_and_poll(ctx: Context) -> str:
    prompt = "What is the capital of France?"
    foreground = create(ctx, prompt)
    queued = create(ctx, prompt, background=True)
    expect(queued.status in ("queued", "in_progress"), f"created {queued.status}")
    expect(queued.background is True, f"background is {queued.background!r}")
    done = poll(ctx, queued.id)
    expect(done.status in ("completed", "incomplete"), f"ended {done.status}: {done.error}")
    expect(text_of(done) == text_of(foreground), f"{text_of(done)!r} != foreground {text_of(foreground)!r}")
    expect(done.usage is not None and done.usage.output_tokens > 0, f"usage {done.usage}")
    return f"{queued.status} -> {done.status}, {done.usage.output_tokens} tokens, same as foreground"


def stream_closed_and_resumed(ctx: Context) -> str:
    stream = create(ctx, "Tell me about the sea.", background=True, stream=True, max_output_tokens=120)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    # The client goes away mid-answer: the generation goes on.
    stream.close()
    expect(seen[0].type == "response.created", f"first event {seen[0].type}")
    response_id = seen[0].response.id
    done = poll(ctx, response_id)
    expect(done.status in ("completed", "incomplete"), f"ended {done.status}: {done.error}")
    last = seen[-1].sequence_number
    rest = list(ctx.client.responses.retrieve(response_id, stream=True, starting_after=last))
    expect(rest and rest[0].sequence_number == last + 1, f"resumed at {rest[0].sequence_number if rest else None}")
    expect(rest[-1].type == f"response.{done.status}", f"last event {rest[-1].type}")
    deltas = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    expect(deltas == text_of(done), f"deltas {deltas!r} != {text_of(done)!r}")
    whole = list(ctx.client.responses.retrieve(response_id, stream=True))
    expect([e.sequence_number for e in whole] == list(range(len(whole))), "replayed sequence numbers")
    expect(whole[len(seen):] == rest, "a replay from the start holds the resumed events")
    return f"closed after {len(seen)} events, resumed with {len(rest)} more ({done.status})"


def cancel(ctx: Context) -> str:
    started = create(ctx, "List many numbers.", **long_kwargs())
    running = poll(ctx, started.id, lambda r: text_of(r) != "")
    expect(running.status == "in_progress", f"{running.status} before it could be cancelled")
    cancelled = ctx.client.responses.cancel(started.id)
    expect(cancelled.status == "cancelled", f"cancel gave {cancelled.status}")
    expect(text_of(cancelled).startswith(text_of(running)), "the output so far is kept")
    again = ctx.client.responses.cancel(started.id)
    expect(again.status == "cancelled" and text_of(again) == text_of(cancelled), "a second cancel changes nothing")
    time.sleep(0.3)
    later = ctx.client.responses.retrieve(started.id)
    expect(later.status == "cancelled" and text_of(later) == text_of(cancelled), f"later {later.status}")
    foreground = create(ctx, "Hi", max_output_tokens=2)
    try:
        ctx.client.responses.cancel(foreground.id)
        raise CheckFailed("cancelling a foreground response succeeded")
    except openai.BadRequestError as e:
        expect("background" in str(e.message), f"message {e.message!r}")
    return f"cancelled after {len(text_of(cancelled))} characters; a foreground one refused"


def errors(ctx: Context) -> str:
    try:
        create(ctx, "Hi", background=True, store=False)
        raise CheckFailed("background with store=False succeeded")
    except openai.BadRequestError as e:
        expect(e.param == "background", f"param {e.param!r}: {e.body}")
    for call in (
        lambda: ctx.client.responses.retrieve("resp_nope"),
        lambda: ctx.client.responses.cancel("resp_nope"),
    ):
        try:
            call()
            raise CheckFailed("an unknown id was found")
        except openai.NotFoundError:
            pass
    done = poll(ctx, create(ctx, "Hi", background=True, max_output_tokens=2).id)
    try:
        list(ctx.client.responses.retrieve(done.id, stream=True, starting_after=100000))
        raise CheckFailed("starting_after past the end succeeded")
    except openai.BadRequestError as e:
        expect(e.param == "starting_after", f"param {e.param!r}: {e.body}")
    return "store=False refused, unknown ids NotFoundError, starting_after past the end BadRequestError"


def eviction(ctx: Context) -> str:
    ids = []
    for i in range(ctx.max_stored + 1):
        ids.append(poll(ctx, create(ctx, f"Say {i}.", background=True, max_output_tokens=3).id).id)
    try:
        ctx.client.responses.retrieve(ids[0])
        raise CheckFailed(f"the oldest of {len(ids)} responses is still stored")
    except openai.NotFoundError:
        pass
    for response_id in ids[1:]:
        ctx.client.responses.retrieve(response_id)
    return f"{len(ids)} finished responses in {ctx.max_stored} places: the oldest evicted"


CHECKS = [create_and_poll, stream_closed_and_resumed, cancel, errors, eviction]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the server's root URL (no /v1)")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--max-stored", type=int, required=True, help="the server's --max-stored-responses")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args = parser.parse_args()
    root = args.base_url.rstrip("/")
    client = openai.OpenAI(base_url=root + "/v1", api_key=args.api_key, max_retries=0, timeout=args.timeout)
    ctx = Context(client=client, model=args.model, max_stored=args.max_stored)
    print(f"openai {openai.__version__} against {root} (model {args.model})", flush=True)
    failed = []
    for check in CHECKS:
        start = time.monotonic()
        try:
            detail = check(ctx)
        except Exception as e:  # noqa: BLE001 - any SDK or network error is a failure of this check
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}: {type(e).__name__}: {e}", flush=True)
            if not isinstance(e, CheckFailed):
                traceback.print_exc(file=sys.stderr)
            continue
        print(f"ok   {check.__name__} ({time.monotonic() - start:.1f}s): {detail}", flush=True)
    if failed:
        print(f"error: {len(failed)} of {len(CHECKS)} checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(CHECKS)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
