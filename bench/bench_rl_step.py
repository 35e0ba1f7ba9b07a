"""One GRPO step of the learning benchmark, today's computation beside the new one, in one run.

The step has the shapes of `bench_trial_learning.py`'s RL phase: 8 prompts of the SQL corpus
(about 300 tokens each) x 8 samples, 64 new tokens at temperature 1 with the trial's stop
strings, a rank-16 LoRA, the `importance_sampling` loss and one AdamW step. It runs on the
engine in process (no HTTP), so what is measured is the computation:

- `before`: one row per datum in forward_backward (`share_prefixes=False`) and the host-side
  sampler (`device_sampling=False`);
- `after`: shared prompt prefixes computed once, and sampling on the logits' device.

Both modes train their own run from the same seed on the same fixed rollouts and advantages
(sampled once in the warm-up), so their losses must agree step for step; the script checks
that. Sampling is timed on each mode's own draws (the two samplers use different random
streams, so the samples differ; tokens/s is printed with them). Modes alternate step by step,
so drift in the load of a shared machine falls on both. Peak RSS is sampled every 20 ms during
each mode's steps (on CUDA, the peak allocated device memory is printed as well).

    python -m bench.bench_rl_step                       # CPU, embedded Gemma 3 270M
    python -m bench.bench_rl_step --steps 3 --warmup 1  # more measured steps
    python -m bench.bench_rl_step --device cuda --model /path/to/gemma-3-1b
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil
import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob, SampleJob, SamplingParams
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from sqltasks import STOP_SEQUENCES, load_corpus

MODES = ("before", "after")
LOSS_RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
"""Relative tolerance on the per-step loss between modes: float sums in another order."""


@dataclass
class Timings:
    sample_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    sample_tokens: list[int] = field(default_factory=list)
    train_tokens: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_rss: int = 0
    peak_device: int = 0


class PeakRss:
    """Samples this process's RSS in a thread; `peak` is the largest seen while running."""

    def __init__(self, every_s: float = 0.02):
        self.every_s, self.peak = every_s, 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def __enter__(self) -> PeakRss:
        self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def set_mode(engine: Engine, mode: str) -> None:
    engine.share_prefixes = engine.device_sampling = mode == "after"


def sample_jobs(adapter, prompts: list[list[int]], group: int, max_tokens: int, step: int):
    stop = list(STOP_SEQUENCES["base"])
    return [
        SampleJob(
            adapter,
            prompt,
            group,
            SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * step + i, stop=stop),
        )
        for i, prompt in enumerate(prompts)
    ]


def rollout_data(prompts, results, seed: int) -> list[Datum]:
    """GRPO datums: the prompt's positions carry no advantage, the completion's do."""
    rng = np.random.default_rng(seed)
    data = []
    for prompt, result in zip(prompts, results, strict=True):
        advantages = rng.normal(size=len(result.sequences))
        advantages -= advantages.mean()
        for seq, adv in zip(result.sequences, advantages, strict=True):
            if not seq.tokens:
                continue
            full = np.asarray(prompt + list(seq.tokens), dtype=np.int64)
            n = len(full) - 1
            logprobs = np.zeros(n, np.float32)
            logprobs[len(prompt) - 1 :] = seq.logprobs
            adv_row = np.zeros(n, np.float32)
            adv_row[len(prompt) - 1 :] = adv
            data.append(
                Datum(full[:-1], {"target_tokens": full[1:], "logprobs": logprobs,
                                  "advantages": adv_row})
            )
    return data


