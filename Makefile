# Public entry points: make models | make serve | make test | make lint  (see README.md)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
MODELS ?= models
HOST   ?= 127.0.0.1
PORT   ?= 50051
METRICS_PORT ?= 9464

.PHONY: venv models serve lint format test test-fast test-deploy bench bench-gpu protos clean train-translator train-generator train-mlm

venv: $(VENV)/.installed

# torch is installed first and pinned: 2.13.0 is the local CPU wheel (an unpinned torch pulls CUDA).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[export,dev]"
	touch $@

# The default model set: MiniLM embeddings + the shipped generator and translator, each through
# the parity gate. Skips models whose directory is already verified and up to date.
models: venv
	$(PY) -m export models --out $(MODELS)

serve: models
	$(PY) -m service --models $(MODELS) --host $(HOST) --port $(PORT) --metrics-port $(METRICS_PORT)

# Lint and types: what .ci/run checks before the tests (and .pre-commit-config.yaml on each commit).
LINTED := service export client bench tests
lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff check --fix $(LINTED)
	$(VENV)/bin/ruff format $(LINTED)

# The tests build their models in pytest's own process (tests/fixtures/models.py): malloc on
# transparent huge pages there too, as `python -m export` asks for itself (export/memory.py).
test test-fast: export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

test: venv
	$(PY) -m pytest -q -ra -m "not deploy" tests

test-fast: venv
	$(PY) -m pytest -q -ra -m "not slow and not deploy" tests

test-deploy: venv
	$(PY) -m pytest -q -ra -m deploy tests/deploy

bench: models
	$(PY) -m bench.embed_throughput --models $(MODELS)
	$(PY) -m bench.generate_throughput
	$(PY) -m bench.translate_throughput

# On a CUDA host (docs/design/gpu-benchmark.md; there PY=python3): docs/gpu-report.md + .json.
# Without a GPU it says so and exits 0.
bench-gpu:
	$(PY) -m bench.gpu --models $(MODELS)

# Retraining, one command per model (docs/training.md); writes runs/ then checkpoints/.
train-translator: venv
	$(PY) -m export train translator --time-budget-minutes 80 --threads 1

train-generator: venv
	$(PY) -m export train generator --time-budget-minutes 85 --threads 1

train-mlm: venv
	$(PY) -m export train mlm --bf16 --time-budget-minutes 68 --threads 1 --eval-every 2000

protos: venv
	$(PY) -m service.protogen

clean:
	rm -rf $(VENV) $(MODELS) .pytest_cache
