#!/usr/bin/env bash
# GPU check (one GPU, < 5 minutes): bf16 training steps per paradigm, cached = uncached decoding
# on CUDA, batch-1 decode speed of ar / bd3lm / setdlm with CUDA events.
# Writes metrics/bench/gpu.json. Usage: scripts/gpu_check.sh [extra args for setdiff.bench.gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" -m setdiff.bench.gpu --device cuda --dtype bfloat16 --size small "$@"
