#!/usr/bin/env bash
# Static checks of the deployment files, none of which needs a Docker engine:
#   - hadolint on docker/Dockerfile and docker/Dockerfile.cpu (any finding fails);
#   - docker/compose.yml: the compose-spec JSON schema, then `docker compose config` for each
#     profile (interpolation, merge keys, profiles, depends_on), then every bind mount's source
#     exists in the repository (so the stack mounts files that are really there);
#   - configs/prometheus.yml with promtool;
#   - .github/workflows/*.yml against the GitHub workflow schema.
# The tools come from scripts/install-deploy-tools.sh. The running check of the same files
# (nginx + two replicas + Prometheus) is the Rust test crates/server/tests/deploy.
set -euo pipefail

cd "$(dirname "$0")/.."
TOOLS="${PAGODA_TOOLS_DIR:-$HOME/.cache/pagoda-tools}/bin"
for tool in hadolint docker-compose check-jsonschema; do
    [ -x "$TOOLS/$tool" ] || {
        echo "error: $TOOLS/$tool is missing: run scripts/install-deploy-tools.sh (make deploy-tools)" >&2
        exit 1
    }
done
command -v promtool >/dev/null || {
    echo "error: promtool is missing: run scripts/install-deploy-tools.sh (make deploy-tools)" >&2
    exit 1
}

step() { echo "== $*" >&2; }

step "hadolint docker/Dockerfile docker/Dockerfile.cpu"
"$TOOLS/hadolint" --no-color docker/Dockerfile docker/Dockerfile.cpu

step "compose-spec schema: docker/compose.yml"
"$TOOLS/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yml

# `config` resolves variables from the environment; pin the ones the file reads so that a
# developer's own settings do not change what is checked.
compose_env=(env -u COMPOSE_PROFILES -u COMPOSE_FILE -u PAGODA_PORT -u PAGODA_CPU_IMAGE
    -u PAGODA_CUDA_IMAGE -u CUDA_COMPUTE_CAP -u HF_TOKEN)
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

echo "deployment files: all checks passed" >&2
