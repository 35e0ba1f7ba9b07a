#!/usr/bin/env bash
# The device check: what a GPU (or a Mac) shows that the CPU cannot, in one run of at most ten
# minutes on one GPU. Prints the machine, then runs bench/device_check.py (layout and claims,
# first samples, every loss, sampler against trainer, alone against fused, host syncs, speed
# against plain transformers and the matmul roofline, the SDK's whole surface against
# `python -m server --device cuda`, vLLM's status) for the tiny Gemma 3 and random models of
# Gemma 3 270M's and 1B's shapes.
#
#   bench/device_check.sh [OUT_DIR]          # default runs/device-check
#
# Environment: DEVICE (default cuda), SHAPES (default tiny,270m,1b), PYTHON (default python3),
# WHEELS: a folder of wheels to install first into a private target (a GPU machine without
# registry access: fetch them where pip works, copy them over).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/device-check}
mkdir -p "$out"
python=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TINKER_TELEMETRY=0 PYTHONUNBUFFERED=1
if [ -n "${WHEELS:-}" ]; then
  target=${TMPDIR:-/tmp}/device-check-site
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  echo "== machine"
  date -u
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  nproc; free -g | head -2
  echo "== checks"
  timeout "${CHECK_SECONDS:-540}" "$python" -m bench.device_check --device "${DEVICE:-cuda}" \
    --shapes "${SHAPES:-tiny,270m,1b}" --out "$out"
  echo "exit $?"
} 2>&1 | tee "$out/device_check.log"
