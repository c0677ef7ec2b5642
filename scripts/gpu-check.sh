#!/usr/bin/env bash
# The GPU check in one go: build and pack on any machine, run on a GPU host.
#
#   scripts/gpu-check.sh build [DIR] [--no-model] [--part-mib N]
#       On any machine (no GPU needed): installs the CUDA 13.0 toolchain from PyPI into a cache
#       (scripts/install-cuda-toolchain.sh), builds the release server and the check binary
#       with --features cuda, and the load generator for scripts/gpu-bench.sh (target dir
#       $PAGODA_CUDA_TARGET_DIR, default ~/.cache/pagoda-target-cuda), strips and
#       xz-compresses them into DIR/bin (default ./gpu-check), copies the tiny checkpoints
#       (tests/fixtures/tiny, about 7 MiB) into DIR/tiny for the `tiny` section,
#       and adds the default model, xz-compressed and split into parts of N MiB (default 40) so
#       that no transfer of the folder exceeds a small limit. DIR/gpu-check.sh is this script.
#
#   DIR/gpu-check.sh run OUT [--model PATH] [-- CHECK-ARGS...]
#       On the GPU host (no Rust, no CUDA toolkit: the driver and CUDA 13 runtime libraries,
#       e.g. from a PyTorch cu130 install's nvidia/cu13/lib). Unpacks the binaries and the
#       model into a stage directory ($PAGODA_GPU_CHECK_STAGE, default
#       /var/tmp/pagoda-gpu-check), sets LD_LIBRARY_PATH and runs every check, writing
#       OUT/results.md, OUT/results.json and logs. Model parts may arrive over several calls
#       (each copy of DIR holding some of them): until all are staged, `run` stages what it
#       finds, says what is missing and exits 3.
#
# Exit status of run: 0 every check passed, 1 some failed, 3 model incomplete, 2 usage.
set -euo pipefail

log() { echo "gpu-check: $*" >&2; }
die() {
    log "$*"
    exit 2
}

MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
BINARIES=(pagoda pagoda-gpu-check)
# Packed too, for scripts/gpu-bench.sh (the load generator; `run` does not need it).
PACKED=("${BINARIES[@]}" pagoda-bench)
# Where `run` (and gpu-bench.sh) unpack binaries and the model on the GPU machine.
STAGE="${PAGODA_GPU_CHECK_STAGE:-/var/tmp/pagoda-gpu-check}"

build() {
    local repo dir="" with_model=1 part_mib=40
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    while [ $# -gt 0 ]; do
        case "$1" in
        --no-model) with_model=0 ;;
        --part-mib)
            part_mib="$2"
            shift
            ;;
        -*) die "unknown option $1" ;;
        *) dir="$1" ;;
        esac
        shift
    done
    dir="${dir:-$repo/gpu-check}"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"

    eval "$("$repo/scripts/install-cuda-toolchain.sh" --env)"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    # A target dir of its own: sharing one with CPU builds would rebuild candle on every
    # switch of features.
    export CARGO_TARGET_DIR="${PAGODA_CUDA_TARGET_DIR:-$HOME/.cache/pagoda-target-cuda}"
    log "building (candle's own CUDA kernels take ~25 minutes on 2 cores the first time; CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    (cd "$repo" && nice -n 19 cargo build --release --locked -j "${JOBS:-2}" \
        -p pagoda-server -p pagoda-gpu-check -p pagoda-bench --features pagoda-server/cuda,pagoda-gpu-check/cuda)

    rm -rf "$dir/bin"
    mkdir -p "$dir/bin"
    for b in "${PACKED[@]}"; do
        local src="$CARGO_TARGET_DIR/release/$b"
        strip -o "$dir/bin/$b" "$src"
        xz -9 -T0 -f "$dir/bin/$b"
        log "$b: $(du -h "$src" | cut -f1) -> $(du -h "$dir/bin/$b.xz" | cut -f1) stripped and compressed"
    done
    cp "$repo/scripts/gpu-check.sh" "$dir/gpu-check.sh"
    chmod +x "$dir/gpu-check.sh"
    # The tiny checkpoints of every architecture (about 7 MiB) for the `tiny` section.
    rm -rf "$dir/tiny"
    mkdir -p "$dir/tiny"
    for t in "$repo"/tests/fixtures/tiny/*/model.gguf; do
        cp "$t" "$dir/tiny/$(basename "$(dirname "$t")").gguf"
    done

    if [ "$with_model" = 1 ]; then
        local model="$repo/models/$MODEL_NAME" sha
        [ -f "$model" ] || "$repo/scripts/fetch-model.sh"
        sha="$(sha256sum "$model" | cut -d' ' -f1)"
        if [ -f "$dir/model/MANIFEST" ] && grep -qx "sha256=$sha" "$dir/model/MANIFEST" &&
            grep -qx "part_mib=$part_mib" "$dir/model/MANIFEST"; then
            log "model parts already packed"
        else
            rm -rf "$dir/model"
            mkdir -p "$dir/model"
            log "compressing the model into $part_mib MiB parts"
            nice -n 19 xz -6 -T0 -c "$model" | split -b "${part_mib}M" -d -a 2 - "$dir/model/model.gguf.xz.part"
            local parts
            parts="$(find "$dir/model" -name 'model.gguf.xz.part*' | wc -l)"
            printf 'name=%s\nsha256=%s\nparts=%s\npart_mib=%s\n' "$MODEL_NAME" "$sha" "$parts" "$part_mib" >"$dir/model/MANIFEST"
        fi
    else
        rm -rf "$dir/model"
    fi
    log "packed into $dir ($(du -sh "$dir" | cut -f1)):"
    (cd "$dir" && find . -type f -printf '  %p %s bytes\n' | sort) >&2
}

# Directories holding the CUDA libraries the binaries link (cuBLAS, cuBLASLt, cuRAND, NVRTC
# of CUDA 13), from pip wheels (PyTorch's) or a toolkit; the driver's libcuda is found by the
# system loader.
cuda_lib_dirs() {
    local py site d
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        site="$("$py" -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)" || continue
        for d in "$site"/cu13/lib "$site"/*/lib; do
            [ -d "$d" ] && echo "$d"
        done
    done
    for d in "${CUDA_HOME:-}" /usr/local/cuda; do
        [ -n "$d" ] && [ -d "$d/lib64" ] && echo "$d/lib64"
    done
    return 0
}

