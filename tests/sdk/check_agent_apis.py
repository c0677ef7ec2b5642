#!/usr/bin/env python3
"""The Anthropic Messages and OpenAI Responses APIs through the official SDKs against a running
Pagoda server.

    python tests/sdk/check_agent_apis.py --base-url http://127.0.0.1:8000 --api-key KEY --model NAME

--base-url is the server's root: the `anthropic` client takes it as is (it adds /v1/messages),
the `openai` client gets it with /v1 added. --suite picks the checks: anthropic, responses, all
(both, the default) or thinking (a server started with a reasoning parser and a chat template that
opens `<think>`). Each check is a function in a suite's list that takes a Context and returns a
short description of what it saw, or raises (CheckFailed or anything else) on a failure. Every
check runs; one line is printed per check, and the exit status is 1 if any failed.

The model is small (SmolLM2-135M): prompts stay simple, max_tokens stays at most 200 (the thinking
checks excepted) and sampling is greedy. The checks look at protocol facts (shapes, types, stop
reasons, event order, that a stream and a whole response agree, that tool inputs validate against
their schemas), not at the quality of the answers. The raw JSON of every body and stream event
is also validated against the SDKs' own pydantic types (the SDKs build their objects without
validation, so a missing field or a wrong type would otherwise pass unseen); the differences are
reported by one check per API at the end of its suite (anthropic_shapes, responses_shapes,
thinking_shapes), so that one missing field fails one check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import anthropic
import httpx
import jsonschema
import openai
import pydantic
from pydantic import BaseModel, Field

MAX_TOKENS = 200
# A 1x1 PNG: the server takes text only, so an image block is a 400 before it is decoded.
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
ANTHROPIC_VERSION = "2023-06-01"


class CheckFailed(Exception):
    """A check saw something wrong; the message says what."""


@dataclass
class Context:
    anthropic: anthropic.Anthropic
    openai: openai.OpenAI
    root: str
    api_key: str
    model: str
    timeout: float
    # Where raw bodies and events differ from the SDKs' types: {api: {difference: where first seen}},
    # and how many were validated; the *_shapes checks report them.
    shape_problems: dict[str, dict[str, str]] = field(default_factory=lambda: {"anthropic": {}, "responses": {}})
    shapes_seen: dict[str, int] = field(default_factory=lambda: {"anthropic": 0, "responses": 0})


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def validate(instance: object, schema: dict, what: str) -> None:
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(instance), key=lambda e: list(e.path))
    expect(not errors, f"{what} does not validate: {'; '.join(e.message for e in errors)}: {instance!r}")


def loads_json(text: str | None, what: str) -> object:
    expect(isinstance(text, str), f"{what}: not a string: {text!r}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckFailed(f"{what} is not JSON ({e}): {text!r}") from None


def short(value: object, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# --- Strict shapes ----------------------------------------------------------------------------
#
# The SDKs construct their response objects without validating them, so a missing field or a
# wrong type passes unseen. conform() validates the raw JSON against the SDKs' pydantic types and
# records each difference; one check per API (anthropic_shapes, responses_shapes, thinking_shapes)
# reports them, so that a missing field fails that check rather than every check that sees it.


def _classes_by_type(union: object) -> dict[str, type[BaseModel]]:
    """{"message_start": RawMessageStartEvent, ...} for a union of models told apart by `type`."""
    args = typing.get_args(union)
    if typing.get_origin(union) is typing.Annotated:
        args = typing.get_args(args[0])
    classes = {}
    for cls in args:
        for literal in typing.get_args(cls.model_fields["type"].annotation):
            classes[literal] = cls
    return classes


ANTHROPIC_EVENTS = _classes_by_type(anthropic.types.RawMessageStreamEvent)
RESPONSES_EVENTS = _classes_by_type(openai.types.responses.ResponseStreamEvent)
RESPONSES_OUTPUT_ITEMS = _classes_by_type(openai.types.responses.ResponseOutputItem)
# Input items: "message" is ResponseInputMessageItem for user/system/developer messages and
# ResponseOutputMessage for the assistant's.
RESPONSES_INPUT_ITEMS = _classes_by_type(openai.types.responses.ResponseItem)


def conform(ctx: Context, api: str, cls: type[BaseModel], raw: object, what: str) -> None:
    ctx.shapes_seen[api] += 1
    try:
        cls.model_validate(raw)
    except pydantic.ValidationError as e:
        for error in e.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(top)"
            ctx.shape_problems[api].setdefault(f"{cls.__name__}.{where}: {error['msg']}", f"{what}: {short(raw, 500)}")


def conform_typed(ctx: Context, api: str, classes: dict[str, type[BaseModel]], raw: object, what: str) -> None:
    """conform() for a member of a union told apart by `type`; an unknown type fails at once."""
    expect(isinstance(raw, dict) and isinstance(raw.get("type"), str), f"{what} has no type: {short(raw)}")
    cls = classes.get(raw["type"])
    expect(cls is not None, f"{what} has an unknown type {raw['type']!r}: {short(raw)}")
    conform(ctx, api, cls, raw, f"{what} {raw['type']}")


def report_shapes(ctx: Context, apis: tuple[str, ...]) -> str:
    problems = {f"{api}: {k}": v for api in apis for k, v in ctx.shape_problems[api].items()}
    seen = sum(ctx.shapes_seen[api] for api in apis)
    if problems:
        for problem, example in problems.items():
            print(f"  shape: {problem}\n    first seen in {example}", file=sys.stderr)
        raise CheckFailed(
            f"{len(problems)} difference(s) from the SDK types in {seen} bodies/events (details on stderr): "
            + "; ".join(problems)
        )
    return f"{seen} bodies and events conform to the SDK types"


# --- Raw HTTP (for what the SDKs hide: error envelopes, SSE framing, ping events) -------------


def anthropic_headers(ctx: Context, api_key: str | None = None) -> dict[str, str]:
    """The headers Anthropic's API documents (x-api-key, not Authorization)."""
    return {"x-api-key": api_key or ctx.api_key, "anthropic-version": ANTHROPIC_VERSION}


def raw_post(ctx: Context, path: str, body: dict, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(ctx.root + path, json=body, headers=headers, timeout=ctx.timeout)


def raw_sse(ctx: Context, path: str, body: dict, headers: dict[str, str]) -> list[tuple[str | None, dict]]:
    """POSTs and reads a server-sent event stream: a list of (event name, parsed data)."""
    frames: list[tuple[str | None, str]] = []
    with httpx.stream("POST", ctx.root + path, json=body, headers=headers, timeout=ctx.timeout) as r:
        if r.status_code != 200:
            r.read()
            raise CheckFailed(f"POST {path} (stream) answered {r.status_code}: {short(r.text)}")
        content_type = r.headers.get("content-type", "")
        expect(content_type.startswith("text/event-stream"), f"content-type {content_type!r}, not text/event-stream")
        event: str | None = None
        data: list[str] = []
        for line in r.iter_lines():
            if line == "":
                if data:
                    frames.append((event, "\n".join(data)))
                event, data = None, []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        if data:
            frames.append((event, "\n".join(data)))
    parsed = []
    for event, text in frames:
        if text == "[DONE]":
            continue
        value = loads_json(text, f"the data of SSE event {event!r}")
        expect(isinstance(value, dict), f"SSE data is not an object: {short(text)}")
        parsed.append((event, value))
    return parsed


# --- Anthropic Messages -----------------------------------------------------------------------

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30, "description": "The city's name"}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 30, "description": "An IANA timezone"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA},
    {"name": "get_time", "description": "Current time in a timezone", "input_schema": TIME_SCHEMA},
]
ANTHROPIC_SCHEMAS = {tool["name"]: tool["input_schema"] for tool in ANTHROPIC_TOOLS}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
LONG_SYSTEM = (
    "You are a weather assistant. You answer questions about the weather in the cities of the world, "
    "briefly and politely, in plain English, and you say so when you do not know."
)


def message_text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def tool_uses(message: Any) -> list:
    return [block for block in message.content if block.type == "tool_use"]


# This SDK's messages.create has no sampling parameters; the API takes temperature, so it goes in
# as an extra body field.
GREEDY = {"temperature": 0}


def anthropic_wire(request: dict) -> dict:
    """SDK keyword arguments as the JSON body they send: extra_body merged in."""
    body = {key: value for key, value in request.items() if key != "extra_body"}
    body.update(request.get("extra_body") or {})
    return body


def anthropic_create(ctx: Context, **kwargs: Any) -> Any:
    """messages.create, greedy, with the raw JSON validated against anthropic.types.Message."""
    kwargs.setdefault("model", ctx.model)
    kwargs["extra_body"] = {**GREEDY, **(kwargs.get("extra_body") or {})}
    raw = ctx.anthropic.messages.with_raw_response.create(**kwargs)
    conform(ctx, "anthropic", anthropic.types.Message, raw.http_response.json(), "messages.create")
    return raw.parse()


