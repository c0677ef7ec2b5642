#!/usr/bin/env python3
"""Remote MCP tools of the OpenAI Responses API through the official OpenAI Python SDK against a
running Pagoda server started with `--allow-mcp-servers` for --mcp-url and --hang-url.

    python tests/sdk/check_mcp.py --base-url http://127.0.0.1:8000 --api-key KEY --model NAME \\
        --mcp-url http://127.0.0.1:P/mcp --mcp-key K --hang-url http://127.0.0.1:H/mcp \\
        --mcp-timeout 3 --disallowed-url http://127.0.0.1:D/mcp

--mcp-url is tests/sdk/mcp_server.py (tools `add` and `echo`, wanting the header `X-Mcp-Key`),
--hang-url a server that accepts connections and never answers, --mcp-timeout the server's
--mcp-timeout. The model is tiny and calls tools only when forced: `tool_choice` names the MCP
tool, so the checks look at the shapes and at the tools' real output (echo returns the model's
text, add the sum of its arguments), not at the model's prose. The checks: `mcp_list_tools`
with both tools (and only the allowed ones with `allowed_tools`), an `mcp_call` with the real
output; the headers sent (without them the listing fails with an error item); approval asked
(`mcp_approval_request`) and given by `previous_response_id` or stateless `input`, and refused;
a disallowed `server_url` a `BadRequestError` naming `tools[0].server_url`; a hanging server
ending its listing with an error within the limit, the server serving the next request; the
stream's MCP events; a background response with an MCP call. One line per check; exit 1 if any
failed.
"""

from __future__ import annotations

import argparse
import json
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
    mcp_url: str
    mcp_key: str
    hang_url: str
    mcp_timeout: float
    disallowed_url: str

    def tool(self, **extra: Any) -> dict:
        tool = {"type": "mcp", "server_label": "tools", "server_url": self.mcp_url,
                "headers": {"X-Mcp-Key": self.mcp_key}, "require_approval": "never"}
        tool.update(extra)
        return tool


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def create(ctx: Context, prompt: Any, **kwargs: Any) -> Any:
    args = {"model": ctx.model, "input": prompt, "max_output_tokens": 40, "temperature": 0}
    args.update(kwargs)
    return ctx.client.responses.create(**args)


def forced(name: str) -> dict:
    return {"type": "mcp", "server_label": "tools", "name": name}


def items_of(response: Any, kind: str) -> list:
    return [i for i in response.output if i.type == kind]


def check_call_output(call: Any) -> None:
    """The call ran for real: echo gives back its text, add the sum of its numbers."""
    expect(call.error is None, f"the call failed: {call.error}")
    args = json.loads(call.arguments)
    if call.name == "echo":
        expect(call.output == args["text"], f"echo({args!r}) gave {call.output!r}")
    elif call.name == "add":
        expect(call.output == str(args["a"] + args["b"]), f"add({args!r}) gave {call.output!r}")
    else:
        raise CheckFailed(f"unexpected tool {call.name}")


def check_list_and_call(ctx: Context) -> None:
    for name, prompt in [("echo", "Echo the word hello."), ("add", "What is 2 plus 3?")]:
        r = create(ctx, prompt, tools=[ctx.tool()], tool_choice=forced(name))
        expect(r.status == "completed", f"status {r.status}")
        listings = items_of(r, "mcp_list_tools")
        expect(len(listings) == 1, f"{len(listings)} mcp_list_tools items")
        listing = listings[0]
        expect(listing.server_label == "tools" and listing.error is None, f"listing {listing}")
        names = sorted(t.name for t in listing.tools)
        expect(names == ["add", "echo"], f"listed {names}")
        expect(all(t.input_schema.get("type") == "object" for t in listing.tools), "input schemas")
        calls = items_of(r, "mcp_call")
        expect(calls, f"no mcp_call in {[i.type for i in r.output]}")
        expect(calls[0].name == name and calls[0].server_label == "tools", f"call {calls[0]}")
        for call in calls:
            check_call_output(call)
        expect(r.output[0].type == "mcp_list_tools", "the listing comes first")
        expect(not items_of(r, "function_call"), "MCP calls are not function calls for the client")
        expect(r.usage.output_tokens > 0, "usage")


