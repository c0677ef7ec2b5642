#!/usr/bin/env bash
# Compiles every kernels/*.cu to PTX for sm_80 and sm_90 with nvcc 13.0 (warnings are errors),
# then assembles each PTX with ptxas for its target, printing registers, shared memory and
# spills per entry point. Needs no GPU: the compiler comes from NVIDIA's PyPI wheels
# (scripts/install-cuda-toolchain.sh --ptx-only, installed on first use into a cache).
#
#   scripts/compile-kernels.sh [OUT_DIR]     (default: $CARGO_TARGET_DIR/kernels or /tmp)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${CARGO_TARGET_DIR:-/tmp}/kernels}"
mkdir -p "$out"
eval "$("$repo/scripts/install-cuda-toolchain.sh" --ptx-only --env)"

status=0
for source in "$repo"/kernels/*.cu; do
    stem="$(basename "$source" .cu)"
    for arch in sm_80 sm_90; do
        ptx="$out/$stem.$arch.ptx"
        if ! nvcc -ptx -std=c++17 -O3 -Werror all-warnings -lineinfo "-arch=$arch" -o "$ptx" "$source"; then
            echo "compile-kernels: nvcc failed on $stem for $arch" >&2
            status=1
            continue
        fi
        if ! ptxas "-arch=$arch" -v -o "$out/$stem.$arch.cubin" "$ptx" 2>"$out/$stem.$arch.ptxas.log"; then
            cat "$out/$stem.$arch.ptxas.log" >&2
            echo "compile-kernels: ptxas failed on $stem for $arch" >&2
            status=1
            continue
        fi
        entries="$(grep -c "Compiling entry function" "$out/$stem.$arch.ptxas.log" || true)"
        spills="$(grep -o '[0-9]* bytes spill stores' "$out/$stem.$arch.ptxas.log" | awk '{s += $1} END {print s + 0}')"
        max_regs="$(grep -o 'Used [0-9]* registers' "$out/$stem.$arch.ptxas.log" | awk '$2 > m {m = $2} END {print m + 0}')"
        printf 'compile-kernels: %-26s %s  %3d entry points, at most %3d registers, %d bytes of spill stores\n' \
            "$stem" "$arch" "$entries" "$max_regs" "$spills"
    done
done
exit "$status"
