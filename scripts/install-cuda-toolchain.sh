#!/usr/bin/env bash
# Installs a CUDA 13.0 toolkit from NVIDIA's PyPI wheels into a cache directory outside the repo,
# so that kernels/*.cu compile to PTX and `cargo build --features cuda` links on a machine without
# a GPU or a system CUDA install. Idempotent: a second run with the same set of wheels does nothing.
#
#   scripts/install-cuda-toolchain.sh            # everything `--features cuda` needs (nvcc, cuBLAS, ...)
#   scripts/install-cuda-toolchain.sh --ptx-only # only what `nvcc -ptx` needs (small; used by `make kernels`)
#   eval "$(scripts/install-cuda-toolchain.sh --env)"   # install if needed, then print exports
#
# The toolkit ends up in "$PAGODA_CUDA_DIR/site-packages/nvidia/cu13" (bin/nvcc, include, lib).
# PAGODA_CUDA_DIR defaults to ~/.cache/pagoda-cuda-13.0.
#
# Stay on CUDA 13.0: the GPU hosts we test on run a 13.0 driver, which refuses newer PTX.
set -euo pipefail

mode=full
print_env=0
for arg in "$@"; do
    case "$arg" in
    --ptx-only) mode=ptx ;;
    --env) print_env=1 ;;
    -h | --help)
        sed -n '2,12p' "$0"
        exit 0
        ;;
    *)
        echo "install-cuda-toolchain: unknown argument '$arg'" >&2
        exit 2
        ;;
    esac
done

root="${PAGODA_CUDA_DIR:-$HOME/.cache/pagoda-cuda-13.0}"
site="$root/site-packages"
cuda="$site/nvidia/cu13"
python="${PYTHON:-python3}"

# nvcc, its C runtime headers (crt), the NVVM backend (cicc, libdevice), the runtime headers and
# CCCL (cuda_fp16.h includes its <nv/target>) are all `nvcc -ptx` needs.
ptx_wheels=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.88
    nvidia-cuda-cccl==13.0.85
)
# candle's CUDA backend additionally links cuBLAS, cuRAND and NVRTC through cudarc.
full_wheels=(
    "${ptx_wheels[@]}"
    nvidia-cublas==13.0.2.14
    nvidia-curand==10.4.0.35
    nvidia-cuda-nvrtc==13.0.88
)

# One stamp records what is installed. A full install satisfies --ptx-only too; the reverse
# is not true, and pip's --target --upgrade replaces the shared nvidia/ folder wholesale, so
# every install lays down its complete set of wheels.
stamp="$root/.installed"
if [ "$mode" = ptx ]; then
    wheels=("${ptx_wheels[@]}")
else
    wheels=("${full_wheels[@]}")
fi
want="${wheels[*]}"
full="${full_wheels[*]}"

log() { echo "install-cuda-toolchain: $*" >&2; }

installed="$(cat "$stamp" 2>/dev/null || true)"
if [ -x "$cuda/bin/nvcc" ] && { [ "$installed" = "$want" ] || [ "$installed" = "$full" ]; }; then
    log "up to date in $cuda"
else
    mkdir -p "$site"
    log "installing ${wheels[*]} into $site"
    # --target keeps the wheels out of any Python environment; --upgrade lets a later full install
    # add to (and overwrite the shared files of) an earlier --ptx-only one.
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$site" "${wheels[@]}" >&2
    [ -x "$cuda/bin/nvcc" ] || { log "nvcc missing after install ($cuda/bin/nvcc)"; exit 1; }

    lib="$cuda/lib"
    mkdir -p "$lib"
    # The wheels ship only versioned sonames (libcublas.so.13, ...); the linker looks for the
    # unversioned names.
    for versioned in "$lib"/lib*.so.[0-9]*; do
        [ -e "$versioned" ] || continue
        base="$(basename "$versioned")"
        plain="${base%%.so.*}.so"
        [ -e "$lib/$plain" ] || ln -s "$base" "$lib/$plain"
    done

    # cudarc links libcuda dynamically, but libcuda belongs to the driver, which a build machine
    # without a GPU lacks. A stub with soname libcuda.so.1 satisfies the linker; at run time the
    # driver's real libcuda.so.1 is loaded instead. Every driver entry point the CUDA headers
    # declare becomes an empty function in it.
    if [ "$mode" = full ] && [ ! -e "$lib/stubs/libcuda.so" ]; then
        mkdir -p "$lib/stubs"
        header="$cuda/include/cuda.h"
        [ -f "$header" ] || { log "missing $header"; exit 1; }
        # cuda.h maps e.g. cuMemAlloc to cuMemAlloc_v2 with #defines; take both spellings.
        {
            grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' "$header" | sed -E 's/\s*\($//'
            grep -oE '#define\s+cu[A-Z][A-Za-z0-9_]*\s+cu[A-Z][A-Za-z0-9_]*' "$header" | awk '{print $2; print $3}'
        } | sort -u | awk '{print "void " $1 "(void) {}"}' >"$lib/stubs/libcuda_stub.c"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/stubs/libcuda.so" "$lib/stubs/libcuda_stub.c"
        rm -f "$lib/stubs/libcuda_stub.c"
    fi
    # Lets GPU-less unit tests of a --features cuda build start (LD_LIBRARY_PATH=$lib/stubs:$lib);
    # any actual driver call through the stub would be meaningless, so only tests that make
    # none may run that way.
    if [ "$mode" = full ] && [ ! -e "$lib/stubs/libcuda.so.1" ]; then
        ln -s libcuda.so "$lib/stubs/libcuda.so.1"
    fi
    if [ "$mode" = full ]; then
        # Only link time sees the stub; it stays out of any run-time library path.
        [ -e "$lib/libcuda.so" ] || ln -s stubs/libcuda.so "$lib/libcuda.so"
    fi
    echo "$want" >"$stamp"
    log "installed into $cuda ($("$cuda/bin/nvcc" --version | tail -n 2 | head -n 1))"
fi

if [ "$print_env" = 1 ]; then
    echo "export CUDA_HOME='$cuda'"
    echo "export CUDA_PATH='$cuda'"
    echo "export CUDA_ROOT='$cuda'"
    echo "export PATH='$cuda/bin':\"\$PATH\""
    echo "export LIBRARY_PATH='$cuda/lib'\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
    echo "export CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90}"
fi
