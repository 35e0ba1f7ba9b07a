"""What batch invariance costs, and whether it holds, on the embedded model, in one run.

The engine is batch-invariant by default (`server/engine/invariance.py`,
`invariant_attention.py`): each training job keeps its own micro-batches (fused into shared
body passes), prefill and decoding stay fused, with fixed-tile fp32 products and
position-aligned attention. This benchmark
toggles `Engine.batch_invariant` on one loaded model, so everything else is equal, and prints:

1. whether it holds: one run's RL step (8 prompts x 8 samples, then forward_backward) alone and
   fused with three other runs' requests and jobs, compared bit for bit, invariance on and off;
2. the RL step of `bench_rl_step.py` (8 prompts of the SQL corpus x 8 samples x 64 new tokens,
   rank-16 LoRA, `importance_sampling`, one AdamW step), on and off, alternating step by step,
   with its GFLOP/s as a fraction of this machine's matmul roofline measured in the same run;
3. the many-runs speed-up, on and off: (a) `bench_multirun.py fusion-sampling`'s workload
   through the SDK against an in-process server (4 runs x 4 prompts x 8 samples x 16 tokens,
   the runs' clients concurrent vs one run after another), and (b) 4 runs' whole RL steps
   (4 prompts x 8 samples x 32 tokens, then training) fused into one engine call per phase vs
   run by run, which shows what fusing buys the engine itself once steps are compute-bound;
4. the sampler-trainer gap at step 0 (the same weights), on and off.

    python -m bench.bench_invariance               # about 9 minutes on 2 cores
    python -m bench.bench_invariance --steps 1     # shorter
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from bench.bench_rl_step import rollout_data, sample_jobs
from bench.bench_roofline import (
    TRAIN_WIDTH,
    Shapes,
    roofline,
    sampled_flops,
    sampler_trainer_kl,
    train_flops,
)
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from sqltasks import load_corpus

MODES = {"invariant": True, "fused": False}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rl_step(engine: Engine, state, prompts, group: int, max_tokens: int, seed: int):
    """Sample the groups, train on them: `(results, fb result, sample s, train s)`."""
    started = time.perf_counter()
    results = engine.sample(sample_jobs(state.adapter.frozen_copy(), prompts, group,
                                        max_tokens, seed))
    sampled = time.perf_counter()
    data = rollout_data(prompts, results, seed=seed)
    fb = engine.forward_backward([ForwardBackwardJob(state, data, "importance_sampling", {},
                                                     False)])[0]
    engine.optim_step(state, AdamParams(learning_rate=1e-4))
    return results, data, fb, sampled - started, time.perf_counter() - sampled


def fingerprint(results, fb, state) -> tuple:
    """Everything one step of a run produced, as exact bytes."""
    tokens = [tuple(s.tokens) for r in results for s in r.sequences]
    logprobs = [np.asarray(s.logprobs, np.float32).tobytes() for r in results for s in r.sequences]
    trained = [o["logprobs"].tobytes() for o in fb.outputs]
    weights = b"".join(t.detach().numpy().tobytes() for t in state.adapter.parameters())
    return tokens, logprobs, trained, fb.metrics["loss:sum"], weights


def holds(engine: Engine, prompts, others: list[list[int]]) -> tuple[bool, str]:
    """Run 0's step alone, then fused with three runs on other prompts; compare the bits."""
    def once(fused: bool):
        runs = [engine.create_run(LoraSpec(rank=16), seed=s) for s in range(4 if fused else 1)]
        assigned = [prompts] + [others[k::3] for k in range(len(runs) - 1)]
        jobs = sample_jobs(runs[0].adapter.frozen_copy(), prompts, 8, 32, 5)
        for k, run in enumerate(runs[1:]):
            jobs += sample_jobs(run.adapter.frozen_copy(), assigned[k + 1], 8 - 2 * k, 48, 9 + k)
        results = engine.sample(jobs)
        offsets = np.cumsum([0] + [len(a) for a in assigned]).tolist()
        fb_jobs = [
            ForwardBackwardJob(run, rollout_data(a, results[offsets[k] : offsets[k + 1]], 5 + k),
                               "importance_sampling", {}, False)
            for k, (run, a) in enumerate(zip(runs, assigned))
        ]
        fb = engine.forward_backward(fb_jobs)[0]
        engine.optim_step(runs[0], AdamParams(learning_rate=1e-4))
        return fingerprint(results[: len(prompts)], fb, runs[0])

    alone, fused = once(False), once(True)
    seqs = sum(a != b for a, b in zip(alone[0], fused[0]))
    lps = sum(a != b for a, b in zip(alone[1], fused[1]))
    same = alone == fused
    detail = (f"{seqs}/{len(alone[0])} sampled sequences differ, {lps} logprob rows differ, "
              f"loss {alone[3]:.9g} vs {fused[3]:.9g}, weights after the step "
              f"{'equal' if alone[4] == fused[4] else 'differ'}")
    if seqs == 0:
        trained = sum(a != b for a, b in zip(alone[2], fused[2]))
        detail += f", {trained} trained logprob rows differ"
    return same, detail