def check_allowed_tools(ctx: Context) -> None:
    r = create(ctx, "Say hi.", tools=[ctx.tool(allowed_tools=["echo"])], tool_choice="required")
    listing = items_of(r, "mcp_list_tools")[0]
    expect([t.name for t in listing.tools] == ["echo"], f"allowed_tools: listed {[t.name for t in listing.tools]}")
    calls = items_of(r, "mcp_call")
    expect(calls and all(c.name == "echo" for c in calls), f"calls {calls}")
    for call in calls:
        check_call_output(call)


def check_headers_are_sent(ctx: Context) -> None:
    tool = ctx.tool()
    del tool["headers"]
    r = create(ctx, "Say hi.", tools=[tool])
    listing = items_of(r, "mcp_list_tools")[0]
    expect(listing.error, "without its header the MCP server refuses the listing")
    expect(listing.tools == [], f"tools {listing.tools}")
    expect(r.status == "completed", f"the response still completes: {r.status}")


def check_approval(ctx: Context) -> None:
    tools = [ctx.tool(require_approval="always")]
    r = create(ctx, "Echo the word hello.", tools=tools, tool_choice=forced("echo"))
    requests = items_of(r, "mcp_approval_request")
    expect(len(requests) == 1, f"output {[i.type for i in r.output]}")
    req = requests[0]
    expect(req.name == "echo" and req.server_label == "tools", f"request {req}")
    expect(not items_of(r, "mcp_call"), "nothing runs before approval")
    approve = {"type": "mcp_approval_response", "approval_request_id": req.id, "approve": True}
    r2 = create(ctx, [approve], tools=tools, previous_response_id=r.id)
    calls = items_of(r2, "mcp_call")
    expect(calls, f"after approval: {[i.type for i in r2.output]}")
    expect(calls[0].approval_request_id == req.id, f"approval_request_id {calls[0].approval_request_id}")
    expect(json.loads(calls[0].arguments) == json.loads(req.arguments), "the approved arguments")
    check_call_output(calls[0])
    expect(not items_of(r2, "mcp_list_tools"), "the conversation's listing is reused")
    # Stateless: the request item given back in input.
    given = [{"role": "user", "content": "Echo the word hello."}, req.model_dump(exclude_none=True), approve]
    r3 = create(ctx, given, tools=tools, store=False)
    calls = items_of(r3, "mcp_call")
    expect(calls and calls[0].approval_request_id == req.id, f"stateless approval: {[i.type for i in r3.output]}")
    check_call_output(calls[0])
    # Refused: nothing runs, the model answers.
    deny = {"type": "mcp_approval_response", "approval_request_id": req.id, "approve": False, "reason": "no"}
    r4 = create(ctx, [deny], tools=tools, previous_response_id=r.id, tool_choice="none")
    expect(not items_of(r4, "mcp_call"), f"refused: {[i.type for i in r4.output]}")
    expect(r4.status == "completed", f"status {r4.status}")
    try:
        create(ctx, [{**approve, "approval_request_id": "mcpr_nope"}], tools=tools, previous_response_id=r.id)
        raise CheckFailed("an unknown approval_request_id was accepted")
    except openai.BadRequestError as e:
        expect(e.body.get("param") == "input[0].approval_request_id", f"param {e.body}")


def check_disallowed_url(ctx: Context) -> None:
    for url in [ctx.disallowed_url, ctx.mcp_url + "x", ctx.mcp_url.replace("http://", "http://u@")]:
        try:
            create(ctx, "hi", tools=[ctx.tool(server_url=url)])
            raise CheckFailed(f"{url} was accepted")
        except openai.BadRequestError as e:
            expect(e.status_code == 400, f"status {e.status_code}")
            expect(e.body.get("param") == "tools[0].server_url", f"param {e.body}")
            expect(e.body.get("type") == "invalid_request_error", f"type {e.body}")


