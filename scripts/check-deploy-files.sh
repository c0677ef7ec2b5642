#!/usr/bin/env bash
# Static checks of the deployment files, none of which needs a Docker engine:
#   - hadolint on docker/Dockerfile, docker/Dockerfile.cpu and docker/Dockerfile.router (any
#     finding fails);
#   - the router image pins the vllm-router the router tests run, and its entry point
#     (docker/router/start-router.sh) turns a name's addresses into vllm-router's worker URLs;
#   - docker/compose.yml: the compose-spec JSON schema, then `docker compose config` for each
#     profile (interpolation, merge keys, profiles, depends_on), then scripts/check-compose.py
#     (replicas, the router in front of them, every bind mount's source exists);
#   - configs/prometheus.yml with promtool;
#   - .github/workflows/*.yml against the GitHub workflow schema;
#   - deploy/kubernetes/*.yaml with scripts/check-k8s-manifests.py (kubernetes-validate, the
#     Prometheus Operator's ServiceMonitor schema, the vendored InferencePool CRD), whose
#     self-test also proves each validator rejects a broken manifest.
# The tools come from scripts/install-deploy-tools.sh. The running check of the same files
# (nginx + two replicas + Prometheus, and the routers) is the Rust test crates/server/tests/deploy.
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLS="${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}/bin"
NODE_TOOLS="${PAGODA_NODE_TOOLS_DIR:-$HOME/.cache/pagoda-node-tools}"
export PAGODA_NODE_TOOLS_DIR="$NODE_TOOLS" # for scripts/check-servicemonitor.mjs
for tool in hadolint docker-compose check-jsonschema kubernetes-validate; do
    [ -x "$TOOLS/$tool" ] || {
        echo "error: $TOOLS/$tool is missing: run scripts/install-deploy-tools.sh (make deploy-tools)" >&2
        exit 1
    }
done
for tool in promtool node; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool is missing: run scripts/install-deploy-tools.sh (make deploy-tools)" >&2
        exit 1
    }
done
[ -d "$NODE_TOOLS/node_modules/@kubernetes-models/prometheus-operator" ] || {
    echo "error: $NODE_TOOLS has no @kubernetes-models/prometheus-operator: run scripts/install-deploy-tools.sh (make deploy-tools)" >&2
    exit 1
}

step() { echo "== $*" >&2; }

step "hadolint docker/Dockerfile docker/Dockerfile.cpu docker/Dockerfile.router"
"$TOOLS/hadolint" --no-color docker/Dockerfile docker/Dockerfile.cpu docker/Dockerfile.router

step "router image: vllm-router version and entry point"
# The image pins the wheel in its pip line; the tests run the one in the requirements file.
image_pin=$(grep -o 'vllm-router==[0-9][0-9.]*' docker/Dockerfile.router || true)
tested_pin=$(grep -o '^vllm-router==[0-9][0-9.]*' scripts/router-tools-requirements.txt || true)
if [ -z "$image_pin" ] || [ "$image_pin" != "$tested_pin" ]; then
    echo "error: docker/Dockerfile.router installs '${image_pin:-nothing}', the router tests run '$tested_pin'" >&2
    exit 1
fi
# The entry point with a stand-in vllm-router that prints its arguments, on a name that
# resolves without a network (localhost: 127.0.0.1, and ::1 where the hosts file says so).
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
printf '#!/bin/sh\necho "$@"\n' >"$stub/vllm-router"
chmod +x "$stub/vllm-router"
sh -n docker/router/start-router.sh
started=$(PAGODA_REPLICAS_HOST=localhost PAGODA_REPLICAS_PORT=8123 PATH="$stub:$PATH" \
    sh docker/router/start-router.sh --policy cache_aware) || true
case $started in
    "--policy cache_aware --worker-urls "*http://127.0.0.1:8123*) ;;
    *)
        echo "error: docker/router/start-router.sh started: vllm-router $started" >&2
        exit 1
        ;;
esac

step "compose-spec schema: docker/compose.yml"
"$TOOLS/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yml

# `config` resolves variables from the environment; pin the ones the file reads so that a
# developer's own settings do not change what is checked.
compose_env=(env -u COMPOSE_PROFILES -u COMPOSE_FILE -u PAGODA_PORT -u PAGODA_CPU_IMAGE
    -u PAGODA_CUDA_IMAGE -u CUDA_COMPUTE_CAP -u HF_TOKEN -u PAGODA_ROUTER_PORT -u PAGODA_ROUTER_IMAGE)
for profile in cpu gpu; do
    step "docker compose --profile $profile config"
    rendered=$("${compose_env[@]}" "$TOOLS/docker-compose" -f docker/compose.yml --profile "$profile" \
        config --format json)
    python3 scripts/check-compose.py "$profile" <<<"$rendered"
done

step "promtool check config configs/prometheus.yml"
promtool check config configs/prometheus.yml

step "GitHub workflow schema: .github/workflows/*.yml"
"$TOOLS/check-jsonschema" --builtin-schema vendor.github-workflows .github/workflows/*.yml

step "Kubernetes manifests: deploy/kubernetes/*.yaml (and the validators' self-test)"
"$TOOLS/python" scripts/check-k8s-manifests.py --self-test

echo "deployment files: all checks passed" >&2
