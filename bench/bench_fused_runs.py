"""Several runs' RL steps fused under invariance: what it buys, and that the bits hold, in one run.

Four small RL-like runs (2 prompts x 8 samples x 24 new tokens, then `importance_sampling`
training on them and one AdamW step), on the packaged Gemma 3 270M (or `--model DIR`) with the
engine's default batch invariance on:

1. engine level: four runs' samples in one `sample` call against a call per run (what sharing
   a decode batch buys here, every row's tokens compared); then training only: the four runs'
   `forward_backward` in one engine call with their micro-batches fused into shared body
   passes (`Engine.fuse_invariant_runs`) against the same call with each micro-batch on its
   own pass (the engine before fusing), on the same data, alternating; every run's loss,
   logprobs and gradients compared bit for bit;
2. through the SDK against an in-process server (runs' training fused, which the CPU's default
   leaves off): the four runs' clients concurrent against one run after another, two RL steps
   each, from the same seeds; every run's samples, losses and
   second-step samples (which read the weights after the first step) compared bit for bit;
3. each phase's GFLOP/s as a fraction of this machine's bf16 matmul roofline, measured here;
4. through the SDK, the scheduler's rule for samples that arrive while other runs' steps wait
   (run those steps' ready actions first, the default, against sampling at once), each way's
   engine time split into sampling and training (with steps) and its sample batches, and the
   ratio concurrency could reach at most here: sampling as fast as one shared engine call
   (1a) and training as it ran (the engine runs one call at a time).

    python -m bench.bench_fused_runs              # about 7 minutes on 2 cores
    python -m bench.bench_fused_runs --rounds 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import torch

from bench import bench_multirun as multirun
from bench.bench_rl_step import rollout_data, sample_jobs
from bench.bench_roofline import TRAIN_WIDTH, Shapes, roofline, train_flops
from server.engine.engine import (
    Engine,
    ForwardBackwardJob,
    SampleJob,
    SamplingParams,
)
from server.engine.lora import LoraSpec

RUNS, PROMPTS, GROUP, NEW_TOKENS = 4, 2, 8, 24


class Split(NamedTuple):
    """One way's wall seconds, the engine's seconds in sampling and in training, and how many
    sample batches it decoded."""

    wall: float
    sampling: float
    training: float
    batches: float


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def engine_sampling(engine: Engine, rounds: int) -> float:
    """Four runs' samples (each its own adapter) in one `sample` call against four calls: what
    a shared decode batch buys on this machine, the most concurrent clients can get from
    sampling together."""
    encoded = [engine.tokenizer.encode(p) for p in multirun.PROMPTS[:PROMPTS]]
    runs = [engine.create_run(LoraSpec(rank=8), seed=k) for k in range(RUNS)]
    per_run = [[SampleJob(run.adapter.frozen_copy(), prompt, GROUP,
                          SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=100,
                                         stop=[]))  # the SDK way's requests (2)
                for prompt in encoded] for run in runs]
    engine.sample(per_run[0])  # warm-up
    seconds: dict[str, list[float]] = {"one call": [], "a call per run": []}
    tokens: dict[str, list] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        together = engine.sample([job for jobs in per_run for job in jobs])
        seconds["one call"].append(time.perf_counter() - started)
        started = time.perf_counter()
        apart = [result for jobs in per_run for result in engine.sample(jobs)]
        seconds["a call per run"].append(time.perf_counter() - started)
        tokens = {"one call": together, "a call per run": apart}
    same = ([[s.tokens for s in r.sequences] for r in tokens["one call"]]
            == [[s.tokens for s in r.sequences] for r in tokens["a call per run"]])
    rows = RUNS * PROMPTS * GROUP
    print(f"\n1a. engine: {RUNS} runs' samples ({rows} rows x {NEW_TOKENS} tokens, each run its "
          f"own adapter), {rounds} round(s) a way, alternating")
    print("| way | seconds |")
    print("|---|---|")
    for way, values in seconds.items():
        print(f"| {way} | {statistics.median(values):.2f} |")
    ratio = statistics.median(seconds["a call per run"]) / statistics.median(seconds["one call"])
    print(f"one call / a call per run: {ratio:.2f}x; every row's tokens "
          f"{'identical' if same else 'DIFFERENT'}", flush=True)
    return ratio


def engine_training(engine: Engine, rounds: int) -> None:
    """Four runs' forward_backward, fused passes against one pass per micro-batch."""
    prompts = [multirun.PROMPTS[k % len(multirun.PROMPTS)] for k in range(RUNS * PROMPTS)]
    encoded = [engine.tokenizer.encode(p) for p in prompts]
    runs = [engine.create_run(LoraSpec(rank=16), seed=k) for k in range(RUNS)]
    data, groups = [], []
    for k, run in enumerate(runs):
        mine = encoded[k * PROMPTS : (k + 1) * PROMPTS]
        results = engine.sample(sample_jobs(run.adapter.frozen_copy(), mine, GROUP, NEW_TOKENS,
                                            k))
        data.append(rollout_data(mine, results, k))
        groups += [sum(1 for s in r.sequences if s.tokens) for r in results]
    shapes = Shapes.of(engine.model.config)
    flops = train_flops(shapes, [d for run_data in data for d in run_data], groups)
    tokens = sum(len(d.tokens) for run_data in data for d in run_data)

    def once(fuse: bool) -> tuple[float, list]:
        engine.fuse_invariant_runs = fuse
        for run in runs:
            run.optimizer.zero_grad(set_to_none=True)
        started = time.perf_counter()
        out = engine.forward_backward([ForwardBackwardJob(run, d, "importance_sampling", {},
                                                          False) for run, d in zip(runs, data)])
        seconds = time.perf_counter() - started
        grads = [[t.grad.clone() for t in run.adapter.parameters() if t.grad is not None]
                 for run in runs]
        return seconds, [out, grads]

    default = engine.fuse_invariant_runs
    once(True)  # warm-up
    seconds: dict[bool, list[float]] = {True: [], False: []}
    kept: dict[bool, list] = {}
    passes = engine.stats.fused_passes
    for _ in range(rounds):
        for fuse in (True, False):
            s, kept[fuse] = once(fuse)
            seconds[fuse].append(s)
    fused_passes = (engine.stats.fused_passes - passes) / rounds
    engine.fuse_invariant_runs = default
    (out_a, grads_a), (out_b, grads_b) = kept[True], kept[False]
    same = all(a.metrics == b.metrics for a, b in zip(out_a, out_b))
    same &= all(np.array_equal(x["logprobs"], y["logprobs"])
                for a, b in zip(out_a, out_b) for x, y in zip(a.outputs, b.outputs))
    same &= all(torch.equal(x, y) for ga, gb in zip(grads_a, grads_b) for x, y in zip(ga, gb))
    peak = roofline(shapes, TRAIN_WIDTH, engine.dtype, engine.device, True)
    print(f"\n1b. engine: {RUNS} runs' forward_backward in one call, {tokens} tokens, "
          f"{fused_passes:.0f} fused pass(es) a call, {rounds} round(s) a way, alternating; "
          f"roofline {peak / 1e9:.0f} GFLOP/s")
    print("| way | seconds | tokens/s | of roofline |")
    print("|---|---|---|---|")
    for fuse, label in ((False, "one pass per micro-batch"), (True, "fused passes")):
        s = statistics.median(seconds[fuse])
        print(f"| {label} | {s:.2f} | {tokens / s:.0f} | {flops / s / peak:.0%} |")
    ratio = statistics.median(seconds[False]) / statistics.median(seconds[True])
    print(f"fused / unfused: {ratio:.2f}x; every run's loss, logprobs and gradients "
          f"{'identical' if same else 'DIFFERENT'}", flush=True)


