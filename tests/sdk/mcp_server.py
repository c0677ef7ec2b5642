"""A real MCP server for tests/sdk/check_mcp.py: the `mcp` package's MCPServer (mcp 1.x's FastMCP)
over streamable HTTP on 127.0.0.1, with two tools, `add(a, b)` and `echo(text)`. With `--key K`
every HTTP request must carry the header `X-Mcp-Key: K` (else 401), which shows that Pagoda sends
an `mcp` tool's `headers`. Prints `ready` once it listens."""

import argparse

import uvicorn
from mcp.server.mcpserver import MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--key", default=None)
args = parser.parse_args()

server = MCPServer("pagoda-test-tools")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Return the given text unchanged."""
    return text


app = server.streamable_http_app(stateless_http=True, json_response=False)


async def guarded(scope, receive, send):
    """Refuses HTTP requests without the key (lifespan events pass through)."""
    if scope["type"] == "http" and args.key is not None:
        headers = dict(scope.get("headers") or [])
        if headers.get(b"x-mcp-key") != args.key.encode():
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong X-Mcp-Key"})
            return
    await app(scope, receive, send)


class Ready(uvicorn.Server):
    async def startup(self, sockets=None):
        await super().startup(sockets)
        print("ready", flush=True)


Ready(uvicorn.Config(guarded, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")).run()
