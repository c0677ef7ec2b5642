#!/usr/bin/env python3
"""Run an OpenAI Agents SDK agent with one function tool against a Responses API server.

The agent has one tool, add(a, b), and goes through OpenAIResponsesModel (POST /v1/responses),
tracing disabled. It passes when the tool was called and the run then ended with a final text
output (a tool round trip: function_call out, function_call_output back in, text out).

Run it with the interpreter of the venv that scripts/agent-clients.sh installs openai-agents into:

    python scripts/agents_sdk_check.py --base-url http://127.0.0.1:8000 --model NAME [--api-key KEY]

Prints one line, "PASS: ..." or "FAIL: ...", and exits 0 or 1.
"""

import argparse
import asyncio
import dataclasses
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root; /v1 is appended")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY") or "sk-pagoda-local")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--tool-choice",
        default="required",
        help="tool_choice of the first turn (the SDK resets it to auto after a tool call); "
        "'auto' leaves the call up to the model",
    )
    ap.add_argument("--stream", action="store_true", help="use Runner.run_streamed (SSE) instead of Runner.run")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for each HTTP request")
    args = ap.parse_args()

    try:
        from agents import (
            Agent,
            ModelSettings,
            OpenAIResponsesModel,
            RunHooks,
            Runner,
            function_tool,
            set_tracing_disabled,
        )
        from openai import AsyncOpenAI
    except ImportError as e:
        print("FAIL: cannot import the Agents SDK (%s); install openai-agents" % e)
        return 1

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers and return the sum."""
        calls.append((a, b))
        return a + b

    base = args.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = AsyncOpenAI(base_url=base, api_key=args.api_key, timeout=args.timeout, max_retries=0)
    class AnswerAfterTheTool(RunHooks):
        """After the tool has run, the next turn may not call it again (tool_choice "none"), so
        that a small model answers with the result instead of calling the tool once more."""

        async def on_tool_end(self, context, agent, tool, result):
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")

    agent = Agent(
        name="Calculator",
        reset_tool_choice=False,
        instructions="You are a calculator. Use the add tool to add numbers, then state the result.",
        tools=[add],
        model=OpenAIResponsesModel(model=args.model, openai_client=client),
        model_settings=ModelSettings(
            tool_choice=args.tool_choice,
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=args.max_tokens,
            store=False,
        ),
    )
    prompt = "What is 2 + 3? Use the add tool."

    async def run():
        if args.stream:
            result = Runner.run_streamed(agent, prompt, max_turns=args.max_turns, hooks=AnswerAfterTheTool())
            async for _ in result.stream_events():
                pass
            return result
        return await Runner.run(agent, prompt, max_turns=args.max_turns, hooks=AnswerAfterTheTool())

    try:
        result = asyncio.run(run())
    except Exception as e:  # noqa: BLE001 - any failure of the run is the check's failure
        detail = str(e).replace("\n", " ")[:400]
        print("FAIL: agent run raised %s: %s (tool calls so far: %s)" % (type(e).__name__, detail, calls))
        return 1

    kinds = [getattr(item, "type", type(item).__name__) for item in result.new_items]
    final = result.final_output
    if not calls:
        print("FAIL: the add tool was never called (items: %s, final output: %r)" % (kinds, final))
        return 1
    if "tool_call_output_item" not in kinds:
        print("FAIL: no tool output went back to the model (items: %s)" % kinds)
        return 1
    if not isinstance(final, str) or not final.strip():
        print("FAIL: no final text output after the tool call (items: %s, final: %r)" % (kinds, final))
        return 1
    print(
        "PASS: add%s called, %d model call(s), final output: %r"
        % (calls[0], len(result.raw_responses), final.strip()[:200])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
