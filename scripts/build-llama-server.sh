#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only, Release, -march=native) from the llama.cpp source
# vendored in the PyPI sdist of llama-cpp-python, pinned below by version and sha256, into
# $PAGODA_LLAMACPP_DIR (default ~/.cache/pagoda-llamacpp):
#   $DIR/dl/     the downloaded sdist (kept, re-verified on use)
#   $DIR/src/    the extracted sdist (llama.cpp is its vendor/llama.cpp)
#   $DIR/build/  the cmake build tree
#   $DIR/cmake-venv/  pinned cmake from PyPI, only when the system has no cmake >= 3.14
#   $DIR/bin/llama-server  the binary (statically linked against llama/ggml, so it can be copied)
# Progress goes to stderr; the last (and only) line on stdout is the binary's path, so
#   LLAMA_SERVER=$(scripts/build-llama-server.sh)
# works. Idempotent: a stamp file records what was built; a second run builds nothing.
# Needs: python3 (with venv when no cmake is installed), a C/C++ compiler, make, tar, and access
# to PyPI. The build takes a while on 2 cores (set PAGODA_LLAMACPP_JOBS to change -j2).
# Note: the binary is built for this CPU (GGML_NATIVE=ON) and may not run on another. With
# PAGODA_LLAMACPP_ISA=avx2 it is built for AVX2 CPUs instead (AVX2, FMA, F16C; no AVX-512, no
# AVX-VNNI), into llama-server-avx2 beside it: on an AVX-512 box it then runs the kernels an AMD
# Zen 2/3 would, as Pagoda's do under PAGODA_CPU_ISA=avx2 (scripts/bench-vs-llamacpp.sh --isa avx2).
# At run time, on VMs that refuse AMX, pass --no-repack (this version has it: -nr/--no-repack).
set -euo pipefail

LCP_VERSION="0.3.36"
LCP_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The llama.cpp commit that llama-cpp-python 0.3.36 vendors (from its CHANGELOG.md); the sdist
# has no .git, so it is passed to cmake for `llama-server --version`.
LLAMA_CPP_COMMIT="0c1e57098"
CMAKE_PIP_VERSION="3.31.10"   # only used when the system has no cmake >= 3.14
CMAKE_MIN="3.14"
JOBS="${PAGODA_LLAMACPP_JOBS:-2}"

DIR="${PAGODA_LLAMACPP_DIR:-$HOME/.cache/pagoda-llamacpp}"
SDIST_NAME="llama_cpp_python-$LCP_VERSION.tar.gz"
SRC_DIR="$DIR/src/llama_cpp_python-$LCP_VERSION"
LLAMA_DIR="$SRC_DIR/vendor/llama.cpp"
ISA="${PAGODA_LLAMACPP_ISA:-native}"
case "$ISA" in
    native) SUFFIX="" ;;
    avx2) SUFFIX="-avx2" ;;
    *) echo "build-llama-server: error: PAGODA_LLAMACPP_ISA must be native or avx2, not $ISA" >&2; exit 1 ;;
esac
BUILD_DIR="$DIR/build/llama_cpp_python-$LCP_VERSION$SUFFIX"
BIN="$DIR/bin/llama-server$SUFFIX"
STAMP="$DIR/.llama-server$SUFFIX.stamp"

CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF          # one self-contained binary, no rpath into the build tree
    -DGGML_NATIVE="$([ "$ISA" = native ] && echo ON || echo OFF)"
    -DGGML_CUDA=OFF
    -DLLAMA_CURL=OFF                 # deprecated (ignored, with a warning) in this version
    -DLLAMA_OPENSSL=OFF              # no HTTPS: the server is local, models are local files
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON           # tools/server lives under tools/ in this version
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF             # no npm build of the web UI...
    -DLLAMA_USE_PREBUILT_UI=OFF      # ...and no download of it from Hugging Face: no web UI
    -DLLAMA_BUILD_NUMBER=0
    "-DLLAMA_BUILD_COMMIT=$LLAMA_CPP_COMMIT"
)
if [ "$ISA" = avx2 ]; then
    CMAKE_FLAGS+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
        -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF)
