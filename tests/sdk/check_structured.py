#!/usr/bin/env python3
"""Structured output through the official OpenAI Python SDK against a running Pagoda server.

    python tests/sdk/check_structured.py --base-url http://127.0.0.1:8000/v1 --api-key KEY --model NAME

Each check is a function in CHECKS that takes a Context and returns a short description of what
it saw, or raises (CheckFailed or anything else) on a failure. Every check runs; one line is
printed per check, and the exit status is 1 if any failed. Add new checks (tool calls, reasoning)
as functions and append them to CHECKS. The model is small (SmolLM2-135M): prompts stay simple,
max_tokens stays at most 300 and sampling is greedy unless a check says otherwise.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Literal

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

MAX_TOKENS = 300


class CheckFailed(Exception):
    """A check saw something wrong; the message says what."""


@dataclass
class Context:
    client: OpenAI
    model: str


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def parse_method(client: OpenAI) -> Callable:
    """`client.chat.completions.parse` in newer SDKs, `client.beta.chat.completions.parse` before."""
    parse = getattr(client.chat.completions, "parse", None)
    if parse is None:
        parse = client.beta.chat.completions.parse
    return parse


def validate(instance: object, schema: dict, what: str) -> None:
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(instance), key=lambda e: list(e.path))
    expect(not errors, f"{what} does not validate: {'; '.join(e.message for e in errors)}: {instance!r}")


def loads_json(text: str | None, what: str) -> object:
    expect(text is not None, f"{what}: no content")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckFailed(f"{what} is not JSON ({e}): {text!r}") from None


# --- The models -------------------------------------------------------------------------------


class City(BaseModel):
    name: str = Field(max_length=30)
    population: int = Field(ge=0, le=100_000_000)


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    favourite_color: Color
    address: Address


# --- The checks -------------------------------------------------------------------------------


def check_parse(ctx: Context, model_cls: type[BaseModel], prompt: str) -> str:
    completion = parse_method(ctx.client)(
        model=ctx.model,
        messages=[
            {"role": "system", "content": "You answer with JSON only."},
            {"role": "user", "content": prompt},
        ],
        response_format=model_cls,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = completion.choices[0]
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}: {choice.message.content!r}")
    parsed = choice.message.parsed
    expect(isinstance(parsed, model_cls), f".parsed is {type(parsed).__name__}, not {model_cls.__name__}")
    validate(loads_json(choice.message.content, "content"), model_cls.model_json_schema(), "content")
    return choice.message.content


def parse_city(ctx: Context) -> str:
    return check_parse(ctx, City, "Invent a city and its population as JSON.")


def parse_nested_person(ctx: Context) -> str:
    return check_parse(ctx, Person, "Invent a person with a name, age, role, favourite color and address.")


def json_object_streamed(ctx: Context) -> str:
    stream = ctx.client.chat.completions.create(
        model=ctx.model,
        # A prompt this model answers briefly: "Describe a cat as JSON." sends it into an endless
        # object (a grammar guarantees validity, not brevity) and "Describe a cat." gives "{}".
        messages=[{"role": "user", "content": "Return a JSON object with a name and an age."}],
        response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    text = ""
    chunks = 0
    last_finish = None
    for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            text += choice.delta.content or ""
            last_finish = choice.finish_reason
    expect(chunks > 1, f"{chunks} chunk(s): not streamed")
    expect(last_finish == "stop", f"the last chunk's finish_reason is {last_finish!r}: {text!r}")
    value = loads_json(text, "the concatenated deltas")
    expect(isinstance(value, dict) and value, f"the concatenated deltas are not a non-empty object: {text!r}")
    return f"{chunks} chunks: {text}"


def guided_choice(ctx: Context) -> str:
    options = ["red", "green", "blue"]
    completion = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "user", "content": "What color is the sky?"}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"guided_choice": options},
    )
    choice = completion.choices[0]
    expect(choice.message.content in options, f"content {choice.message.content!r} is not one of {options}")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    return repr(choice.message.content)


def structured_outputs_regex(ctx: Context) -> str:
    pattern = "[0-9]{3}-[0-9]{4}"
    completion = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "user", "content": "Invent a phone number."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"structured_outputs": {"regex": pattern}},
    )
    choice = completion.choices[0]
    content = choice.message.content
    expect(content is not None and re.fullmatch(pattern, content) is not None, f"{content!r} does not match {pattern}")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    return repr(content)


def completions_guided_json(ctx: Context) -> str:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "rank": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["city", "rank"],
        "additionalProperties": False,
    }
    completion = ctx.client.completions.create(
        model=ctx.model,
        prompt="A city and its rank as JSON:",
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"guided_json": schema},
    )
    choice = completion.choices[0]
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}: {choice.text!r}")
    validate(loads_json(choice.text, "text"), schema, "text")
    return choice.text


def invalid_schema_is_bad_request(ctx: Context) -> str:
    try:
        completion = ctx.client.chat.completions.create(
            model=ctx.model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}},
        )
    except openai.BadRequestError as e:
        body = e.body
        # The SDK hands over the "error" object; accept the whole envelope too.
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"]
        expect(isinstance(body, dict), f"the error body is not an object: {body!r}")
        expect(
            body.get("param") == "response_format.json_schema.schema",
            f"param is {body.get('param')!r}, not 'response_format.json_schema.schema': {body!r}",
        )
        expect(e.param == body.get("param"), f"BadRequestError.param {e.param!r} != body param {body.get('param')!r}")
        return f"400 {body.get('type')}: {body.get('message')}"
    raise CheckFailed(f"no error: the server answered {completion.model_dump_json()}")


# --- Tool calls -------------------------------------------------------------------------------


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=30)
    unit: Literal["celsius", "fahrenheit"]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": GetWeather.model_json_schema(),
    },
}


def check_weather_call(name: str, arguments: str) -> dict:
    expect(name == "get_weather", f"called {name!r}")
    args = loads_json(arguments, "arguments")
    validate(args, GetWeather.model_json_schema(), "arguments")
    return args


def tool_call_required(ctx: Context) -> str:
    completion = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = completion.choices[0]
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    calls = choice.message.tool_calls or []
    expect(len(calls) >= 1, f"no tool calls: {choice.message}")
    expect(choice.message.content is None, f"content beside the calls: {choice.message.content!r}")
    args = check_weather_call(calls[0].function.name, calls[0].function.arguments)
    return f"{calls[0].id} get_weather({json.dumps(args)})"


def tool_call_stream_helper(ctx: Context) -> str:
    """The SDK's stream helper reassembles tool-call deltas into the final message."""
    stream_method = getattr(ctx.client.chat.completions, "stream", None) or ctx.client.beta.chat.completions.stream
    with stream_method(
        model=ctx.model,
        messages=[{"role": "user", "content": "Weather in Oslo, in celsius?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=MAX_TOKENS,
        temperature=0,
    ) as stream:
        argument_deltas = 0
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                argument_deltas += 1
        final = stream.get_final_completion()
    choice = final.choices[0]
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    calls = choice.message.tool_calls or []
    expect(len(calls) == 1, f"{len(calls)} calls: {choice.message}")
    expect(argument_deltas >= 1, "no arguments delta events")
    args = check_weather_call(calls[0].function.name, calls[0].function.arguments)
    return f"{argument_deltas} argument deltas -> get_weather({json.dumps(args)})"


def tool_call_parsed_arguments(ctx: Context) -> str:
    """`openai.pydantic_function_tool` with `parse`: strict tool schemas and `.parsed_arguments`."""
    completion = parse_method(ctx.client)(
        model=ctx.model,
        messages=[{"role": "user", "content": "What is the weather in Rome in fahrenheit?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    calls = completion.choices[0].message.tool_calls or []
    expect(len(calls) >= 1, "no tool calls")
    parsed = calls[0].function.parsed_arguments
    expect(isinstance(parsed, GetWeather), f"parsed_arguments is {type(parsed).__name__}")
    return f"{parsed!r}"


def tool_result_turn(ctx: Context) -> str:
    """A multi-turn exchange: the call, its result, and the model's answer."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = ctx.client.chat.completions.create(
        model=ctx.model, messages=messages, tools=[WEATHER_TOOL], tool_choice="required",
        max_tokens=MAX_TOKENS, temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"})
    second = ctx.client.chat.completions.create(
        model=ctx.model, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=40, temperature=0,
    )
    content = second.choices[0].message.content
    expect(isinstance(content, str), f"no answer: {second.choices[0].message}")
    return f"answer {content[:60]!r}"


# --- Reasoning (a server started with --reasoning-parser; see --suite) ------------------------


def reasoning_content(ctx: Context) -> str:
    """`reasoning_content` reaches the SDK's message (as an extra field) and stays out of content."""
    completion = ctx.client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": "Is the sky blue? Think first."}], max_tokens=24,
        temperature=0,
    )
    message = completion.choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    expect(isinstance(reasoning, str) and reasoning, f"no reasoning_content: {message}")
    expect("<think>" not in (message.content or "") and "</think>" not in reasoning, f"tags leaked: {message}")
    streamed = ""
    for chunk in ctx.client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": "Is the sky blue? Think first."}], max_tokens=24,
        temperature=0, stream=True,
    ):
        if chunk.choices:
            streamed += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    expect(streamed == reasoning, f"streamed reasoning {streamed!r} != {reasoning!r}")
    return f"reasoning {reasoning[:50]!r}"


REASONING_CHECKS: list[Callable[[Context], str]] = [reasoning_content]

CHECKS: list[Callable[[Context], str]] = [
    parse_city,
    parse_nested_person,
    json_object_streamed,
    guided_choice,
    structured_outputs_regex,
    completions_guided_json,
    invalid_schema_is_bad_request,
    tool_call_required,
    tool_call_stream_helper,
    tool_call_parsed_arguments,
    tool_result_turn,
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--only", action="append", default=[], help="run only this check (repeatable)")
    parser.add_argument(
        "--suite", choices=["default", "reasoning"], default="default",
        help="reasoning: the checks for a server started with --reasoning-parser",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args = parser.parse_args()

    checks = REASONING_CHECKS if args.suite == "reasoning" else CHECKS
    if args.only:
        names = {c.__name__ for c in checks}
        unknown = sorted(set(args.only) - names)
        if unknown:
            parser.error(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        checks = [c for c in checks if c.__name__ in args.only]

    # No retries: a failure shows at once instead of being hidden by a second try.
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    ctx = Context(client=client, model=args.model)
    print(f"openai {openai.__version__} against {args.base_url} (model {args.model})", flush=True)

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
        print(f"error: {len(failed)} of {len(checks)} SDK checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(checks)} SDK checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
