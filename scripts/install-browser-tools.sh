#!/usr/bin/env bash
# Installs what the web UI's browser test needs: headless Chromium and its chromedriver from
# Debian's packages (apt-get, as root or with sudo), and Selenium (PyPI, pinned with its
# dependencies in scripts/browser-requirements.txt) into a virtual environment of its own at
# $PAGODA_TOOLS_DIR/browser (default ~/.cache/pagoda-tools/browser).
# The end-to-end test crates/server/tests/e2e/web_ui.rs runs tests/browser/check_web_ui.py with it.
# Idempotent: a second run installs nothing and prints nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLS_DIR="${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}"
VENV="$TOOLS_DIR/browser"
REQUIREMENTS="scripts/browser-requirements.txt"

die() {
    echo "error: $*" >&2
    exit 1
}

[ -f "$REQUIREMENTS" ] || die "$REQUIREMENTS is missing"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "installing Debian packages needs root or sudo: $*"
    fi
}

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "chromium and chromedriver are missing and there is no apt-get to install them"
    echo "installing Debian packages: chromium chromium-driver" >&2
    as_root apt-get update -qq || die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-liberation >/dev/null || die "apt-get install chromium chromium-driver failed"
    command -v chromium >/dev/null 2>&1 || die "chromium is still missing after apt-get install"
    command -v chromedriver >/dev/null 2>&1 || die "chromedriver is still missing after apt-get install"
fi

stamp="$VENV/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS" && [ -x "$VENV/bin/python" ] \
    && "$VENV/bin/python" -c 'import selenium' >/dev/null 2>&1; then
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 is missing: the browser test is a Python script"
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 \
        || die "python3 cannot make virtual environments, and there is no apt-get here to install python3-venv"
    echo "installing Debian packages: python3-venv" >&2
    as_root apt-get update -qq || die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3-venv >/dev/null || die "apt-get install python3-venv failed"
fi

echo "installing Selenium into $VENV" >&2
mkdir -p "$TOOLS_DIR" || die "cannot create $TOOLS_DIR"
python3 -m venv --clear "$VENV" || die "python3 -m venv $VENV failed"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
"$VENV/bin/python" -c 'import selenium' || die "$VENV lacks selenium after pip install"
cp "$REQUIREMENTS" "$stamp"
