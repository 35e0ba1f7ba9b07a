"""`python -m tools.rehearsal single-gpu|split [--trainers N] [--steps N] [--model DIR]
[--redis-outage SECONDS] [--device cuda|cpu]`:
rehearse an overlay here and print its timeline (see `scenario.py`)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tools.gemma_shapes import build_model
from tools.rehearsal import scenario


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.rehearsal", description=__doc__)
    parser.add_argument("overlay", choices=("single-gpu", "split"))
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", type=Path, default=None,
                        help="a local model directory (default: a tiny random Gemma 3)")
    parser.add_argument("--redis-outage", type=float, default=scenario.REDIS_OUTAGE_SECONDS,
                        help="seconds the split rehearsal's Redis stays away (default: "
                             "%(default)s: a Redis pod rescheduled with its disk)")
    parser.add_argument("--device", choices=tuple(scenario.DEVICE_ARGS), default="cuda",
                        help="what the manifests' GPU flags become: the CUDA layout emulated "
                             "on the CPU (default) or the CPU's fp32")
    parser.add_argument("--keep", action="store_true", help="keep the volumes and logs")
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = build_model(Path(tempfile.mkdtemp(prefix="tiny-gemma-")) / "model")
    if args.overlay == "split":
        rehearsal = scenario.split(model, args.steps, trainers=args.trainers,
                                   redis_outage=args.redis_outage, device=args.device)
    else:
        rehearsal = scenario.single_gpu(model, args.steps, device=args.device)
    try:
        print(rehearsal.report())
    finally:
        rehearsal.cluster.close()
        print(f"volumes and logs: {rehearsal.cluster.root}")
        if not args.keep:
            shutil.rmtree(rehearsal.cluster.root, ignore_errors=True)


if __name__ == "__main__":
    main()