# Unpacks PACK/bin/NAME.xz into STAGE/bin for each NAME; a pack without one keeps what an
# earlier call staged.
stage_binaries() {
    local pack="$1" stage="$2" b
    shift 2
    mkdir -p "$stage/bin"
    for b in "$@"; do
        if [ -f "$pack/bin/$b.xz" ]; then
            xz -dc "$pack/bin/$b.xz" >"$stage/bin/$b.tmp"
            chmod +x "$stage/bin/$b.tmp"
            mv "$stage/bin/$b.tmp" "$stage/bin/$b"
        fi
        [ -x "$stage/bin/$b" ] || die "no $b: $pack/bin/$b.xz is missing and nothing is staged"
    done
}

# Puts the CUDA library folders first on LD_LIBRARY_PATH.
export_cuda_libs() {
    local libs
    libs="$(cuda_lib_dirs | awk '!seen[$0]++' | paste -sd:)"
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# stage_model PACK STAGE: the packed model, reassembled from its parts into STAGE (once; later
# calls reuse it), its path in $staged_model. Parts may come over several calls: with some still
# missing it stages those it finds, says which it has and exits 3.
stage_model() {
    local pack="$1" stage="$2" name sha parts have p
    mkdir -p "$stage/parts"
    [ -f "$pack/model/MANIFEST" ] && cp "$pack/model/MANIFEST" "$stage/parts/MANIFEST"
    [ -f "$stage/parts/MANIFEST" ] || die "no model: pass --model PATH or pack one with build"
    name="$(sed -n 's/^name=//p' "$stage/parts/MANIFEST")"
    sha="$(sed -n 's/^sha256=//p' "$stage/parts/MANIFEST")"
    parts="$(sed -n 's/^parts=//p' "$stage/parts/MANIFEST")"
    staged_model="$stage/$name"
    if [ -f "$staged_model" ] && [ "$(sha256sum "$staged_model" | cut -d' ' -f1)" = "$sha" ]; then
        return 0
    fi
    for p in "$pack"/model/model.gguf.xz.part*; do
        [ -f "$p" ] && cp "$p" "$stage/parts/"
    done
    have="$(find "$stage/parts" -name 'model.gguf.xz.part*' | wc -l)"
    if [ "$have" -lt "$parts" ]; then
        log "staged $have of $parts model parts in $stage/parts ($(cd "$stage/parts" && ls model.gguf.xz.part* | tr '\n' ' ')); run again with the others"
        exit 3
    fi
    cat "$stage"/parts/model.gguf.xz.part* | xz -dc >"$staged_model.tmp"
    [ "$(sha256sum "$staged_model.tmp" | cut -d' ' -f1)" = "$sha" ] || die "the reassembled model does not match its sha256"
    mv "$staged_model.tmp" "$staged_model"
    log "model reassembled: $staged_model"
}

run() {
    local here out="" model="" stage
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    local pack="$here"
    # Run from the repo's scripts/, the pack is ./gpu-check; a copy of the pack holds this script.
    [ -d "$pack/bin" ] || [ -d "$pack/model" ] || pack="$(cd "$here/.." && pwd)/gpu-check"
    local check_args=()
    while [ $# -gt 0 ]; do
        case "$1" in
        --model)
            model="$2"
            shift
            ;;
        --)
            shift
            check_args=("$@")
            break
            ;;
        -*) die "unknown option $1" ;;
        *) out="$1" ;;
        esac
        shift
    done
    [ -n "$out" ] || die "usage: gpu-check.sh run OUT [--model PATH] [-- CHECK-ARGS]"
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    stage="$STAGE"
    mkdir -p "$stage/bin"

    stage_binaries "$pack" "$stage" "${BINARIES[@]}"

    if [ -z "$model" ]; then
        stage_model "$pack" "$stage"
        model="$staged_model"
    fi

    export_cuda_libs
    log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    local missing
    missing="$(ldd "$stage/bin/pagoda-gpu-check" | awk '/not found/ {print $1}' | paste -sd' ')"
    [ -z "$missing" ] || die "libraries not found: $missing (libcuda.so.1 comes with the NVIDIA driver; the others with PyTorch cu130, the nvidia-*-cu13 wheels or a CUDA 13 toolkit in CUDA_HOME)"
    nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true

    set +e
    local tiny=()
    [ -d "$pack/tiny" ] && tiny=(--tiny-dir "$pack/tiny")
    "$stage/bin/pagoda-gpu-check" --model "$model" --server-binary "$stage/bin/pagoda" --out "$out" \
        "${tiny[@]}" "${check_args[@]}" 2>&1 | tee "$out/check.log"
    local status="${PIPESTATUS[0]}"
    set -e
    return "$status"
}

# Sourced (scripts/gpu-bench.sh uses the functions above), it runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    cmd="${1:-}"
    shift || true
    case "$cmd" in
    build) build "$@" ;;
    run) run "$@" ;;
    *)
        sed -n '2,22p' "$0" >&2
        exit 2
        ;;
    esac
fi
