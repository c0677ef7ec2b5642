# Shell helpers the benchmark scripts share (sourced, not run): start a server in the background,
# wait for its GET /health, stop it. One server at a time, its pid in $server_pid; a script
# that sources this sets `trap stop_server EXIT` so no server outlives it.

server_pid=""

# pagoda_binaries REPO: sets $pagoda and $bench to PAGODA_BIN and PAGODA_BENCH_BIN when both are
# set (binaries built elsewhere, e.g. an older commit's), else to a release build of both here.
pagoda_binaries() {
    if [ -n "${PAGODA_BIN:-}" ] && [ -n "${PAGODA_BENCH_BIN:-}" ]; then
        pagoda="$PAGODA_BIN"
        bench="$PAGODA_BENCH_BIN"
    else
        export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pagoda-target}"
        # The package set scripts/check_one_build.py (make script-check) keeps on make serve's compiled
        # dependencies: after either, this builds only the load generator's own crates.
        (cd "$1" && cargo build --release --locked -q -p pagoda-server -p pagoda-bench) >&2
        pagoda="$CARGO_TARGET_DIR/release/pagoda"
        bench="$CARGO_TARGET_DIR/release/pagoda-bench"
    fi
}

# GET /health on 127.0.0.1:PORT answers 2xx (curl, or python3 on hosts without curl).
server_healthy() {
    local url="http://127.0.0.1:$1/health"
    if command -v curl >/dev/null; then
        curl -sf "$url" >/dev/null 2>&1
    else
        python3 -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)' "$url" 2>/dev/null
    fi
}

# start_server PORT LOG CMD...: runs CMD in the background (output to LOG) and waits up to two
# minutes for its /health; returns 1 (nothing left running) if it exits or never gets ready.
start_server() {
    local port="$1" log_file="$2"
    shift 2
    "$@" >"$log_file" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 1200); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            wait "$server_pid" 2>/dev/null || true
            server_pid=""
            return 1
        fi
        server_healthy "$port" && return 0
        sleep 0.1
    done
    stop_server
    return 1
}

# Stops the server start_server started, if any, and waits for it to exit.
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