def sdk_rl(args: argparse.Namespace, sampling_gain: float) -> None:
    """Four runs' clients, two RL steps each, concurrent vs one after another."""
    from tinker import types

    multirun.quiet()
    settings = argparse.Namespace(model=args.model, quick=False, reward_seconds=None)
    with multirun.bench_server(settings) as bench:
        bench.engine.fuse_invariant_runs = True  # the CPU's default is off; the bits must hold
        prompts = [types.ModelInput.from_ints(bench.encode(p))
                   for p in multirun.PROMPTS[:PROMPTS]]

        def rl_run(client) -> tuple[list, int]:
            """Two steps of sample, train, step; what each step saw and trained on."""
            seen, generated = [], 0
            for step in range(2):
                sampler = client.save_weights_and_get_sampling_client().result()
                params = types.SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0,
                                              seed=100 + step, stop=[])
                results = [f.result() for f in [sampler.sample(p, GROUP, params)
                                                for p in prompts]]
                data = []
                for prompt, result in zip(prompts, results):
                    lengths = np.array([len(s.tokens) for s in result.sequences], float)
                    advantages = (lengths % 3) - (lengths % 3).mean()
                    for seq, adv in zip(result.sequences, advantages):
                        if not seq.tokens:
                            continue
                        full = prompt.to_ints() + list(seq.tokens)
                        n = len(full) - 1
                        start = prompt.length - 1
                        data.append(types.Datum(
                            model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={
                                "target_tokens": full[1:],
                                "logprobs": [0.0] * start + list(seq.logprobs),
                                "advantages": [0.0] * start + [float(adv)] * (n - start),
                            }))
                        generated += len(seq.tokens)
                fb = client.forward_backward(data, "importance_sampling")
                opt = client.optim_step(types.AdamParams(learning_rate=1e-3))
                loss = fb.result().metrics["loss:sum"]
                opt.result()
                seen.append(([[list(s.tokens) for s in r.sequences] for r in results], loss))
            return seen, generated

        rl_run(bench.new_runs(1, seed=99)[0])  # warm-up
        scheduler = bench.service.scheduler
        ways = {"concurrent": True, "concurrent, sampling first (earlier rule)": False,
                "one after another": True}
        timings: dict[str, list[Split]] = {way: [] for way in ways}
        seen: dict[str, list] = {}
        total = 0
        stats = bench.engine.stats
        for _ in range(args.rounds):
            for way, gather in ways.items():
                scheduler.actions_while_samples_gather = gather
                clients = bench.new_runs(RUNS, seed=10)
                before = (stats.sample_seconds, stats.train_seconds, stats.sample_batches)
                started = time.perf_counter()
                if way.startswith("concurrent"):
                    with ThreadPoolExecutor(RUNS) as pool:
                        outcome = list(pool.map(rl_run, clients))
                else:
                    outcome = [rl_run(c) for c in clients]
                timings[way].append(Split(time.perf_counter() - started,
                                          stats.sample_seconds - before[0],
                                          stats.train_seconds - before[1],
                                          stats.sample_batches - before[2]))
                seen[way] = [o[0] for o in outcome]
                total = sum(o[1] for o in outcome)
        scheduler.actions_while_samples_gather = True
        fused = stats.fused_passes
    same = all(runs == seen["one after another"] for runs in seen.values())
    print(f"\n2. SDK: {RUNS} runs x 2 RL steps ({PROMPTS} prompts x {GROUP} samples x "
          f"{NEW_TOKENS} tokens, then training and a step), {args.rounds} round(s) a way; "
          f"{total} tokens generated a way; {fused} fused training passes in all")
    print("| way | seconds | sample batches | engine sampling (s) | engine training and steps "
          "(s) | rest (s) |")
    print("|---|---|---|---|---|---|")
    median = {way: Split(*(statistics.median(getattr(s, f) for s in rows)
                          for f in Split._fields)) for way, rows in timings.items()}
    for way, m in median.items():
        print(f"| {way} | {m.wall:.1f} | {m.batches:g} | {m.sampling:.1f} | {m.training:.1f} | "
              f"{m.wall - m.sampling - m.training:.1f} |")
    alone = median["one after another"]
    for way in list(ways)[:2]:
        together = median[way]
        print(f"{way} / one after another: {alone.wall / together.wall:.2f}x (sampling "
              f"{alone.sampling / together.sampling:.2f}x, training "
              f"{alone.training / together.training:.2f}x)")
    print(f"every run's samples and losses of both steps "
          f"{'identical in every way' if same else 'DIFFERENT'}")
    # The engine runs one call at a time: at best the concurrent way samples what one after
    # another samples as fast as one shared engine call does (1a), and trains as it did.
    together = median["concurrent"]
    best = (alone.sampling / sampling_gain + together.training
            + together.wall - together.sampling - together.training)
    print(f"the most concurrency gives here, with sampling at the shared call's "
          f"{sampling_gain:.2f}x and training as it ran: {alone.wall / best:.2f}x", flush=True)


def main() -> None:
    from server.engine.model_loading import load_base_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    started = time.time()
    engine = Engine(load_base_model(args.model, "cpu", None))
    print(f"model {engine.model_name} ({engine.dtype}); invariant {engine.batch_invariant}; "
          f"threads {torch.get_num_threads()}; cpus {os.cpu_count()}; load average {load()}")
    sampling_gain = engine_sampling(engine, args.rounds)
    engine_training(engine, args.rounds)
    del engine
    sdk_rl(args, sampling_gain)
    print(f"\ntotal {time.time() - started:.0f} s; load average at end {load()}")


if __name__ == "__main__":
    main()
