#!/bin/sh
# Renders docker/nginx/pagoda.conf.template into a usable nginx config snippet:
#   PAGODA_UPSTREAMS  replica addresses, space-separated host:port (a compose service name
#                     such as `replicas:8000` stands for every replica behind it)
#   PAGODA_LB_PORT    the port nginx listens on (default 8000)
# The line holding ${PAGODA_UPSTREAM} is written once per address. The compose stack runs this
# in the nginx container before nginx starts; the local stack test (crates/server/tests/deploy)
# runs the same script on the same template, so both use one config.
#
# Usage: PAGODA_UPSTREAMS="127.0.0.1:8001 127.0.0.1:8002" render-conf.sh TEMPLATE OUTPUT
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: PAGODA_UPSTREAMS='host:port ...' [PAGODA_LB_PORT=8000] $0 TEMPLATE OUTPUT" >&2
    exit 2
fi
template=$1
output=$2
upstreams=${PAGODA_UPSTREAMS:?set PAGODA_UPSTREAMS to the replicas\' host:port addresses}
port=${PAGODA_LB_PORT:-8000}

case $port in
    '' | *[!0-9]*)
        echo "error: PAGODA_LB_PORT must be a port number, got '$port'" >&2
        exit 1
        ;;
esac
for address in $upstreams; do
    case $address in
        *:[0-9]*) ;;
        *)
            echo "error: '$address' in PAGODA_UPSTREAMS is not host:port" >&2
            exit 1
            ;;
    esac
done

# Comment lines are copied as they are.
awk -v upstreams="$upstreams" -v port="$port" '
    /^[[:space:]]*#/ { print; next }
    index($0, "${PAGODA_UPSTREAM}") {
        n = split(upstreams, address, " ")
        for (i = 1; i <= n; i++) {
            line = $0
            sub(/\$\{PAGODA_UPSTREAM\}/, address[i], line)
            print line
        }
        next
    }
    { gsub(/\$\{PAGODA_LB_PORT\}/, port); print }
' "$template" >"$output.tmp"

if grep -n 'PAGODA_' "$output.tmp" | grep -v '^[0-9]*:[[:space:]]*#' >&2; then
    echo "error: placeholders left unrendered in $output (above)" >&2
    rm -f "$output.tmp"
    exit 1
fi
mv "$output.tmp" "$output"
