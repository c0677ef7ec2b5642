#!/bin/sh
# Entry point of the compose stack's `router` service (docker/Dockerfile.router): looks up every
# Pagoda replica behind one name and starts vllm-router in front of all of them.
#   PAGODA_REPLICAS_HOST  the name to resolve (default `replicas`, the compose network alias
#                         every replica joins; Docker's DNS answers with one address per replica)
#   PAGODA_REPLICAS_PORT  the replicas' port (default 8000)
# Its arguments are passed to vllm-router as they are (the policy, its own port, ...), followed
# by `--worker-urls` and one URL per address.
#
# vllm-router takes a fixed list of workers, so the lookup happens once, here: compose starts
# this container after every replica is healthy (depends_on), and after scaling the replicas
# `docker compose restart router` looks them up again, as nginx needs a reload.
set -eu

host=${PAGODA_REPLICAS_HOST:-replicas}
port=${PAGODA_REPLICAS_PORT:-8000}
case $port in
    '' | *[!0-9]*)
        echo "error: PAGODA_REPLICAS_PORT must be a port number, got '$port'" >&2
        exit 1
        ;;
esac

# `getent ahosts` prints each address once per socket type: keep every address once, sorted so
# the worker order is the same on each start.
addresses=$(getent ahosts "$host" | awk '{ print $1 }' | sort -u) || true
if [ -z "$addresses" ]; then
    echo "error: '$host' resolves to no address: are the replicas up?" >&2
    exit 1
fi
urls=
for address in $addresses; do
    case $address in
        *:*) address="[$address]" ;; # IPv6 in a URL needs brackets
    esac
    urls="$urls http://$address:$port"
done
echo "vllm-router in front of:$urls" >&2
# $urls is split on purpose: one argument per worker (addresses hold no spaces).
# shellcheck disable=SC2086
exec vllm-router "$@" --worker-urls $urls