def input_total(usage: Any) -> int:
    """All of a message's input tokens: Anthropic's input_tokens leaves out those read from or
    written to the prompt cache (this server reports its automatic prefix cache's hits there)."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def check_message(message: Any, ctx: Context, stop_reasons: tuple[str, ...] = ("end_turn", "max_tokens")) -> None:
    expect(message.type == "message", f"type {message.type!r}")
    expect(isinstance(message.id, str) and message.id.startswith("msg_"), f"id {message.id!r} does not start msg_")
    expect(message.role == "assistant", f"role {message.role!r}")
    expect(message.model == ctx.model, f"model {message.model!r}, not the requested {ctx.model!r}")
    expect(message.stop_reason in stop_reasons, f"stop_reason {message.stop_reason!r}, not one of {stop_reasons}")
    if message.stop_reason != "stop_sequence":
        expect(message.stop_sequence is None, f"stop_sequence {message.stop_sequence!r} with {message.stop_reason}")
    usage = message.usage
    for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = getattr(usage, name)
        expect(value is None or (isinstance(value, int) and value >= 0), f"usage.{name} {value!r}")
    expect(isinstance(usage.input_tokens, int) and input_total(usage) > 0, f"no input tokens: {usage}")
    expect(
        isinstance(usage.output_tokens, int) and usage.output_tokens > 0, f"usage.output_tokens {usage.output_tokens!r}"
    )


def check_text_message(message: Any, ctx: Context) -> str:
    check_message(message, ctx)
    expect(message.content, "no content blocks")
    first = message.content[0]
    expect(first.type == "text", f"content[0] is {first.type!r}, not text: {message.content}")
    expect(isinstance(first.text, str) and first.text, f"content[0].text is {first.text!r}")
    expect(not tool_uses(message), f"tool_use blocks in a message without tools: {message.content}")
    return first.text


def anthropic_create_plain(ctx: Context) -> str:
    messages = [{"role": "user", "content": "Say hello in one short sentence."}]
    plain = anthropic_create(ctx, max_tokens=60, messages=messages)
    text = check_text_message(plain, ctx)
    system = "You are a friendly assistant."
    with_string = anthropic_create(ctx, max_tokens=60, messages=messages, system=system)
    check_text_message(with_string, ctx)
    with_blocks = anthropic_create(ctx, max_tokens=60, messages=messages, system=[{"type": "text", "text": system}])
    check_text_message(with_blocks, ctx)
    expect(
        input_total(with_blocks.usage) == input_total(with_string.usage),
        f"system as one text block gives {input_total(with_blocks.usage)} input tokens, as a string "
        f"{input_total(with_string.usage)}",
    )
    return (
        f"{plain.id} {plain.stop_reason} in={input_total(plain.usage)} out={plain.usage.output_tokens} "
        f"(system: in={input_total(with_string.usage)}, {with_string.usage.cache_read_input_tokens} from the cache): "
        f"{short(text, 60)!r}"
    )


def anthropic_max_tokens(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=3, messages=[{"role": "user", "content": "Write a long story about a dragon."}]
    )
    check_message(message, ctx, ("max_tokens",))
    expect(message.usage.output_tokens == 3, f"usage.output_tokens {message.usage.output_tokens}, not 3")
    return f"max_tokens, 3 tokens: {message_text(message)!r}"


def anthropic_stop_sequences(ctx: Context) -> str:
    messages = [{"role": "user", "content": "Name three colors."}]
    greedy = anthropic_create(ctx, max_tokens=60, messages=messages)
    text = message_text(greedy)
    # A word that first occurs after the start, so that there is text before the stop.
    words = [m for m in re.finditer(r"[A-Za-z]{4,}", text) if m.start() > 0 and text.index(m.group()) == m.start()]
    expect(words, f"no word to stop at in the greedy answer {text!r}")
    stop = words[min(1, len(words) - 1)].group()
    stopped = anthropic_create(ctx, max_tokens=60, messages=messages, stop_sequences=["@@@", stop])
    check_message(stopped, ctx, ("stop_sequence",))
    expect(stopped.stop_sequence == stop, f"stop_sequence {stopped.stop_sequence!r}, not {stop!r}")
    got = message_text(stopped)
    expect(stop not in got, f"the text holds the stop sequence {stop!r}: {got!r}")
    expect(text.startswith(got), f"the stopped text {got!r} is not a prefix of the greedy answer {text!r}")
    return f"stopped at {stop!r}: {got!r}"


def check_anthropic_event_order(ctx: Context, events: list[tuple[str | None, dict]]) -> int:
    """message_start, (content_block_start, content_block_delta*, content_block_stop)+, message_delta,
    message_stop, with ping anywhere; SSE event names equal to the data's type. Returns the number of
    content blocks."""
    for name, data in events:
        expect(name == data.get("type"), f"SSE event name {name!r} but data type {data.get('type')!r}")
        if data["type"] != "ping":
            conform_typed(ctx, "anthropic", ANTHROPIC_EVENTS, data, "stream event")
    kinds = [data["type"] for _, data in events if data["type"] != "ping"]
    order = " ".join(kinds)
    expect(len(kinds) >= 5, f"too few events: {order}")
    expect(kinds[0] == "message_start", f"the first event is {kinds[0]}: {order}")
    expect(kinds[-2:] == ["message_delta", "message_stop"], f"the stream does not end message_delta message_stop: {order}")
    body = [data for _, data in events if data["type"] != "ping"][1:-2]
    i = blocks = 0
    while i < len(body):
        expect(body[i]["type"] == "content_block_start", f"{body[i]['type']} where a content_block_start belongs: {order}")
        expect(body[i]["index"] == blocks, f"content_block_start index {body[i]['index']}, not {blocks}")
        i += 1
        while i < len(body) and body[i]["type"] == "content_block_delta":
            expect(body[i]["index"] == blocks, f"content_block_delta index {body[i]['index']} in block {blocks}")
            i += 1
        expect(i < len(body) and body[i]["type"] == "content_block_stop", f"block {blocks} does not end: {order}")
        expect(body[i]["index"] == blocks, f"content_block_stop index {body[i]['index']}, not {blocks}")
        i += 1
        blocks += 1
    expect(blocks >= 1, f"no content blocks: {order}")
    start = events[[d["type"] for _, d in events].index("message_start")][1]["message"]
    expect(start.get("content") == [], f"message_start's message has content {start.get('content')!r}, not []")
    expect(start.get("stop_reason") is None, f"message_start's stop_reason is {start.get('stop_reason')!r}")
    delta = [data for _, data in events if data["type"] == "message_delta"][0]
    expect(delta["delta"].get("stop_reason"), f"message_delta has no stop_reason: {delta}")
    output_tokens = delta.get("usage", {}).get("output_tokens")
    expect(isinstance(output_tokens, int) and output_tokens > 0, f"message_delta usage.output_tokens {output_tokens!r}")
    return blocks


def anthropic_stream(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "max_tokens": 60,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    with ctx.anthropic.messages.stream(**request) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check_message(final, ctx)
    expect(streamed, "the text stream is empty")
    expect(message_text(final) == streamed, f"final text {message_text(final)!r} != streamed {streamed!r}")
    whole = anthropic_create(ctx, **request)
    expect(message_text(whole) == streamed, f"non-streamed {message_text(whole)!r} != streamed {streamed!r}")
    expect(whole.stop_reason == final.stop_reason, f"stop_reason {whole.stop_reason!r} whole, {final.stop_reason!r} streamed")
    expect(
        whole.usage.output_tokens == final.usage.output_tokens,
        f"output_tokens {whole.usage.output_tokens} whole, {final.usage.output_tokens} streamed",
    )
    # The SDK's own event objects (it drops ping and unnamed events).
    sdk_kinds = [event.type for event in ctx.anthropic.messages.create(**request, stream=True)]
    expect(sdk_kinds[0] == "message_start" and sdk_kinds[-1] == "message_stop", f"SDK saw {sdk_kinds}")
    # The raw stream, pings and SSE framing included.
    events = raw_sse(ctx, "/v1/messages", {**anthropic_wire(request), "stream": True}, anthropic_headers(ctx))
    blocks = check_anthropic_event_order(ctx, events)
    raw_text = "".join(
        d["delta"]["text"] for _, d in events if d["type"] == "content_block_delta" and d["delta"]["type"] == "text_delta"
    )
    expect(raw_text == streamed, f"raw stream text {raw_text!r} != SDK stream {streamed!r}")
    pings = sum(1 for _, d in events if d["type"] == "ping")
    return f"{len(events)} events ({pings} ping, {blocks} block), {final.stop_reason}: {short(streamed, 60)!r}"


def check_tool_use_block(block: Any, names: tuple[str, ...]) -> dict:
    expect(isinstance(block.id, str) and block.id.startswith("toolu_"), f"tool_use id {block.id!r} does not start toolu_")
    expect(block.name in names, f"tool_use name {block.name!r}, not one of {names}")
    expect(isinstance(block.input, dict), f"tool_use input is {type(block.input).__name__}, not an object: {block.input!r}")
    validate(block.input, ANTHROPIC_SCHEMAS[block.name], f"{block.name} input")
    return block.input


def check_forced_tool_use(ctx: Context, message: Any, names: tuple[str, ...]) -> list:
    check_message(message, ctx, ("tool_use",))
    calls = tool_uses(message)
    expect(calls, f"stop_reason tool_use but no tool_use block: {message.content}")
    for block in calls:
        check_tool_use_block(block, names)
    ids = [block.id for block in calls]
    expect(len(set(ids)) == len(ids), f"tool_use ids repeat: {ids}")
    return calls


def describe_calls(calls: list) -> str:
    return ", ".join(f"{block.id} {block.name}({json.dumps(block.input)})" for block in calls)


def anthropic_tool_any(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=MAX_TOKENS, messages=WEATHER_QUESTION, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}
    )
    return describe_calls(check_forced_tool_use(ctx, message, ("get_weather", "get_time")))


def anthropic_tool_named(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=MAX_TOKENS, messages=WEATHER_QUESTION, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    calls = check_forced_tool_use(ctx, message, ("get_weather",))
    return describe_calls(calls)


def anthropic_tool_auto(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=MAX_TOKENS, messages=WEATHER_QUESTION, tools=ANTHROPIC_TOOLS, tool_choice={"type": "auto"}
    )
    check_message(message, ctx, ("end_turn", "max_tokens", "tool_use"))
    calls = tool_uses(message)
    if message.stop_reason == "tool_use":
        expect(calls, f"stop_reason tool_use but no tool_use block: {message.content}")
        for block in calls:
            check_tool_use_block(block, ("get_weather", "get_time"))
        return f"called: {describe_calls(calls)}"
    expect(not calls, f"tool_use blocks with stop_reason {message.stop_reason}: {message.content}")
    expect(message_text(message), f"neither text nor a tool call: {message.content}")
    return f"answered: {short(message_text(message), 60)!r}"


def anthropic_tool_none(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=60, messages=WEATHER_QUESTION, tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"}
    )
    text = check_text_message(message, ctx)
    return f"{message.stop_reason}: {short(text, 60)!r}"


def anthropic_tool_no_parallel(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": "What is the weather in Paris, in London and in Rome?"}],
        tools=ANTHROPIC_TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    calls = check_forced_tool_use(ctx, message, ("get_weather", "get_time"))
    expect(len(calls) == 1, f"{len(calls)} tool_use blocks with disable_parallel_tool_use: {describe_calls(calls)}")
    return describe_calls(calls)


def anthropic_tool_round_trip(ctx: Context) -> str:
    first = anthropic_create(
        ctx, max_tokens=MAX_TOKENS, messages=WEATHER_QUESTION, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    call = check_forced_tool_use(ctx, first, ("get_weather",))[0]
    history = [*WEATHER_QUESTION, {"role": "assistant", "content": first.content}]
    answers = []
    # The result as a string (the model may call again: tool_choice auto), then as text blocks
    # with is_error (tool_choice none: it answers in text).
    for result, choice in (
        ({"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny"}, "auto"),
        (
            {
                "type": "tool_result", "tool_use_id": call.id, "is_error": True,
                "content": [{"type": "text", "text": "The weather service is down."}],
            },
            "none",
        ),
    ):
        second = anthropic_create(
            ctx, max_tokens=60, tools=ANTHROPIC_TOOLS, tool_choice={"type": choice},
            messages=[*history, {"role": "user", "content": [result]}],
        )
        if choice == "none":
            check_text_message(second, ctx)
        else:
            check_message(second, ctx, ("end_turn", "max_tokens", "tool_use"))
        answers.append(f"{choice}: {second.stop_reason} {short(message_text(second), 40)!r}")
    return f"{call.id}: {'; '.join(answers)}"


def anthropic_stream_tool_use(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "max_tokens": MAX_TOKENS,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    with ctx.anthropic.messages.stream(**request) as stream:
        input_json_events = sum(1 for event in stream if event.type == "input_json")
        final = stream.get_final_message()
    streamed_calls = check_forced_tool_use(ctx, final, ("get_weather",))
    whole_calls = check_forced_tool_use(ctx, anthropic_create(ctx, **request), ("get_weather",))
    streamed_inputs = [block.input for block in streamed_calls]
    whole_inputs = [block.input for block in whole_calls]
    expect(streamed_inputs == whole_inputs, f"streamed inputs {streamed_inputs} != non-streamed {whole_inputs}")
    expect(input_json_events >= 1, "the stream helper saw no input_json events")

    events = raw_sse(ctx, "/v1/messages", {**anthropic_wire(request), "stream": True}, anthropic_headers(ctx))
    check_anthropic_event_order(ctx, events)
    starts = [d for _, d in events if d["type"] == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    expect(starts, "no content_block_start of a tool_use block")
    block = starts[0]["content_block"]
    expect(str(block.get("id", "")).startswith("toolu_") and block.get("name") == "get_weather", f"tool_use start {block}")
    expect(block.get("input") == {}, f"the tool_use block starts with input {block.get('input')!r}, not {{}}")
    index = starts[0]["index"]
    pieces = [
        d["delta"]["partial_json"] for _, d in events
        if d["type"] == "content_block_delta" and d["index"] == index and d["delta"]["type"] == "input_json_delta"
    ]
    expect(pieces, "no input_json_delta events")
    expect(all(isinstance(p, str) for p in pieces), f"partial_json pieces are not all strings: {pieces}")
    joined = loads_json("".join(pieces), "the joined partial_json")
    expect(joined == whole_inputs[0], f"the joined partial_json {joined} != the non-streamed input {whole_inputs[0]}")
    stop = [d for _, d in events if d["type"] == "message_delta"][0]["delta"]["stop_reason"]
    expect(stop == "tool_use", f"message_delta stop_reason {stop!r}")
    return f"{len(pieces)} input_json_delta pieces -> get_weather({json.dumps(joined)})"


def anthropic_count_tokens(ctx: Context) -> str:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    def count(**kwargs: Any) -> int:
        raw = ctx.anthropic.messages.with_raw_response.count_tokens(model=ctx.model, messages=messages, **kwargs)
        body = raw.http_response.json()
        conform(ctx, "anthropic", anthropic.types.MessageTokensCount, body, "count_tokens")
        n = raw.parse().input_tokens
        expect(isinstance(n, int) and n > 0, f"input_tokens {n!r}")
        return n

    base = count()
    # Longer than the default system prompt SmolLM2's template puts in when there is none.
    with_system = count(system=LONG_SYSTEM)
    with_tools = count(tools=ANTHROPIC_TOOLS)
    expect(with_system > base, f"a system prompt did not raise the count: {with_system} vs {base}")
    expect(with_tools > base, f"tools did not raise the count: {with_tools} vs {base}")
    created = anthropic_create(ctx, max_tokens=5, messages=messages)
    return f"{base}, with system {with_system}, with tools {with_tools} (create's usage: {input_total(created.usage)})"


def anthropic_error(e: anthropic.APIStatusError, error_type: str, *, naming: str | None = None) -> str:
    """The body of an Anthropic error: {"type": "error", "error": {"type": ..., "message": ...}}."""
    body = e.body
    expect(isinstance(body, dict), f"the error body is not an object: {body!r}")
    expect(body.get("type") == "error", f"the error body's type is {body.get('type')!r}, not 'error': {body}")
    error = body.get("error")
    expect(isinstance(error, dict), f"no error object: {body}")
    expect(error.get("type") == error_type, f"error.type {error.get('type')!r}, not {error_type!r}: {body}")
    message = error.get("message")
    expect(isinstance(message, str) and message, f"error.message {message!r}")
    if naming is not None:
        expect(naming in message, f"the message does not name {naming!r}: {message!r}")
    return f"{e.status_code} {error_type}: {message}"


def expect_anthropic_error(
    call: Callable[[], object], exc: type[anthropic.APIStatusError], error_type: str, naming: str | None = None
) -> str:
    try:
        result = call()
    except exc as e:
        return anthropic_error(e, error_type, naming=naming)
    except anthropic.APIStatusError as e:
        raise CheckFailed(f"{type(e).__name__} ({e.status_code}), not {exc.__name__}: {e.body}") from None
    raise CheckFailed(f"no error: the server answered {short(result)}")


def anthropic_error_unknown_field(ctx: Context) -> str:
    return expect_anthropic_error(
        lambda: ctx.anthropic.messages.create(
            model=ctx.model, max_tokens=5, messages=[{"role": "user", "content": "hi"}], extra_body={"bogus_field": 1}
        ),
        anthropic.BadRequestError, "invalid_request_error", "bogus_field",
    )


def anthropic_error_image(ctx: Context) -> str:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_1X1}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    return expect_anthropic_error(
        lambda: ctx.anthropic.messages.create(
            model=ctx.model, max_tokens=5, messages=[{"role": "user", "content": content}]
        ),
        anthropic.BadRequestError, "invalid_request_error", "image",
    )


def anthropic_error_orphan_tool_result(ctx: Context) -> str:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "Let me look."},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01NoSuchCall", "content": "18 degrees"}],
        },
    ]
    return expect_anthropic_error(
        lambda: ctx.anthropic.messages.create(
            model=ctx.model, max_tokens=5, messages=messages, tools=ANTHROPIC_TOOLS
        ),
        anthropic.BadRequestError, "invalid_request_error",
    )


def anthropic_error_missing_max_tokens(ctx: Context) -> str:
    body = {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}]}
    # Through the SDK's low-level post (messages.create will not send without max_tokens)...
    detail = expect_anthropic_error(
        lambda: ctx.anthropic.post("/v1/messages", body=body, cast_to=object),
        anthropic.BadRequestError, "invalid_request_error", "max_tokens",
    )
    # ...and raw, with the documented x-api-key header.
    response = raw_post(ctx, "/v1/messages", body, anthropic_headers(ctx))
    expect(response.status_code == 400, f"raw: status {response.status_code}: {short(response.text)}")
    return detail


def anthropic_error_auth(ctx: Context) -> str:
    client = anthropic.Anthropic(
        base_url=ctx.root, api_key=ctx.api_key + "-wrong", max_retries=0, timeout=ctx.timeout
    )
    return expect_anthropic_error(
        lambda: client.messages.create(model=ctx.model, max_tokens=5, messages=[{"role": "user", "content": "hi"}]),
        anthropic.AuthenticationError, "authentication_error",
    )


def anthropic_error_unknown_model(ctx: Context) -> str:
    return expect_anthropic_error(
        lambda: ctx.anthropic.messages.create(
            model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        ),
        anthropic.NotFoundError, "not_found_error",
    )


def anthropic_error_raw_shape(ctx: Context) -> str:
    """The raw error envelope, and the documented x-api-key header (the SDK sends Authorization)."""
    ok = raw_post(
        ctx, "/v1/messages",
        {"model": ctx.model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        anthropic_headers(ctx),
    )
    expect(ok.status_code == 200, f"x-api-key auth: status {ok.status_code}: {short(ok.text)}")
    conform(ctx, "anthropic", anthropic.types.Message, ok.json(), "the x-api-key response")
    cases = [
        ({"model": ctx.model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}], "bogus_field": 1},
         anthropic_headers(ctx), 400, "invalid_request_error"),
        ({"model": ctx.model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
         anthropic_headers(ctx, ctx.api_key + "-wrong"), 401, "authentication_error"),
        ({"model": "no-such-model", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
         anthropic_headers(ctx), 404, "not_found_error"),
        ("{not json", anthropic_headers(ctx), 400, "invalid_request_error"),
    ]
    seen = []
    for body, headers, status, error_type in cases:
        if isinstance(body, str):
            response = httpx.post(
                ctx.root + "/v1/messages", content=body, timeout=ctx.timeout,
                headers={**headers, "content-type": "application/json"},
            )
        else:
            response = raw_post(ctx, "/v1/messages", body, headers)
        what = f"{status} case"
        expect(response.status_code == status, f"{what}: status {response.status_code}: {short(response.text)}")
        content_type = response.headers.get("content-type", "")
        expect(content_type.startswith("application/json"), f"{what}: content-type {content_type!r}")
        value = loads_json(response.text, f"{what}: the body")
        expect(isinstance(value, dict), f"{what}: the body is not an object: {response.text}")
        expect(set(value) - {"request_id"} == {"type", "error"}, f"{what}: keys {sorted(value)}: {response.text}")
        expect(value["type"] == "error", f"{what}: type {value['type']!r}")
        error = value["error"]
        expect(isinstance(error, dict) and set(error) >= {"type", "message"}, f"{what}: error {error!r}")
        expect(error["type"] == error_type, f"{what}: error.type {error['type']!r}, not {error_type!r}")
        expect(isinstance(error["message"], str) and error["message"], f"{what}: error.message {error['message']!r}")
        seen.append(f"{status} {error_type}")
    return ", ".join(seen)


def anthropic_shapes(ctx: Context) -> str:
    """The differences from the SDK's types that the checks before recorded (run alone, it makes
    requests of each kind itself)."""
    if ctx.shapes_seen["anthropic"] == 0:
        forced = {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}}
        for extra in ({}, forced):
            anthropic_create(ctx, max_tokens=MAX_TOKENS, messages=WEATHER_QUESTION, **extra)
            body = {"model": ctx.model, "max_tokens": MAX_TOKENS, **GREEDY, "messages": WEATHER_QUESTION, **extra}
            check_anthropic_event_order(ctx, raw_sse(ctx, "/v1/messages", {**body, "stream": True}, anthropic_headers(ctx)))
        raw = ctx.anthropic.messages.with_raw_response.count_tokens(model=ctx.model, messages=WEATHER_QUESTION)
        conform(ctx, "anthropic", anthropic.types.MessageTokensCount, raw.http_response.json(), "count_tokens")
    return report_shapes(ctx, ("anthropic",))


# --- OpenAI Responses -------------------------------------------------------------------------

RESPONSES_WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30, "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": RESPONSES_WEATHER_SCHEMA,
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": TIME_SCHEMA,
        "strict": True,
    },
]
RESPONSES_SCHEMAS = {tool["name"]: tool["parameters"] for tool in RESPONSES_TOOLS}


def responses_create(ctx: Context, **kwargs: Any) -> Any:
    """responses.create, with the raw JSON validated against openai.types.responses.Response."""
    kwargs.setdefault("model", ctx.model)
    kwargs.setdefault("temperature", 0)
    raw = ctx.openai.responses.with_raw_response.create(**kwargs)
    body = raw.http_response.json()
    conform(ctx, "responses", openai.types.responses.Response, body, "responses.create")
    for i, item in enumerate(body.get("output", [])):
        conform_typed(ctx, "responses", RESPONSES_OUTPUT_ITEMS, item, f"output[{i}]")
    return raw.parse()


def messages_of(response: Any) -> list:
    return [item for item in response.output if item.type == "message"]


def calls_of(response: Any) -> list:
    return [item for item in response.output if item.type == "function_call"]


def conform_input_items(ctx: Context, response_id: str) -> list[dict]:
    """Lists a stored response's input items (order=asc) and validates each against the SDK's
    item types; returns the raw items."""
    body = ctx.openai.responses.input_items.with_raw_response.list(response_id, order="asc").http_response.json()
    expect(body.get("object") == "list", f"input_items object {body.get('object')!r}")
    expect(isinstance(body.get("data"), list), f"input_items data {body.get('data')!r}")
    for i, item in enumerate(body["data"]):
        what = f"input_items data[{i}]"
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") != "assistant":
            conform(ctx, "responses", openai.types.responses.ResponseInputMessageItem, item, what)
        else:
            conform_typed(ctx, "responses", RESPONSES_INPUT_ITEMS, item, what)
    return body["data"]


def check_response(response: Any, ctx: Context, status: str = "completed") -> None:
    expect(response.object == "response", f"object {response.object!r}")
    expect(isinstance(response.id, str) and response.id.startswith("resp_"), f"id {response.id!r} does not start resp_")
    expect(response.status == status, f"status {response.status!r}, not {status!r} ({response.incomplete_details})")
    expect(response.model == ctx.model, f"model {response.model!r}, not the requested {ctx.model!r}")
    expect(isinstance(response.created_at, (int, float)) and response.created_at > 0, f"created_at {response.created_at!r}")
    usage = response.usage
    expect(usage is not None, "no usage")
    expect(isinstance(usage.input_tokens, int) and usage.input_tokens > 0, f"usage.input_tokens {usage.input_tokens!r}")
    expect(isinstance(usage.output_tokens, int) and usage.output_tokens > 0, f"usage.output_tokens {usage.output_tokens!r}")
    expect(
        usage.total_tokens == usage.input_tokens + usage.output_tokens,
        f"usage.total_tokens {usage.total_tokens} != {usage.input_tokens} + {usage.output_tokens}",
    )
    cached = usage.input_tokens_details.cached_tokens
    expect(isinstance(cached, int) and cached >= 0, f"usage.input_tokens_details.cached_tokens {cached!r}")
    reasoning = usage.output_tokens_details.reasoning_tokens
    expect(isinstance(reasoning, int) and reasoning >= 0, f"usage.output_tokens_details.reasoning_tokens {reasoning!r}")
    ids = [item.id for item in response.output if getattr(item, "id", None) is not None]
    expect(len(set(ids)) == len(ids), f"output item ids repeat: {ids}")


def check_message_response(response: Any, ctx: Context, *, allow_cut: bool = False) -> str:
    """A response with a message; allow_cut: or one cut short by max_output_tokens (the model
    rambles), then incomplete."""
    cut = allow_cut and response.status == "incomplete"
    if cut:
        reason = response.incomplete_details.reason if response.incomplete_details else None
        expect(reason == "max_output_tokens", f"incomplete_details {response.incomplete_details!r}")
    check_response(response, ctx, status="incomplete" if cut else "completed")
    messages = messages_of(response)
    expect(messages, f"no message in output: {[item.type for item in response.output]}")
    expect(not calls_of(response), f"function calls in the output: {response.output}")
    message = messages[-1]
    expect(message.role == "assistant", f"message role {message.role!r}")
    expect(message.status == response.status, f"message status {message.status!r} in a {response.status} response")
    expect(isinstance(message.id, str) and message.id, f"message id {message.id!r}")
    texts = [part for part in message.content if part.type == "output_text"]
    expect(texts, f"no output_text in the message: {message.content}")
    expect(response.output_text, "output_text is empty")
    expect(
        response.output_text == "".join(part.text for part in texts),
        f"output_text {response.output_text!r} is not the message's output_text parts",
    )
    return response.output_text


def responses_create_plain(ctx: Context) -> str:
    response = responses_create(
        ctx, input="Say hello in one short sentence.", instructions="You are a friendly assistant.",
        max_output_tokens=60,
    )
    text = check_message_response(response, ctx)
    expect(response.instructions == "You are a friendly assistant.", f"instructions echoed as {response.instructions!r}")
    u = response.usage
    return (
        f"{response.id} in={u.input_tokens} (cached {u.input_tokens_details.cached_tokens}) out={u.output_tokens} "
        f"(reasoning {u.output_tokens_details.reasoning_tokens}): {short(text, 60)!r}"
    )


def responses_create_items(ctx: Context) -> str:
    response = responses_create(
        ctx, max_output_tokens=60,
        input=[
            {"role": "system", "content": "You are a friendly assistant."},
            {"role": "developer", "content": "Answer in one short sentence."},
            {"role": "user", "content": "Hi!"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello! How can I help?"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is two plus two?"}]},
        ],
    )
    text = check_message_response(response, ctx)
    items = conform_input_items(ctx, response.id)
    kinds = [(item.get("type"), item.get("role")) for item in items]
    expected = [("message", role) for role in ("system", "developer", "user", "assistant", "user")]
    expect(kinds == expected, f"input items {kinds}, not {expected}")
    return f"in={response.usage.input_tokens}: {short(text, 60)!r}"


def responses_incomplete(ctx: Context) -> str:
    response = responses_create(ctx, input="Write a long story about a dragon.", max_output_tokens=16)
    check_response(response, ctx, status="incomplete")
    details = response.incomplete_details
    expect(details is not None and details.reason == "max_output_tokens", f"incomplete_details {details!r}")
    expect(response.usage.output_tokens == 16, f"usage.output_tokens {response.usage.output_tokens}, not 16")
    messages = messages_of(response)
    expect(messages and response.output_text, f"no partial text: {response.output}")
    expect(messages[-1].status == "incomplete", f"the cut message's status is {messages[-1].status!r}, not incomplete")
    return f"incomplete (max_output_tokens): {response.output_text!r}"


def check_responses_events(ctx: Context, events: list[tuple[str | None, dict]]) -> list[str]:
    """Raw Responses stream events: typed, named as their type, sequence numbers increasing, created
    and in_progress first, a terminal event last. Returns the event types."""
    kinds = []
    last_seq = -1
    for name, data in events:
        conform_typed(ctx, "responses", RESPONSES_EVENTS, data, "stream event")
        expect(name is None or name == data["type"], f"SSE event name {name!r} but data type {data['type']!r}")
        seq = data["sequence_number"]
        expect(isinstance(seq, int) and seq > last_seq, f"sequence_number {seq!r} after {last_seq} ({data['type']})")
        last_seq = seq
        kinds.append(data["type"])
    expect(kinds[:2] == ["response.created", "response.in_progress"], f"the stream starts {kinds[:2]}")
    expect(kinds[-1] in ("response.completed", "response.incomplete"), f"the stream ends with {kinds[-1]}")
    expect(
        sum(k in ("response.completed", "response.incomplete", "response.failed") for k in kinds) == 1,
        f"not one terminal event: {kinds}",
    )
    return kinds


def responses_stream(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "input": "What is the capital of France?",
        "max_output_tokens": 60,
        "temperature": 0,
    }
    with ctx.openai.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_message_response(final, ctx)
    kinds = [event.type for event in events]
    expect(kinds[:2] == ["response.created", "response.in_progress"], f"the stream starts {kinds[:2]}")
    expect(kinds[-1] == "response.completed", f"the stream ends with {kinds[-1]}")
    seqs = [event.sequence_number for event in events]
    expect(all(b > a for a, b in zip(seqs, seqs[1:])), f"sequence numbers do not increase: {seqs}")
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    expect(deltas == final.output_text, f"deltas {deltas!r} != final output_text {final.output_text!r}")
    dones = [event.text for event in events if event.type == "response.output_text.done"]
    expect(dones == [deltas], f"output_text.done {dones} != the deltas {deltas!r}")
    whole = responses_create(ctx, **request)
    expect(whole.output_text == deltas, f"non-streamed {whole.output_text!r} != streamed {deltas!r}")
    expect(
        whole.usage.output_tokens == final.usage.output_tokens,
        f"output_tokens {whole.usage.output_tokens} whole, {final.usage.output_tokens} streamed",
    )

    raw = raw_sse(ctx, "/v1/responses", {**request, "stream": True}, {"authorization": f"Bearer {ctx.api_key}"})
    raw_kinds = check_responses_events(ctx, raw)
    expected = [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
    ]
    positions = [raw_kinds.index(k) if k in raw_kinds else -1 for k in expected]
    expect(-1 not in positions and positions == sorted(positions), f"message events out of order: {raw_kinds}")
    created = raw[0][1]["response"]
    expect(created.get("status") in ("in_progress", "queued"), f"response.created has status {created.get('status')!r}")
    completed = raw[-1][1]["response"]
    expect(completed.get("status") == "completed", f"the completed event's status {completed.get('status')!r}")
    return f"{len(events)} events, seq {seqs[0]}..{seqs[-1]}: {short(deltas, 60)!r}"


def check_function_calls(response: Any, ctx: Context, names: tuple[str, ...]) -> list:
    check_response(response, ctx)
    calls = calls_of(response)
    expect(calls, f"no function_call in output: {response.output}")
    for call in calls:
        expect(isinstance(call.call_id, str) and call.call_id, f"call_id {call.call_id!r}")
        expect(isinstance(call.id, str) and call.id, f"function_call id {call.id!r}")
        expect(call.name in names, f"called {call.name!r}, not one of {names}")
        expect(call.status in (None, "completed"), f"function_call status {call.status!r}")
        args = loads_json(call.arguments, f"{call.name} arguments")
        expect(isinstance(args, dict), f"{call.name} arguments are not an object: {call.arguments!r}")
        validate(args, RESPONSES_SCHEMAS[call.name], f"{call.name} arguments")
    call_ids = [call.call_id for call in calls]
    expect(len(set(call_ids)) == len(call_ids), f"call_ids repeat: {call_ids}")
    return calls


def describe_function_calls(calls: list) -> str:
    return ", ".join(f"{call.call_id} {call.name}({call.arguments})" for call in calls)


def responses_function_required(ctx: Context) -> str:
    response = responses_create(
        ctx, input="What is the weather in Paris?", tools=RESPONSES_TOOLS, tool_choice="required",
        max_output_tokens=MAX_TOKENS,
    )
    return describe_function_calls(check_function_calls(response, ctx, ("get_weather", "get_time")))


def responses_function_named(ctx: Context) -> str:
    response = responses_create(
        ctx, input="What is the weather in Paris?", tools=RESPONSES_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=MAX_TOKENS,
    )
    return describe_function_calls(check_function_calls(response, ctx, ("get_weather",)))


def responses_function_none(ctx: Context) -> str:
    response = responses_create(
        ctx, input="What is the weather in Paris?", tools=RESPONSES_TOOLS, tool_choice="none", max_output_tokens=60,
    )
    return f"{response.status}: {short(check_message_response(response, ctx, allow_cut=True), 60)!r}"


def responses_function_no_parallel(ctx: Context) -> str:
    response = responses_create(
        ctx, input="What is the weather in Paris, in London and in Rome?", tools=RESPONSES_TOOLS,
        tool_choice="required", parallel_tool_calls=False, max_output_tokens=MAX_TOKENS,
    )
    calls = check_function_calls(response, ctx, ("get_weather", "get_time"))
    expect(len(calls) == 1, f"{len(calls)} calls with parallel_tool_calls false: {describe_function_calls(calls)}")
    expect(response.parallel_tool_calls is False, f"parallel_tool_calls echoed as {response.parallel_tool_calls!r}")
    return describe_function_calls(calls)


def responses_stream_function_call(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "input": "What is the weather in Oslo?",
        "tools": RESPONSES_TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    with ctx.openai.responses.stream(**request) as stream:
        deltas = [event.delta for event in stream if event.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    streamed = check_function_calls(final, ctx, ("get_weather",))
    whole = check_function_calls(responses_create(ctx, **request), ctx, ("get_weather",))
    streamed_args = [(c.name, json.loads(c.arguments)) for c in streamed]
    whole_args = [(c.name, json.loads(c.arguments)) for c in whole]
    expect(streamed_args == whole_args, f"streamed calls {streamed_args} != non-streamed {whole_args}")
    expect(deltas, "the stream helper saw no function_call_arguments.delta events")
    expect("".join(deltas) == streamed[0].arguments, f"deltas {''.join(deltas)!r} != arguments {streamed[0].arguments!r}")

    raw = raw_sse(ctx, "/v1/responses", {**request, "stream": True}, {"authorization": f"Bearer {ctx.api_key}"})
    kinds = check_responses_events(ctx, raw)
    added = [d["item"] for _, d in raw if d["type"] == "response.output_item.added" and d["item"]["type"] == "function_call"]
    expect(added, f"no output_item.added of a function_call: {kinds}")
    expect(added[0].get("name") == "get_weather" and added[0].get("call_id"), f"the function_call added: {added[0]}")
    done = [d for _, d in raw if d["type"] == "response.function_call_arguments.done"]
    expect(len(done) == 1, f"{len(done)} function_call_arguments.done events: {kinds}")
    expect(
        loads_json(done[0]["arguments"], "function_call_arguments.done arguments") == whole_args[0][1],
        f"function_call_arguments.done {done[0]['arguments']!r} != {whole_args[0][1]}",
    )
    positions = [kinds.index(k) if k in kinds else -1 for k in (
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    )]
    expect(-1 not in positions and positions == sorted(positions), f"function call events out of order: {kinds}")
    return f"{len(deltas)} argument deltas -> {describe_function_calls(streamed)}"


def responses_tool_round_trip(ctx: Context) -> str:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = responses_create(
        ctx, input=question, tools=RESPONSES_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=MAX_TOKENS,
    )
    call = check_function_calls(first, ctx, ("get_weather",))[0]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"}
    # The whole history sent back, items as the server returned them.
    history = [*question, *(item.model_dump(exclude_none=True) for item in first.output), output]
    second = responses_create(ctx, input=history, tools=RESPONSES_TOOLS, max_output_tokens=60)
    check_response(second, ctx)
    kinds = [item.get("type") for item in conform_input_items(ctx, second.id)]
    expected = ["message", *(item.type for item in first.output), "function_call_output"]
    expect(kinds == expected, f"the second response's input items are {kinds}, not {expected}")
    # Only the output, the rest from the stored first response.
    third = responses_create(
        ctx, previous_response_id=first.id, input=[output], tools=RESPONSES_TOOLS, max_output_tokens=60
    )
    check_response(third, ctx)
    expect(third.previous_response_id == first.id, f"previous_response_id echoed as {third.previous_response_id!r}")
    expect(
        third.usage.input_tokens == second.usage.input_tokens,
        f"input_tokens {third.usage.input_tokens} with previous_response_id, {second.usage.input_tokens} with the "
        "history sent in full",
    )
    return (
        f"{call.call_id}: in full -> {[i.type for i in second.output]} {short(second.output_text, 30)!r}; "
        f"by previous_response_id -> {[i.type for i in third.output]} (in={third.usage.input_tokens})"
    )


CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "country"],
    "additionalProperties": False,
}


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def responses_json_schema(ctx: Context) -> str:
    response = responses_create(
        ctx, input="Name a city and its country as JSON.", max_output_tokens=MAX_TOKENS,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY_SCHEMA, "strict": True}},
    )
    text = check_message_response(response, ctx)
    validate(loads_json(text, "output_text"), CITY_SCHEMA, "output_text")
    fmt = response.text.format if response.text is not None else None
    expect(fmt is not None and fmt.type == "json_schema", f"text.format echoed as {fmt!r}")
    parse = getattr(ctx.openai.responses, "parse", None)
    if parse is None:
        return f"{text} (this SDK has no responses.parse)"
    parsed = parse(
        model=ctx.model, input="Name a city and its country.", text_format=City, max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    check_response(parsed, ctx)
    expect(isinstance(parsed.output_parsed, City), f"output_parsed is {type(parsed.output_parsed).__name__}")
    return f"{text}; parse -> {parsed.output_parsed!r}"


def expect_openai_error(call: Callable[[], object], exc: tuple[type[openai.APIStatusError], ...], naming: str | None = None) -> str:
    try:
        result = call()
    except exc as e:
        body = e.body
        # The SDK hands over the "error" object; accept the whole envelope too.
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"]
        expect(isinstance(body, dict), f"the error body is not an object: {body!r}")
        message = body.get("message")
        expect(isinstance(message, str) and message, f"error.message {message!r}: {body}")
        expect(isinstance(body.get("type"), str), f"error.type {body.get('type')!r}: {body}")
        if naming is not None:
            expect(naming in message, f"the message does not name {naming!r}: {message!r}")
        return f"{e.status_code} {type(e).__name__} {body.get('type')} param={body.get('param')!r}: {message}"
    except openai.APIStatusError as e:
        names = "/".join(c.__name__ for c in exc)
        raise CheckFailed(f"{type(e).__name__} ({e.status_code}), not {names}: {e.body}") from None
    raise CheckFailed(f"no error: the server answered {short(result)}")


def responses_store_retrieve(ctx: Context) -> str:
    created = responses_create(
        ctx, max_output_tokens=40,
        input=[
            {"role": "developer", "content": "Answer in one short sentence."},
            {"role": "user", "content": "What color is the sky?"},
        ],
    )
    check_message_response(created, ctx, allow_cut=True)
    expect(created.store in (None, True), f"store echoed as {created.store!r}")
    raw = ctx.openai.responses.with_raw_response.retrieve(created.id)
    conform(ctx, "responses", openai.types.responses.Response, raw.http_response.json(), "responses.retrieve")
    got = raw.parse()
    expect(got.id == created.id, f"retrieved id {got.id!r}")
    expect(got.status == created.status, f"retrieved status {got.status!r}")
    expect(got.output_text == created.output_text, f"retrieved output_text {got.output_text!r} != {created.output_text!r}")
    expect(
        [item.id for item in got.output] == [item.id for item in created.output],
        f"retrieved output ids {[i.id for i in got.output]} != {[i.id for i in created.output]}",
    )
    expect(got.usage == created.usage, f"retrieved usage {got.usage} != {created.usage}")

    conform_input_items(ctx, created.id)
    raw_list = ctx.openai.responses.input_items.with_raw_response.list(created.id, order="asc")
    body = raw_list.http_response.json()
    ascending = list(raw_list.parse())
    roles = [(item.type, getattr(item, "role", None)) for item in ascending]
    expect(roles == [("message", "developer"), ("message", "user")], f"input items (asc) {roles}")
    for item in ascending:
        expect(isinstance(item.content, list), f"an input item's content is not a list of parts: {item.content!r}")
    user_part = ascending[1].content[0]
    expect(
        getattr(user_part, "type", None) == "input_text" and user_part.text == "What color is the sky?",
        f"the user item's content {ascending[1].content}",
    )
    expect(all(isinstance(item.id, str) and item.id for item in ascending), f"input items without ids: {ascending}")
    expect(body.get("has_more") is False, f"has_more {body.get('has_more')!r}")
    descending = list(ctx.openai.responses.input_items.list(created.id))
    expect(
        [item.id for item in descending] == [item.id for item in reversed(ascending)],
        "the default order is not the reverse of order=asc (the API's default is desc)",
    )
    return f"{created.id}: retrieved, input items {[r for _, r in roles]}"


def responses_delete(ctx: Context) -> str:
    created = responses_create(ctx, input="Say hi.", max_output_tokens=20)
    deleted = ctx.openai.responses.with_raw_response.delete(created.id)
    expect(deleted.http_response.status_code == 200, f"delete status {deleted.http_response.status_code}")
    body = deleted.http_response.json()
    expect(
        body.get("id") == created.id and body.get("deleted") is True,
        f"the delete body {body} does not say id {created.id} deleted",
    )
    detail = expect_openai_error(lambda: ctx.openai.responses.retrieve(created.id), (openai.NotFoundError,))
    again = expect_openai_error(lambda: ctx.openai.responses.delete(created.id), (openai.NotFoundError,))
    expect_openai_error(lambda: ctx.openai.responses.input_items.list(created.id), (openai.NotFoundError,))
    return f"deleted {created.id}; retrieve: {detail}; delete again: {again.split(':')[0]}"


def responses_store_false(ctx: Context) -> str:
    created = responses_create(ctx, input="Say hi.", max_output_tokens=20, store=False)
    check_message_response(created, ctx, allow_cut=True)
    expect(created.store is False, f"store echoed as {created.store!r}")
    return expect_openai_error(lambda: ctx.openai.responses.retrieve(created.id), (openai.NotFoundError,))


def responses_previous_response_id(ctx: Context) -> str:
    first = responses_create(ctx, input="My name is Ada.", max_output_tokens=40)
    check_message_response(first, ctx, allow_cut=True)
    second = responses_create(ctx, input="What is my name?", previous_response_id=first.id, max_output_tokens=40)
    check_message_response(second, ctx, allow_cut=True)
    expect(second.previous_response_id == first.id, f"previous_response_id echoed as {second.previous_response_id!r}")
    alone = responses_create(ctx, input="What is my name?", max_output_tokens=40)
    expect(
        second.usage.input_tokens > first.usage.input_tokens,
        f"turn 2 input_tokens {second.usage.input_tokens} <= turn 1's {first.usage.input_tokens}: no history",
    )
    expect(
        second.usage.input_tokens > alone.usage.input_tokens,
        f"turn 2 input_tokens {second.usage.input_tokens} <= the question alone ({alone.usage.input_tokens})",
    )
    unknown = expect_openai_error(
        lambda: ctx.openai.responses.create(
            model=ctx.model, input="Hi", previous_response_id="resp_doesnotexist0000", max_output_tokens=16
        ),
        (openai.NotFoundError, openai.BadRequestError), "resp_doesnotexist0000",
    )
    return (
        f"in {first.usage.input_tokens} -> {second.usage.input_tokens} (alone {alone.usage.input_tokens}): "
        f"{short(second.output_text, 40)!r}; unknown id: {unknown}"
    )


def responses_builtin_tool_ignored(ctx: Context) -> str:
    """A hosted tool is left out (the server runs none; --hosted-tools ignore, the default): the
    response comes with the x-pagoda-ignored-tools header naming it; forcing it is a 400."""
    raw = ctx.openai.responses.with_raw_response.create(
        model=ctx.model, input="Search the web for cats.", tools=[{"type": "web_search"}], max_output_tokens=16,
        temperature=0,
    )
    header = raw.headers.get("x-pagoda-ignored-tools")
    expect(header == "web_search", f"x-pagoda-ignored-tools is {header!r}, not 'web_search'")
    body = raw.http_response.json()
    conform(ctx, "responses", openai.types.responses.Response, body, "responses.create")
    expect(raw.parse().status in ("completed", "incomplete"), f"status {raw.parse().status!r}")
    forced = expect_openai_error(
        lambda: ctx.openai.responses.create(
            model=ctx.model, input="Search the web for cats.", tools=[{"type": "web_search"}],
            tool_choice={"type": "web_search"}, max_output_tokens=16,
        ),
        (openai.BadRequestError,), "web_search",
    )
    return f"header {header!r}; forced: {forced}"


def responses_error_unknown_field(ctx: Context) -> str:
    return expect_openai_error(
        lambda: ctx.openai.responses.create(
            model=ctx.model, input="Hi", max_output_tokens=16, extra_body={"bogus_field": 1}
        ),
        (openai.BadRequestError,), "bogus_field",
    )


def responses_error_orphan_output(ctx: Context) -> str:
    return expect_openai_error(
        lambda: ctx.openai.responses.create(
            model=ctx.model, max_output_tokens=16, tools=RESPONSES_TOOLS,
            input=[
                {"role": "user", "content": "What is the weather in Paris?"},
                {"type": "function_call_output", "call_id": "call_nosuchcall", "output": "18 degrees"},
            ],
        ),
        (openai.BadRequestError,),
    )


def responses_error_auth(ctx: Context) -> str:
    client = openai.OpenAI(base_url=ctx.root + "/v1", api_key=ctx.api_key + "-wrong", max_retries=0, timeout=ctx.timeout)
    return expect_openai_error(
        lambda: client.responses.create(model=ctx.model, input="Hi", max_output_tokens=16),
        (openai.AuthenticationError,),
    )


def responses_error_unknown_model(ctx: Context) -> str:
    return expect_openai_error(
        lambda: ctx.openai.responses.create(model="no-such-model", input="Hi", max_output_tokens=16),
        (openai.NotFoundError,),
    )


def responses_error_raw_shape(ctx: Context) -> str:
    """The raw error envelope: {"error": {"message", "type", "param", "code"}}."""
    good = {"model": ctx.model, "input": "Hi", "max_output_tokens": 16}
    bearer = {"authorization": f"Bearer {ctx.api_key}"}
    cases = [
        ({**good, "bogus_field": 1}, bearer, 400),
        (good, {"authorization": f"Bearer {ctx.api_key}-wrong"}, 401),
        ({**good, "model": "no-such-model"}, bearer, 404),
        ("{not json", bearer, 400),
    ]
    seen = []
    for body, headers, status in cases:
        if isinstance(body, str):
            response = httpx.post(
                ctx.root + "/v1/responses", content=body, timeout=ctx.timeout,
                headers={**headers, "content-type": "application/json"},
            )
        else:
            response = raw_post(ctx, "/v1/responses", body, headers)
        what = f"{status} case"
        expect(response.status_code == status, f"{what}: status {response.status_code}: {short(response.text)}")
        content_type = response.headers.get("content-type", "")
        expect(content_type.startswith("application/json"), f"{what}: content-type {content_type!r}")
        value = loads_json(response.text, f"{what}: the body")
        expect(isinstance(value, dict) and set(value) == {"error"}, f"{what}: the body is not {{\"error\": ...}}: {response.text}")
        error = value["error"]
        expect(
            isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error),
            f"{what}: the error object lacks message, type, param or code: {error}",
        )
        expect(isinstance(error["message"], str) and error["message"], f"{what}: message {error['message']!r}")
        expect(isinstance(error["type"], str) and error["type"], f"{what}: type {error['type']!r}")
        seen.append(f"{status} {error['type']}/{error['code']}")
    return ", ".join(seen)


def responses_shapes(ctx: Context) -> str:
    """The differences from the SDK's types that the checks before recorded (run alone, it makes
    requests of each kind itself)."""
    if ctx.shapes_seen["responses"] == 0:
        bearer = {"authorization": f"Bearer {ctx.api_key}"}
        forced = {"tools": RESPONSES_TOOLS, "tool_choice": "required"}
        for extra in ({}, forced):
            request = {"model": ctx.model, "input": "What is the weather in Paris?", "max_output_tokens": MAX_TOKENS, **extra}
            created = responses_create(ctx, **request)
            check_responses_events(ctx, raw_sse(ctx, "/v1/responses", {**request, "stream": True}, bearer))
        raw = ctx.openai.responses.with_raw_response.retrieve(created.id)
        conform(ctx, "responses", openai.types.responses.Response, raw.http_response.json(), "responses.retrieve")
        for item in ctx.openai.responses.input_items.with_raw_response.list(created.id).http_response.json()["data"]:
            conform(ctx, "responses", openai.types.responses.ResponseInputMessageItem, item, "input_items")
    return report_shapes(ctx, ("responses",))


# --- Thinking (a server with a reasoning parser and a template that opens <think>) ------------

THINK_QUESTION = [{"role": "user", "content": "Is the sky blue? Think first."}]


def thinking_anthropic_create(ctx: Context) -> str:
    message = anthropic_create(
        ctx, max_tokens=1100, messages=THINK_QUESTION, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    check_message(message, ctx)
    expect(message.content, "no content blocks")
    first = message.content[0]
    expect(first.type == "thinking", f"content[0] is {first.type!r}, not thinking: {message.content}")
    expect(isinstance(first.thinking, str) and first.thinking, f"thinking {first.thinking!r}")
    expect(isinstance(first.signature, str), f"signature {first.signature!r}")
    expect("<think>" not in first.thinking and "</think>" not in first.thinking, f"tags in the thinking: {first.thinking!r}")
    expect("<think>" not in message_text(message) and "</think>" not in message_text(message), "tags in the text")
    expect([b.type for b in message.content].count("thinking") == 1, f"blocks {[b.type for b in message.content]}")
    return (
        f"{[b.type for b in message.content]} {message.stop_reason} out={message.usage.output_tokens}: "
        f"thinking {short(first.thinking, 50)!r}, text {short(message_text(message), 40)!r}"
    )


def thinking_anthropic_stream(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "max_tokens": 1100,
        "extra_body": GREEDY,
        "messages": THINK_QUESTION,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    with ctx.anthropic.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    check_message(final, ctx)
    expect(final.content and final.content[0].type == "thinking", f"final blocks {[b.type for b in final.content]}")
    expect(final.content[0].thinking, "the final thinking block is empty")
    expect(isinstance(final.content[0].signature, str), f"signature {final.content[0].signature!r}")
    expect("thinking" in kinds, f"the stream helper saw no thinking events: {sorted(set(kinds))}")

    events = raw_sse(ctx, "/v1/messages", {**anthropic_wire(request), "stream": True}, anthropic_headers(ctx))
    check_anthropic_event_order(ctx, events)
    deltas = [d["delta"] for _, d in events if d["type"] == "content_block_delta"]
    thinking = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    signatures = [d for d in deltas if d["type"] == "signature_delta"]
    expect(thinking, "no thinking_delta events")
    expect(signatures, "no signature_delta event")
    expect(thinking == final.content[0].thinking, f"raw thinking {thinking!r} != the helper's {final.content[0].thinking!r}")
    whole = anthropic_create(ctx, **request)
    expect(
        whole.content and whole.content[0].type == "thinking" and whole.content[0].thinking == thinking,
        f"non-streamed thinking {whole.content[0] if whole.content else None!r} != streamed {thinking!r}",
    )
    expect(message_text(whole) == message_text(final), f"text {message_text(whole)!r} whole, {message_text(final)!r} streamed")
    return f"{len(deltas)} deltas ({len(signatures)} signature): thinking {short(thinking, 50)!r}"


def thinking_anthropic_disabled(ctx: Context) -> str:
    message = anthropic_create(ctx, max_tokens=MAX_TOKENS, messages=THINK_QUESTION, thinking={"type": "disabled"})
    check_message(message, ctx)
    kinds = [block.type for block in message.content]
    expect("thinking" not in kinds and "redacted_thinking" not in kinds, f"thinking blocks with thinking disabled: {kinds}")
    expect(message_text(message), f"no text: {message.content}")
    expect("<think>" not in message_text(message) and "</think>" not in message_text(message), "tags in the text")
    return f"{kinds}: {short(message_text(message), 60)!r}"


def thinking_responses_reasoning(ctx: Context) -> str:
    response = responses_create(ctx, input="Is the sky blue? Think first.", reasoning={"effort": "low"}, max_output_tokens=200)
    check_response(response, ctx, status=response.status if response.status == "incomplete" else "completed")
    kinds = [item.type for item in response.output]
    expect("reasoning" in kinds, f"no reasoning item: {kinds}")
    expect(kinds.index("reasoning") == 0, f"the reasoning item is not first: {kinds}")
    reasoning_tokens = response.usage.output_tokens_details.reasoning_tokens
    expect(reasoning_tokens > 0, f"usage.output_tokens_details.reasoning_tokens {reasoning_tokens}")
    expect(reasoning_tokens <= response.usage.output_tokens, f"reasoning_tokens {reasoning_tokens} > output_tokens")
    item = response.output[0]
    texts = [part.text for part in (item.content or [])] + [part.text for part in item.summary]
    expect("<think>" not in response.output_text and "</think>" not in response.output_text, "tags in output_text")
    return (
        f"{response.status} {kinds} reasoning_tokens={reasoning_tokens}/{response.usage.output_tokens}: "
        f"reasoning {short(' '.join(texts), 50)!r}, text {short(response.output_text, 40)!r}"
    )


def thinking_responses_stream(ctx: Context) -> str:
    request = {
        "model": ctx.model,
        "input": THINK_QUESTION[0]["content"],
        "reasoning": {"effort": "low"},
        "max_output_tokens": 200,
        "temperature": 0,
    }
    with ctx.openai.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    expect(deltas, f"no response.reasoning_text.delta events: {sorted({event.type for event in events})}")
    reasoning = [item for item in final.output if item.type == "reasoning"]
    expect(reasoning, f"no reasoning item in the final response: {[item.type for item in final.output]}")
    final_text = "".join(part.text for part in (reasoning[0].content or []))
    expect(final_text == deltas, f"the final reasoning item's text {final_text!r} != the deltas {deltas!r}")
    whole = responses_create(ctx, **request)
    whole_reasoning = [item for item in whole.output if item.type == "reasoning"]
    whole_text = "".join(part.text for part in (whole_reasoning[0].content or [])) if whole_reasoning else None
    expect(whole_text == deltas, f"non-streamed reasoning {whole_text!r} != streamed {deltas!r}")
    expect(whole.output_text == final.output_text, f"output_text {whole.output_text!r} whole, {final.output_text!r} streamed")
    raw = raw_sse(ctx, "/v1/responses", {**request, "stream": True}, {"authorization": f"Bearer {ctx.api_key}"})
    kinds = check_responses_events(ctx, raw)
    return f"{kinds.count('response.reasoning_text.delta')} reasoning deltas: {short(deltas, 50)!r}"


def thinking_shapes(ctx: Context) -> str:
    """The differences from the SDK's types that the thinking checks recorded (run alone, it makes a
    request with thinking on each API itself)."""
    if ctx.shapes_seen["anthropic"] == 0:
        anthropic_create(ctx, max_tokens=1100, messages=THINK_QUESTION, thinking={"type": "enabled", "budget_tokens": 1024})
    if ctx.shapes_seen["responses"] == 0:
        responses_create(ctx, input=THINK_QUESTION[0]["content"], reasoning={"effort": "low"}, max_output_tokens=200)
    return report_shapes(ctx, ("anthropic", "responses"))


ANTHROPIC_CHECKS: list[Callable[[Context], str]] = [
    anthropic_create_plain,
    anthropic_max_tokens,
    anthropic_stop_sequences,
    anthropic_stream,
    anthropic_tool_any,
    anthropic_tool_named,
    anthropic_tool_auto,
    anthropic_tool_none,
    anthropic_tool_no_parallel,
    anthropic_tool_round_trip,
    anthropic_stream_tool_use,
    anthropic_count_tokens,
    anthropic_error_unknown_field,
    anthropic_error_image,
    anthropic_error_orphan_tool_result,
    anthropic_error_missing_max_tokens,
    anthropic_error_auth,
    anthropic_error_unknown_model,
    anthropic_error_raw_shape,
    anthropic_shapes,
]

RESPONSES_CHECKS: list[Callable[[Context], str]] = [
    responses_create_plain,
    responses_create_items,
    responses_incomplete,
    responses_stream,
    responses_function_required,
    responses_function_named,
    responses_function_none,
    responses_function_no_parallel,
    responses_stream_function_call,
    responses_tool_round_trip,
    responses_json_schema,
    responses_store_retrieve,
    responses_delete,
    responses_store_false,
    responses_previous_response_id,
    responses_builtin_tool_ignored,
    responses_error_unknown_field,
    responses_error_orphan_output,
    responses_error_auth,
    responses_error_unknown_model,
    responses_error_raw_shape,
    responses_shapes,
]

THINKING_CHECKS: list[Callable[[Context], str]] = [
    thinking_anthropic_create,
    thinking_anthropic_stream,
    thinking_anthropic_disabled,
    thinking_responses_reasoning,
    thinking_responses_stream,
    thinking_shapes,
]

SUITES = {
    "anthropic": ANTHROPIC_CHECKS,
    "responses": RESPONSES_CHECKS,
    "all": ANTHROPIC_CHECKS + RESPONSES_CHECKS,
    "thinking": THINKING_CHECKS,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the server's root URL (no /v1), e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--only", action="append", default=[], help="run only this check (repeatable)")
    parser.add_argument(
        "--suite", choices=sorted(SUITES), default="all",
        help="anthropic, responses, all (both; the default) or thinking (a server with a reasoning parser)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args = parser.parse_args()

    root = args.base_url.rstrip("/")
    if root.endswith("/v1"):
        parser.error(f"--base-url is the server's root, without /v1: {args.base_url}")
    checks = SUITES[args.suite]
    if args.only:
        names = {c.__name__ for c in checks}
        unknown = sorted(set(args.only) - names)
        if unknown:
            parser.error(f"unknown check(s) {', '.join(unknown)} in suite {args.suite}; known: {', '.join(sorted(names))}")
        checks = [c for c in checks if c.__name__ in args.only]

    # No retries: a failure shows at once instead of being hidden by a second try.
    ctx = Context(
        anthropic=anthropic.Anthropic(base_url=root, api_key=args.api_key, max_retries=0, timeout=args.timeout),
        openai=openai.OpenAI(base_url=root + "/v1", api_key=args.api_key, max_retries=0, timeout=args.timeout),
        root=root,
        api_key=args.api_key,
        model=args.model,
        timeout=args.timeout,
    )
    print(
        f"anthropic {anthropic.__version__}, openai {openai.__version__} against {root} "
        f"(suite {args.suite}, model {args.model})",
        flush=True,
    )

    failed = []
    for check in checks:
        start = time.monotonic()
        try:
            detail = check(ctx)
        except CheckFailed as e:
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}: {e}", flush=True)
            continue
        except Exception as e:  # noqa: BLE001 - any SDK or network error is a failure of this check
            failed.append(check.__name__)
            print(f"FAIL {check.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        elapsed = time.monotonic() - start
        print(f"ok   {check.__name__} ({elapsed:.1f}s): {detail}", flush=True)

    if failed:
        print(f"error: {len(failed)} of {len(checks)} checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(checks)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
