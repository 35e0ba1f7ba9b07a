"""The output head only where the loss reads it, and fused: the transfer recipe's SFT and RL
steps three ways, in one run.

Gemma 3's output head (262k rows x 640) costs more per position than the whole 270M body. An
SFT example of the transfer recipe is a prompt (schema, sample rows, question) with weight 0
and a short gold query with weight 1; an RL datum is a prompt with no advantage and a sampled
completion. The ways:

1. `plain, every position` (`head_where_read=False, fused_head_pass=False`): every position
   through the head, each chunk's `[positions, vocabulary]` fp32 logits materialised (the
   engine's computation before both changes);
2. `plain, where read` (`fused_head_pass=False`): only the positions the loss reads;
3. `fused, where read` (the default): those positions one vocabulary block at a time
   (`fused_head`), no vocabulary-wide fp32 tensor.

All run on the default (batch-invariant) path from the same adapter on the same batches,
alternating step by step so drift in the machine's load falls on each. The script checks that
ways 1 and 2 agree to the bit in loss, gradients and the logprobs the loss reads, and prints how
far way 3 (another order of summation over the vocabulary) is from them.

- SFT: `forward_backward(cross_entropy)` over 8 multi-table examples, CREATE TABLE statements
  with 2 sample rows, at most 1600 schema characters (the recipe's `--sample-rows 2
  --max-schema-chars 1600`), then one AdamW step.
- RL: `forward_backward(importance_sampling)` over 4 prompts x 8 samples drawn once at
  temperature 1 (64 new tokens, the trial's stop strings), then one AdamW step.

Prints seconds per step, the ratio against way 1, the head's share of each step's FLOPs and the
fraction of this machine's matmul roofline (measured in the same run).

    python -m bench.bench_output_head               # 3 steps per way, ~14 min on 2 cores
    python -m bench.bench_output_head --steps 1     # ~6 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from bench.bench_rl_step import rollout_data, sample_jobs
from bench.bench_roofline import Shapes
from bench.bench_sft_step import embedded_engine, sft_batches
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.loss_positions import loss_positions
from server.protocol.codec import Datum
from sqltasks import SchemaView, load_corpus

WAYS = ("plain, every position", "plain, where read", "fused, where read")


def distinct_positions(data: list[Datum], loss_fn: str) -> list[tuple[int, bool, bool]]:
    """Each distinct position of a batch (a shared prompt's once, as the engine computes it):
    its context length, whether the loss reads it, whether it carries gradient."""
    seen: dict[int, list] = {}
    for datum in data:
        read, active = loss_positions(loss_fn, datum.inputs, np.ones(len(datum.tokens), bool))
        key = 0
        for c, token in enumerate(datum.tokens.tolist()):
            key = hash((key, token))
            entry = seen.setdefault(key, [c + 1, False, False])
            entry[1] |= bool(read[c])
            entry[2] |= bool(active[c])
    return [tuple(entry) for entry in seen.values()]


def step_flops(shapes: Shapes, data: list[Datum], loss_fn: str, where_read: bool) -> float:
    """Body forward and backward over each distinct position, attention three times; the head
    forward over the positions scored and backward over those with gradient."""
    positions = distinct_positions(data, loss_fn)
    total = 2 * shapes.body_flops(len(positions))
    total += 3 * sum(shapes.attention_flops(context) for context, _, _ in positions)
    total += shapes.head_flops(sum(read for _, read, _ in positions) if where_read
                               else len(positions))
    return total + shapes.head_flops(sum(active for _, _, active in positions))


def head_share(shapes: Shapes, data: list[Datum], loss_fn: str) -> float:
    """The fraction of a `before` step's FLOPs that go to positions the loss never reads."""
    unread = sum(not read for _, read, _ in distinct_positions(data, loss_fn))
    return shapes.head_flops(unread) / step_flops(shapes, data, loss_fn, False)


def one_step(engine: Engine, seed: int, data: list[Datum], loss_fn: str, way: str):
    """A step from a fresh adapter of `seed`: (seconds, loss, read logprobs, gradients)."""
    engine.head_where_read = way != WAYS[0]
    engine.fused_head_pass = way == WAYS[2]
    state = engine.create_run(LoraSpec(rank=16), seed=seed)
    started = time.perf_counter()
    result = engine.forward_backward([ForwardBackwardJob(state, data, loss_fn, {}, False)])[0]
    grads = [t.grad.clone() for t in (*state.adapter.a.values(), *state.adapter.b.values())
             if t.grad is not None]
    engine.optim_step(state, AdamParams(learning_rate=1e-4))
    seconds = time.perf_counter() - started
    read = [out["logprobs"][loss_positions(loss_fn, d.inputs, np.ones(len(d.tokens), bool))[0]]
            for d, out in zip(data, result.outputs, strict=True)]
    return seconds, result.metrics["loss:sum"], read, grads


def largest_difference(a, b) -> float:
    """The largest relative difference of loss, read logprobs and gradients between two ways."""
    (_, loss_a, read_a, grads_a), (_, loss_b, read_b, grads_b) = a, b
    worst = abs(loss_a - loss_b) / max(abs(loss_b), 1e-12)
    for x, y in zip(read_a, read_b, strict=True):
        if len(y):
            worst = max(worst, float(np.max(np.abs(x - y))) / max(float(np.max(np.abs(y))), 1e-12))
    for x, y in zip(grads_a, grads_b, strict=True):
        worst = max(worst, float((x - y).abs().max()) / max(float(y.abs().max()), 1e-12))
    return worst


def same_bits(a, b) -> bool:
    (_, loss_a, read_a, grads_a), (_, loss_b, read_b, grads_b) = a, b
    return (loss_a == loss_b
            and all(np.array_equal(x, y) for x, y in zip(read_a, read_b, strict=True))
            and all(torch.equal(x, y) for x, y in zip(grads_a, grads_b, strict=True)))


def rl_batches(engine: Engine, steps: int, prompts: int, group: int, max_tokens: int,
               sample_rows: int, max_chars: int, seed: int) -> list[list[Datum]]:
    """Each step's GRPO datums: multi-table prompts, samples drawn once from the base model."""
    train = load_corpus("train", 0, corpus="multitable")
    view = SchemaView(sample_rows=sample_rows, max_chars=max_chars)
    rng = np.random.default_rng(seed + 1)
    batches = []
    for step in range(steps):
        tasks = [train[int(i)] for i in rng.choice(len(train), size=prompts, replace=False)]
        tokens = [prompt_tokens(engine.tokenizer, task, "base", view) for task in tasks]
        results = engine.sample(sample_jobs(None, tokens, group, max_tokens, step))
        batches.append(rollout_data(tokens, results, seed + step))
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per way and phase")
    parser.add_argument("--batch", type=int, default=8, help="SFT examples per step")
    parser.add_argument("--prompts", type=int, default=4, help="RL prompts per step")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sample-rows", type=int, default=2)
    parser.add_argument("--max-schema-chars", type=int, default=1600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.time()
    engine, shapes, peak = embedded_engine()
    print(f"batch invariant {engine.batch_invariant}", flush=True)

    phases = {
        "SFT": ("cross_entropy", sft_batches(engine, args.steps, args.batch, args.sample_rows,
                                             args.max_schema_chars, args.seed)),
        "RL": ("importance_sampling", rl_batches(engine, args.steps, args.prompts, args.group,
                                                 args.max_tokens, args.sample_rows,
                                                 args.max_schema_chars, args.seed)),
    }
    rows, identical, fused_gap = [], True, 0.0
    for phase, (loss_fn, batches) in phases.items():
        for way in WAYS:  # first-touch allocations, and the invariance probes of each shape
            one_step(engine, args.seed, batches[0][:2], loss_fn, way)
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for step, data in enumerate(batches):
            got = {way: one_step(engine, args.seed, data, loss_fn, way) for way in WAYS}
            for way in WAYS:
                times[way].append(got[way][0])
                print(f"  {phase} step {step} {way:34s} {got[way][0]:6.1f} s", flush=True)
            identical &= same_bits(got[WAYS[0]], got[WAYS[1]])
            fused_gap = max(fused_gap, largest_difference(got[WAYS[2]], got[WAYS[1]]))
        tokens = statistics.mean(sum(len(d.tokens) for d in data) for data in batches)
        share = statistics.mean(head_share(shapes, data, loss_fn) for data in batches)
        medians = [statistics.median(times[way]) for way in WAYS]
        before = medians[0]
        for way, seconds in zip(WAYS, medians, strict=True):
            flops = statistics.mean(step_flops(shapes, data, loss_fn, way != WAYS[0])
                                    for data in batches)
            rows.append(f"| {phase} | {way} | {seconds:.1f} | {tokens / seconds:.0f} | "
                        f"{flops / 1e12:.2f} | {flops / seconds / peak:.0%} | "
                        f"{before / seconds:.2f}x |")
        print(f"{phase}: {len(batches[0])} datums, {tokens:.0f} tokens per step on average; "
              f"head work at unread positions {share:.0%} of the step's FLOPs before", flush=True)
    engine.head_where_read = engine.fused_head_pass = True
    print(f"\nmedian of {args.steps} steps per way and phase\n")
    print("| phase | way | seconds | tokens/s | TFLOP done | of roofline | vs way 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\nloss, gradients and the logprobs the loss reads equal to the bit, {WAYS[0]} and "
          f"{WAYS[1]}: {'yes' if identical else 'NO'}; {WAYS[2]} against {WAYS[1]}: largest "
          f"relative difference {fused_gap:.2e}")
    print(f"wall {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
