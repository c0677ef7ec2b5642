"""An OTLP trace receiver for crates/server/tests/e2e/traces.rs: oteltest's gRPC and HTTP
sinks (the OpenTelemetry Python project's test receiver) on the given ports of 127.0.0.1's
host, printing every span it receives as one JSON line on stdout, then `ready` once both
listen. Runs until killed.

    python otlp_sink.py GRPC_PORT HTTP_PORT
"""

import json
import logging
import socket
import sys
import time

from oteltest.sink import GrpcSink, HttpSink
from oteltest.sink.handler import RequestHandler


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class SpanPrinter(RequestHandler):
    def __init__(self, transport):
        self.transport = transport

    def handle_logs(self, request, headers):
        pass

    def handle_metrics(self, request, headers):
        pass

    def handle_trace(self, request, headers):
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    line = {
                        "transport": self.transport,
                        "service": resource.get("service.name"),
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start_ns": span.start_time_unix_nano,
                        "end_ns": span.end_time_unix_nano,
                        "attributes": {a.key: value_of(a.value) for a in span.attributes},
                    }
                    print(json.dumps(line), flush=True)


def wait_listening(port, deadline):
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"port {port} never listened")


def main():
    grpc_port, http_port = int(sys.argv[1]), int(sys.argv[2])
    logger = logging.getLogger("otlp_sink")
    grpc = GrpcSink(SpanPrinter("grpc"), logger, port=grpc_port)
    grpc.start()
    http = HttpSink(SpanPrinter("http"), logger, port=http_port)
    http.start()
    deadline = time.monotonic() + 30
    wait_listening(grpc_port, deadline)
    wait_listening(http_port, deadline)
    print("ready", flush=True)
    grpc.wait_for_termination()


if __name__ == "__main__":
    main()
