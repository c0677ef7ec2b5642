#!/usr/bin/env bash
# Installs the official OpenAI, Anthropic and Cohere Python SDKs, pydantic and jsonschema, and a KV-event
# consumer's pyzmq, msgspec and cbor2, the MCP SDK and an OTLP receiver (oteltest) (PyPI wheels,
# pinned with their dependencies in scripts/sdk-requirements.txt) into a virtual environment of
# their own at $PAGODA_TOOLS_DIR/sdk (default ~/.cache/pagoda-tools/sdk), apart from the
# deployment tools'.
# The end-to-end test crates/server/tests/e2e/sdk.rs runs tests/sdk/ with its python.
# Idempotent: a second run installs nothing and prints nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLS_DIR="${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}"
VENV="$TOOLS_DIR/sdk"
REQUIREMENTS="scripts/sdk-requirements.txt"

die() {
    echo "error: $*" >&2
    exit 1
}

[ -f "$REQUIREMENTS" ] || die "$REQUIREMENTS is missing"

stamp="$VENV/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS" && [ -x "$VENV/bin/python" ] \
    && "$VENV/bin/python" -c 'import openai, anthropic, cohere, pydantic, jsonschema, zmq, msgspec, cbor2, mcp, oteltest' >/dev/null 2>&1; then
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 is missing: the SDK checks need Python 3"
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    # Debian's own python3 needs python3-venv for pip's virtual environments.
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        die "python3 cannot make virtual environments (python3-venv) and neither root nor sudo is available to install it"
    fi
    command -v apt-get >/dev/null 2>&1 \
        || die "python3 cannot make virtual environments, and there is no apt-get here to install python3-venv"
    echo "installing Debian packages: python3-venv" >&2
    "${as_root[@]}" apt-get update -qq || die "apt-get update failed"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3-venv >/dev/null || die "apt-get install python3-venv failed"
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
        || die "python3 still cannot make virtual environments after installing python3-venv"
fi

echo "installing the OpenAI, Anthropic and Cohere Python SDKs, pydantic and jsonschema into $VENV" >&2
mkdir -p "$TOOLS_DIR" || die "cannot create $TOOLS_DIR"
python3 -m venv --clear "$VENV" || die "python3 -m venv $VENV failed"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
"$VENV/bin/python" -c 'import openai, anthropic, cohere, pydantic, jsonschema, zmq, msgspec, cbor2, mcp, oteltest' \
    || die "$VENV lacks one of openai, anthropic, cohere, pydantic, jsonschema, zmq, msgspec, cbor2, mcp, oteltest after pip install"
cp "$REQUIREMENTS" "$stamp"