def fused_round(engine: Engine, runs, per_run, seed: int) -> None:
    """Every run's sampling in one engine call, every run's training in one, then the steps:
    what the scheduler forms when the runs' requests arrive together."""
    jobs = [job for run, ps in zip(runs, per_run)
            for job in sample_jobs(run.adapter.frozen_copy(), ps, 8, 32, seed)]
    results = engine.sample(jobs)
    offsets = np.cumsum([0] + [len(ps) for ps in per_run]).tolist()
    engine.forward_backward([
        ForwardBackwardJob(run, rollout_data(ps, results[offsets[k] : offsets[k + 1]], seed),
                           "importance_sampling", {}, False)
        for k, (run, ps) in enumerate(zip(runs, per_run))
    ])
    for run in runs:
        engine.optim_step(run, AdamParams(learning_rate=1e-4))


def sequential_round(engine: Engine, runs, per_run, seed: int) -> None:
    """The same work, one run's step after another."""
    for run, ps in zip(runs, per_run):
        rl_step(engine, run, ps, 8, 32, seed)


def sdk_speedups(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Median seconds of (concurrent, one after another) per mode, on one served engine."""
    from tinker import types

    from bench import bench_multirun as multirun

    multirun.quiet()
    settings = argparse.Namespace(model=args.model, quick=False, reward_seconds=None)
    with multirun.bench_server(settings) as bench:
        samplers = [c.save_weights_and_get_sampling_client().result()
                    for c in bench.new_runs(4)]
        prompts = [types.ModelInput.from_ints(bench.encode(p)) for p in multirun.PROMPTS[:4]]
        params = types.SamplingParams(max_tokens=16, temperature=1.0, seed=7, stop=[])

        def one_run(sampler) -> None:
            for future in [sampler.sample(p, 8, params) for p in prompts]:
                future.result()

        def concurrent() -> None:
            with ThreadPoolExecutor(len(samplers)) as pool:
                list(pool.map(one_run, samplers))

        one_run(samplers[0])  # warm-up
        seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
        for _ in range(2):
            for mode, flag in MODES.items():
                bench.engine.batch_invariant = flag
                t0 = time.perf_counter()
                concurrent()
                t1 = time.perf_counter()
                for sampler in samplers:
                    one_run(sampler)
                seconds[mode].append((t1 - t0, time.perf_counter() - t1))
    return {mode: (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
            for mode, rows in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=2, help="measured RL steps per mode")
    args = parser.parse_args()
    started = time.time()
    loaded = load_base_model(args.model, "cpu", None)
    engine = Engine(loaded)
    shapes = Shapes.of(engine.model.config)
    print(f"model {engine.model_name} ({engine.dtype}, {loaded.dtype_reason}); threads "
          f"{torch.get_num_threads()}; cpus {os.cpu_count()}; load average {load()}")
    corpus = load_corpus("train")
    prompts = [prompt_tokens(engine.tokenizer, t, "base") for t in corpus[:8]]
    others = [prompt_tokens(engine.tokenizer, t, "base") for t in corpus[8:20]]

    print("\n1. one run alone vs fused with three others (bitwise):")
    for mode, flag in MODES.items():
        engine.batch_invariant = flag
        same, detail = holds(engine, prompts, others)
        print(f"  {mode:9s}: {'identical' if same else 'DIFFERENT'} ({detail})", flush=True)

    decode_peak = roofline(shapes, 64, engine.dtype, engine.device, True)
    train_peak = roofline(shapes, TRAIN_WIDTH, engine.dtype, engine.device, True)
    print(f"\nmatmul roofline ({engine.dtype}): decode width 64 {decode_peak / 1e9:.0f} GFLOP/s, "
          f"training width {TRAIN_WIDTH} {train_peak / 1e9:.0f} GFLOP/s")

    print(f"\n2. RL step, 8 prompts x 8 samples x 64 tokens, {args.steps} measured step(s) per "
          "mode after one warm-up, alternating:", flush=True)
    states = {mode: engine.create_run(LoraSpec(rank=16), seed=0) for mode in MODES}
    timings: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    kls: dict[str, tuple[float, float, float]] = {}
    for step in range(args.steps + 1):
        for mode, flag in MODES.items():
            engine.batch_invariant = flag
            results, data, fb, sample_s, train_s = rl_step(engine, states[mode], prompts, 8, 64,
                                                           1000 + step)
            if step == 0:
                kls[mode] = sampler_trainer_kl(data, fb.outputs)
                continue
            groups = [sum(1 for s in r.sequences if s.tokens) for r in results]
            flops = sampled_flops(shapes, prompts, results) + train_flops(shapes, data, groups)
            timings[mode].append((sample_s, train_s, flops))
    print("| mode | sampling s | training s | step s | GFLOP/s | of roofline |")
    print("|---|---|---|---|---|---|")
    medians = {}
    for mode, rows in timings.items():
        sample_s = statistics.median(r[0] for r in rows)
        train_s = statistics.median(r[1] for r in rows)
        step_s = statistics.median(r[0] + r[1] for r in rows)
        rate = statistics.median(r[2] / (r[0] + r[1]) for r in rows)
        medians[mode] = step_s
        print(f"| {mode} | {sample_s:.1f} | {train_s:.1f} | {step_s:.1f} | {rate / 1e9:.0f} | "
              f"{rate / train_peak:.0%} |")
    print(f"invariance costs {medians['invariant'] / medians['fused'] - 1:+.1%} on the RL step")

    print("\n3a. four runs sampling through the SDK (fusion-sampling's workload), clients "
          "concurrent vs one run after another, 2 rounds per mode, alternating:", flush=True)
    served = sdk_speedups(args)
    for mode, (together, apart) in served.items():
        print(f"  {mode:9s}: concurrent {together:.1f} s, one after another {apart:.1f} s, "
              f"speed-up {apart / together:.2f}x")
    print(f"  invariance costs {served['invariant'][0] / served['fused'][0] - 1:+.1%} on the "
          "concurrent phase")

    print("\n3b. four runs' RL steps (4 prompts x 8 samples x 32 tokens each), fused into one "
          "engine call per phase vs run by run:", flush=True)
    per_run = [others[4 * k : 4 * k + 4] if k < 3 else prompts[:4] for k in range(4)]
    speedups = {}
    for mode, flag in MODES.items():
        engine.batch_invariant = flag
        runs = [engine.create_run(LoraSpec(rank=16), seed=s) for s in range(4)]

        fused_round(engine, runs, per_run, 1)  # warm-up
        t0 = time.perf_counter()
        fused_round(engine, runs, per_run, 2)
        t1 = time.perf_counter()
        sequential_round(engine, runs, per_run, 3)
        t2 = time.perf_counter()
        speedups[mode] = (t1 - t0, t2 - t1)
        print(f"  {mode:9s}: fused {t1 - t0:.1f} s, run by run {t2 - t1:.1f} s, "
              f"speed-up {(t2 - t1) / (t1 - t0):.2f}x", flush=True)

    print("\n4. sampler-trainer gap at step 0 (same weights): ")
    for mode, (k1, k3, gap) in kls.items():
        print(f"  {mode:9s}: KL k1 {k1:.2e}, k3 {k3:.2e}, largest |logprob gap| {gap:.3g}")
    print(f"\ntotal {time.time() - started:.0f} s; load average at end {load()}")


if __name__ == "__main__":
    main()