fi
# What the stamp records: a change to any of it rebuilds.
STAMP_TEXT="llama-cpp-python==$LCP_VERSION sha256=$LCP_SHA256 llama.cpp@$LLAMA_CPP_COMMIT flags: ${CMAKE_FLAGS[*]}"

die() {
    echo "build-llama-server: error: $*" >&2
    exit 1
}
log() { echo "build-llama-server: $*" >&2; }

# --- already built? ----------------------------------------------------------------------------
if [ -f "$STAMP" ] && [ -x "$BIN" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
    echo "$BIN"
    exit 0
fi

# --- prerequisites -----------------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || die "python3 is needed (to read PyPI metadata and download the sdist)"
command -v tar >/dev/null 2>&1 || die "tar is needed to extract the sdist"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is needed to verify the sdist"
command -v make >/dev/null 2>&1 || die "make is needed (apt-get install build-essential)"
command -v "${CC:-cc}" >/dev/null 2>&1 || die "no C compiler (${CC:-cc}); apt-get install build-essential"
command -v "${CXX:-c++}" >/dev/null 2>&1 || die "no C++ compiler (${CXX:-c++}); apt-get install build-essential"

mkdir -p "$DIR" || die "cannot create $DIR"
# One build at a time per cache dir.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.lock"
    flock 9 || die "cannot lock $DIR/.lock"
    # Another run may have finished the build while this one waited.
    if [ -f "$STAMP" ] && [ -x "$BIN" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
        echo "$BIN"
        exit 0
    fi
fi

# --- sdist: download and verify ----------------------------------------------------------------
# From PyPI's JSON API rather than `pip download --no-binary :all:`: pip would prepare the sdist's
# metadata, which installs its build requirements (scikit-build-core, cmake, ninja) from source
# because of --no-binary :all: -- building cmake itself, for many minutes, just to download a file.
sdist="$DIR/dl/$SDIST_NAME"
sha_ok() { echo "$LCP_SHA256  $1" | sha256sum --check --status; }
if [ -f "$sdist" ] && sha_ok "$sdist"; then
    log "using the downloaded $SDIST_NAME (sha256 ok)"
else
    mkdir -p "$DIR/dl"
    log "downloading $SDIST_NAME from PyPI"
    python3 - "$LCP_VERSION" "$LCP_SHA256" "$sdist.part" <<'PY' || die "download of llama-cpp-python==$LCP_VERSION failed (see above)"
import json, sys, urllib.parse, urllib.request

version, pinned_sha, dest = sys.argv[1:4]
meta_url = "https://pypi.org/pypi/llama-cpp-python/json"
with urllib.request.urlopen(meta_url, timeout=120) as r:
    meta = json.load(r)
files = [f for f in meta.get("releases", {}).get(version, []) if f.get("packagetype") == "sdist"]
if not files:
    sys.exit(f"PyPI lists no sdist for llama-cpp-python=={version}")
f = files[0]
meta_sha = f["digests"]["sha256"]
if meta_sha != pinned_sha:
    sys.exit(f"PyPI's sha256 for {f['filename']} is {meta_sha}, the script pins {pinned_sha}")
url = urllib.parse.urljoin(meta_url, f["url"])  # some PyPI mirrors give relative URLs
with urllib.request.urlopen(url, timeout=600) as r, open(dest, "wb") as out:
    while chunk := r.read(1 << 20):
        out.write(chunk)
print(f"fetched {url}", file=sys.stderr)
PY
    sha_ok "$sdist.part" \
        || { rm -f "$sdist.part"; die "sha256 of the downloaded $SDIST_NAME is not $LCP_SHA256 (the pin and PyPI's metadata)"; }
    mv "$sdist.part" "$sdist"
    log "sha256 ok: $LCP_SHA256"
fi

# --- extract -----------------------------------------------------------------------------------
if [ ! -f "$SRC_DIR/.extracted" ]; then
    log "extracting $SDIST_NAME"
    rm -rf "$SRC_DIR" "$SRC_DIR.tmp"
    mkdir -p "$SRC_DIR.tmp"
    tar -xzf "$sdist" -C "$SRC_DIR.tmp" || die "cannot extract $sdist"
    [ -d "$SRC_DIR.tmp/llama_cpp_python-$LCP_VERSION" ] \
        || die "$SDIST_NAME has no top-level llama_cpp_python-$LCP_VERSION/ directory"
    mv "$SRC_DIR.tmp/llama_cpp_python-$LCP_VERSION" "$SRC_DIR"
    rmdir "$SRC_DIR.tmp"
    touch "$SRC_DIR/.extracted"
fi
[ -f "$LLAMA_DIR/CMakeLists.txt" ] || die "no vendored llama.cpp at $LLAMA_DIR (vendor/llama.cpp/CMakeLists.txt missing)"
[ -f "$LLAMA_DIR/tools/server/CMakeLists.txt" ] || die "the vendored llama.cpp has no tools/server"
grep -q "llama.cpp@$LLAMA_CPP_COMMIT" "$SRC_DIR/CHANGELOG.md" 2>/dev/null \
    || log "warning: CHANGELOG.md does not mention llama.cpp@$LLAMA_CPP_COMMIT"

# --- cmake -------------------------------------------------------------------------------------
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
cmake_version() { "$1" --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p' | head -n1; }
CMAKE=""
if command -v cmake >/dev/null 2>&1; then
    v=$(cmake_version cmake)
    if [ -n "$v" ] && version_ge "$v" "$CMAKE_MIN"; then
        CMAKE=$(command -v cmake)
        log "using the system cmake $v ($CMAKE)"
    else
        log "the system cmake (${v:-unknown version}) is older than $CMAKE_MIN; using a pinned one"
    fi
fi
if [ -z "$CMAKE" ]; then
    venv="$DIR/cmake-venv"
    CMAKE="$venv/bin/cmake"
    if [ "$(cmake_version "$CMAKE")" != "$CMAKE_PIP_VERSION" ]; then
        log "installing cmake==$CMAKE_PIP_VERSION (PyPI wheel) into $venv"
        rm -rf "$venv"
        python3 -m venv "$venv" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
            "cmake==$CMAKE_PIP_VERSION" || die "pip install cmake==$CMAKE_PIP_VERSION failed"
    fi
    [ "$(cmake_version "$CMAKE")" = "$CMAKE_PIP_VERSION" ] || die "$CMAKE does not run or is not $CMAKE_PIP_VERSION"
    log "using cmake $CMAKE_PIP_VERSION ($CMAKE)"
fi

# --- configure and build -----------------------------------------------------------------------
# Keep llama.cpp's build-info from asking git about a repository that encloses the cache dir.
export GIT_CEILING_DIRECTORIES="$DIR"
start=$(date +%s)
log "configuring $LLAMA_DIR -> $BUILD_DIR"
"$CMAKE" -S "$LLAMA_DIR" -B "$BUILD_DIR" -G "Unix Makefiles" "${CMAKE_FLAGS[@]}" >&2 \
    || die "cmake configure failed (flags: ${CMAKE_FLAGS[*]})"
log "building llama-server with -j$JOBS (this takes a while)"
"$CMAKE" --build "$BUILD_DIR" --target llama-server -j "$JOBS" >&2 \
    || die "building the llama-server target failed (build tree: $BUILD_DIR)"
built="$BUILD_DIR/bin/llama-server"
[ -x "$built" ] || die "the build finished but $built is missing"
log "built in $(( $(date +%s) - start ))s"

# --- install -----------------------------------------------------------------------------------
mkdir -p "$DIR/bin"
cp "$built" "$BIN.tmp" && mv -f "$BIN.tmp" "$BIN" || die "cannot place the binary at $BIN"
version_out=$("$BIN" --version 2>&1) || die "$BIN --version failed: $version_out"
log "$(echo "$version_out" | tr '\n' ' ')"
help_out=$("$BIN" --help 2>&1) || die "$BIN --help failed"
if grep -q -- '--no-repack' <<<"$help_out"; then
    log "this llama-server has --no-repack (pass it on VMs that refuse AMX)"
fi
echo "$STAMP_TEXT" >"$STAMP"
echo "$BIN"
