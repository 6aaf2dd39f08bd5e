#!/usr/bin/env bash
# GPU check (one GPU, about 4 minutes: no section starts after --budget 230 s): cached = uncached
# decoding on CUDA, one set step vs one AR step eager and compiled (and compiled = eager), batch-1
# decode speed of ar / bd3lm / setdlm and cached vs recompute with CUDA events, bf16 training
# tokens/s and MFU of ar and setdlm (default and 12-layer sizes), bf16 training steps per paradigm
# (SDPA; setdlm also FlexAttention and torch.compile), generate_batch throughput of ar and setdlm
# at batch 1 / 16 / 64 (rows = batch-1 rows).
# Writes metrics/bench/gpu.json section by section, as each finishes (a cut run keeps them).
# Usage: scripts/gpu_check.sh [extra args for setdiff.bench.gpu]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" -m setdiff.bench.gpu --device cuda --dtype bfloat16 --size small "$@"