def few_shot(tokenizer, examples, prompt: list[int], target: int, offset: int) -> list[int]:
    """`prompt` behind solved examples (prompt + gold SQL) until at least `target` tokens."""
    bos = [prompt[0]] if prompt and prompt[0] == tokenizer.bos_token_id else []
    body, shots, k = prompt[len(bos) :], [], offset
    while len(bos) + len(shots) + len(body) < target:
        task = examples[k % len(examples)]
        shot = prompt_tokens(tokenizer, task, "base")[len(bos) :]
        shots += shot + tokenizer.encode(task.gold_sql + "\n```\n\n", add_special_tokens=False)
        k += len(examples) // 7 + 1
    return bos + shots + body


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_step(engine: Engine, state, prompts, data, args, step: int, out: Timings | None) -> None:
    """Sample a step's groups, then forward_backward + optim_step on the fixed rollouts."""
    t0 = time.perf_counter()
    results = engine.sample(
        sample_jobs(state.adapter.frozen_copy(), prompts, args.group, args.max_tokens, step)
    )
    sync(engine.device)
    t1 = time.perf_counter()
    fb = engine.forward_backward(
        [ForwardBackwardJob(state, data, "importance_sampling", {}, False)]
    )[0]
    engine.optim_step(state, AdamParams(learning_rate=1e-4))
    sync(engine.device)
    t2 = time.perf_counter()
    if out is not None:
        out.sample_s.append(t1 - t0)
        out.train_s.append(t2 - t1)
        out.step_s.append(t2 - t0)
        out.sample_tokens.append(sum(len(s.tokens) for r in results for s in r.sequences))
        out.train_tokens.append(sum(len(d.tokens) for d in data))
        out.losses.append(float(fb.metrics["loss:sum"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="a Gemma 3 path or id (default: embedded)")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="lengthen each prompt to about this many tokens with solved examples in front "
        "(few-shot); default: the corpus prompts as the trials send them",
    )
    parser.add_argument("--steps", type=int, default=2, help="measured steps per mode")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps per mode")
    args = parser.parse_args()

    started = time.time()
    loaded = load_base_model(args.model, args.device, args.dtype)
    engine = Engine(loaded)
    corpus = load_corpus("train")
    tasks = corpus[: args.prompts]
    prompts = [prompt_tokens(engine.tokenizer, task, "base") for task in tasks]
    if args.prompt_tokens:
        prompts = [
            few_shot(engine.tokenizer, corpus[args.prompts :], prompt, args.prompt_tokens, i)
            for i, prompt in enumerate(prompts)
        ]
    print(f"model {engine.model_name} on {engine.device}/{engine.dtype}; "
          f"{args.prompts} prompts x {args.group} samples, prompt tokens "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} "
          f"(mean {statistics.mean(map(len, prompts)):.0f}), {args.max_tokens} new tokens, "
          f"rank {args.rank}; {args.warmup} warm-up + {args.steps} measured steps per mode")

    # Fixed rollouts for training, drawn once with the new sampler from the untrained adapter.
    set_mode(engine, "after")
    seed_state = engine.create_run(LoraSpec(rank=args.rank), seed=0)
    rollouts = engine.sample(
        sample_jobs(seed_state.adapter.frozen_copy(), prompts, args.group, args.max_tokens, 0)
    )
    data = rollout_data(prompts, rollouts, seed=0)
    del seed_state
    print(f"training batch: {len(data)} datums, {sum(len(d.tokens) for d in data)} tokens")

    states = {mode: engine.create_run(LoraSpec(rank=args.rank), seed=1) for mode in MODES}
    timings = {mode: Timings() for mode in MODES}
    for step in range(args.warmup + args.steps):
        measured = step >= args.warmup
        for mode in MODES:
            set_mode(engine, mode)
            if engine.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with PeakRss() as rss:
                one_step(engine, states[mode], prompts, data, args, step + 1,
                         timings[mode] if measured else None)
            if measured:
                timings[mode].peak_rss = max(timings[mode].peak_rss, rss.peak)
                if engine.device.type == "cuda":
                    timings[mode].peak_device = max(
                        timings[mode].peak_device, torch.cuda.max_memory_allocated()
                    )
            print(f"  step {step + 1} {mode:6s} {'measured' if measured else 'warm-up '}: "
                  f"{timings[mode].step_s[-1] if measured else float('nan'):.1f} s", flush=True)

    def mean(values: list[float]) -> float:
        return statistics.mean(values)

    print(f"\nload average {os.getloadavg()}; wall time {time.time() - started:.0f} s")
    print(f"{'':30s}{'before':>10s}{'after':>12s}   after vs before")
    # (name, measure, higher is better)
    rows = [
        ("sampling s/step", lambda t: mean(t.sample_s), False),
        ("forward_backward+optim s/step", lambda t: mean(t.train_s), False),
        ("whole RL step s/step", lambda t: mean(t.step_s), False),
        ("sampling tokens/s", lambda t: sum(t.sample_tokens) / sum(t.sample_s), True),
        ("training tokens/s", lambda t: sum(t.train_tokens) / sum(t.train_s), True),
        ("peak RSS GiB", lambda t: t.peak_rss / 2**30, False),
    ]
    if engine.device.type == "cuda":
        rows.append(("peak device memory GiB", lambda t: t.peak_device / 2**30, False))
    for name, measure, higher_better in rows:
        before, after = measure(timings["before"]), measure(timings["after"])
        if name.startswith("peak"):
            ratio = f"{after / before:.2f}x the memory"
        else:
            ratio = f"{(after / before if higher_better else before / after):.2f}x faster"
        print(f"{name:30s}{before:10.2f}{after:12.2f}   {ratio}")
    tolerance = LOSS_RTOL.get(engine.dtype, 1e-2)
    worst = max(
        abs(a - b) / max(abs(b), 1e-6)
        for a, b in zip(timings["after"].losses, timings["before"].losses, strict=True)
    )
    verdict = "identical within" if worst <= tolerance else "DIFFER beyond"
    shown = {m: ", ".join(f"{x:.5f}" for x in timings[m].losses) for m in MODES}
    print(f"losses before [{shown['before']}] after [{shown['after']}]: largest relative "
          f"difference {worst:.2e}, {verdict} {tolerance:g}")


if __name__ == "__main__":
    main()
