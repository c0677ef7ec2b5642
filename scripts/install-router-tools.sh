#!/usr/bin/env bash
# Installs the routers the router tests put in front of Pagoda replicas, sglang-router and
# vllm-router (PyPI wheels, pinned in scripts/router-tools-requirements.txt), into a virtual
# environment at $PAGODA_ROUTERS_DIR (default ~/.cache/pagoda-routers), and fails loudly when it
# cannot. Idempotent: a second run installs nothing and prints nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
ROUTERS_DIR="${PAGODA_ROUTERS_DIR:-$HOME/.cache/pagoda-routers}"
REQUIREMENTS="scripts/router-tools-requirements.txt"

die() {
    echo "error: $*" >&2
    exit 1
}

stamp="$ROUTERS_DIR/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS" \
    && [ -x "$ROUTERS_DIR/bin/vllm-router" ] && [ -x "$ROUTERS_DIR/bin/sglang-router" ]; then
    exit 0
fi
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
    || die "python3 cannot make virtual environments: run scripts/install-deploy-tools.sh (it installs python3-venv)"
echo "installing sglang-router and vllm-router into $ROUTERS_DIR" >&2
python3 -m venv --clear "$ROUTERS_DIR" || die "python3 -m venv $ROUTERS_DIR failed"
"$ROUTERS_DIR/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
for tool in vllm-router sglang-router; do
    [ -x "$ROUTERS_DIR/bin/$tool" ] || die "$ROUTERS_DIR/bin/$tool is missing after pip install"
done
"$ROUTERS_DIR/bin/python" -c 'import sglang_router.launch_router' \
    || die "sglang_router.launch_router does not import"
cp "$REQUIREMENTS" "$stamp"