def check_hanging_server(ctx: Context) -> None:
    start = time.monotonic()
    r = create(ctx, "Say hi.", tools=[ctx.tool(server_url=ctx.hang_url, server_label="hangs")])
    took = time.monotonic() - start
    listing = items_of(r, "mcp_list_tools")[0]
    expect(listing.error and "within" in listing.error, f"listing error {listing.error!r}")
    expect(took < ctx.mcp_timeout + 20, f"took {took:.1f} s for a {ctx.mcp_timeout} s limit")
    expect(took >= ctx.mcp_timeout - 0.5, f"gave up after {took:.1f} s, before the limit")
    after = create(ctx, "Say hi.", max_output_tokens=5)
    expect(after.status in ("completed", "incomplete"), f"the next request: {after.status}")


def check_stream(ctx: Context) -> None:
    stream = create(ctx, "Echo the word hello.", tools=[ctx.tool()], tool_choice=forced("echo"), stream=True)
    events = list(stream)
    names = [e.type for e in events]
    for wanted in ["response.created", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
                   "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                   "response.mcp_call.in_progress", "response.mcp_call.completed", "response.completed"]:
        expect(wanted in names, f"no {wanted} in {names}")
    expect(names.index("response.mcp_list_tools.completed") < names.index("response.mcp_call.in_progress"), "order")
    seq = [e.sequence_number for e in events]
    expect(seq == list(range(len(seq))), "sequence numbers")
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    expect(added[:2] == ["mcp_list_tools", "mcp_call"], f"items added {added}")
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    expect([i.type for i in final.output] == [i.type for i in done_items], "the final output is the items done")
    call_done = [e for e in events if e.type == "response.mcp_call.completed"][0]
    call = [i for i in final.output if i.type == "mcp_call"][0]
    expect(call_done.item_id == call.id, "the event names its item")
    check_call_output(call)


def check_background(ctx: Context) -> None:
    r = create(ctx, "Echo the word hello.", tools=[ctx.tool()], tool_choice=forced("echo"), background=True)
    expect(r.status == "queued", f"status {r.status}")
    deadline = time.monotonic() + 240
    while r.status in ("queued", "in_progress"):
        expect(time.monotonic() < deadline, "still running after 240 s")
        time.sleep(0.1)
        r = ctx.client.responses.retrieve(r.id)
    expect(r.status == "completed", f"status {r.status}")
    calls = items_of(r, "mcp_call")
    expect(calls, f"output {[i.type for i in r.output]}")
    check_call_output(calls[0])


CHECKS: list[tuple[str, Callable[[Context], None]]] = [
    ("list_and_call", check_list_and_call),
    ("allowed_tools", check_allowed_tools),
    ("headers_are_sent", check_headers_are_sent),
    ("approval", check_approval),
    ("disallowed_url", check_disallowed_url),
    ("hanging_server", check_hanging_server),
    ("stream", check_stream),
    ("background", check_background),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--mcp-url", required=True)
    parser.add_argument("--mcp-key", required=True)
    parser.add_argument("--hang-url", required=True)
    parser.add_argument("--mcp-timeout", type=float, required=True)
    parser.add_argument("--disallowed-url", required=True)
    parser.add_argument("--only", default=None, help="run only this check")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key=args.api_key,
                           timeout=args.timeout, max_retries=0)
    ctx = Context(client, args.model, args.mcp_url, args.mcp_key, args.hang_url, args.mcp_timeout, args.disallowed_url)
    failed = 0
    for name, check in CHECKS:
        if args.only and name != args.only:
            continue
        try:
            check(ctx)
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - every check runs; the failure is reported
            failed += 1
            print(f"FAIL {name}: {e}")
            traceback.print_exc(file=sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
