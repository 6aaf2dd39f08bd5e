#!/usr/bin/env bash
# GPU check (one GPU, < 5 minutes): bf16 training steps per paradigm (SDPA, FlexAttention,
# torch.compile), cached = uncached decoding on CUDA, batch-1 decode speed of ar / bd3lm / setdlm
# and cached vs recompute with CUDA events, one set step vs one AR step eager and compiled (and
# compiled = eager), generate_batch throughput of ar and setdlm at batch 1 / 16 / 64 (rows =
# batch-1 rows).
# Writes metrics/bench/gpu.json. Usage: scripts/gpu_check.sh [extra args for setdiff.bench.gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" -m setdiff.bench.gpu --device cuda --dtype bfloat16 --size small "$@"
