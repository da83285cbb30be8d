#!/usr/bin/env bash
# One command on a single-GPU machine with internet access (H200 or H100):
#   bash benchmarks/gpu/validate_business_case.sh [OUT]
# installs vllm==0.32.0 and this project into .venv-gpu, then runs the live business case
# (stock fcfs vs pipeline+fixes over HTTP, Llama-3-8B shape, dummy weights) and fits the
# replay's step-cost model to the live steps. About 8 minutes on an H200; see docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-${OUT:-out}/gpu-validation}"
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install --quiet --upgrade pip
.venv-gpu/bin/pip install --quiet -e '.[gpu]' tqdm matplotlib
.venv-gpu/bin/python -m benchmarks.gpu.validate --out "$OUT"
