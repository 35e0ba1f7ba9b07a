"""The engine against the hardware: each phase as FLOP/s, as a fraction of this machine's own
matmul throughput at the model's shapes, and as a ratio to plain `transformers` on the same inputs.

One run, in this order:

1. **Roofline.** The throughput of the model's own matmuls (every projection of a layer and the
   output head) at decoding width (M = the sampling batch) and at training width (M = 2048
   tokens), in fp32 and in the engine's dtype, on this machine now. A phase's roofline is the
   FLOP-weighted rate of its matmul mix at its width: the speed it would reach if it did
   nothing but those matmuls.
2. **Phases on the engine** (in process, no HTTP): sampling (the RL step's shapes: 8 corpus
   prompts x 8 samples, 64 new tokens, temperature 1, the trials' stop strings); greedy
   evaluation of `--eval-tasks` dev tasks (96 new tokens, as `autoresearch` evaluates); one
   forward_backward on the sampled rollouts (`importance_sampling`, rank 16); the whole RL step
   (sample, forward_backward, optim_step).
3. **Plain transformers on the same inputs**, in fp32: `generate` for the same sampling rows
   and for greedy evaluation of the first `--baseline-tasks` tasks (the engine is timed on those
   too), and a plain PEFT-LoRA forward+backward (full logits, micro-batches of 4) on the first
   `--baseline-datums` rollouts (the engine is timed on those too).

FLOPs counted are the work a phase needs: 2 x parameters per token through the layers, the
attention's score and value products over each token's context (capped by the sliding window),
the output head wherever logits are used (once per sampled token; every scored position in
training, plus its backward where a loss term reads it), and backward as one more pass through
the layers (the base is frozen: input gradients only). LoRA's own products are left out (under
2% at rank 16). Shared prompt prefixes count once per group, as computed.

    python -m bench.bench_roofline                     # CPU, embedded Gemma 3 270M, ~8 min
    python -m bench.bench_roofline --quick             # smaller phases, ~3 min
    python -m bench.bench_roofline --dtype float32     # the engine in fp32 numerics
    python -m bench.bench_roofline --device cuda       # the same table on a GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from bench.bench_rl_step import rollout_data, sample_jobs
from server.engine.engine import (
    AdamParams,
    Engine,
    ForwardBackwardJob,
    SampleJob,
    SamplingParams,
)
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from sqltasks import STOP_SEQUENCES, load_corpus

TRAIN_WIDTH = 2048


# ------------------------------------------------------------------ model shapes and FLOPs
@dataclass(frozen=True)
class Shapes:
    hidden: int
    intermediate: int
    q_dim: int
    kv_dim: int
    vocab: int
    layers: int
    q_heads: int
    head_dim: int
    window: int | None
    sliding_layers: int

    @classmethod
    def of(cls, config) -> Shapes:
        head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        types = list(getattr(config, "layer_types", None) or [])
        return cls(
            config.hidden_size, config.intermediate_size,
            config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim,
            config.vocab_size, config.num_hidden_layers, config.num_attention_heads, head_dim,
            getattr(config, "sliding_window", None), types.count("sliding_attention"),
        )

    def layer_matmuls(self) -> list[tuple[int, int, int]]:
        """`(in, out, times per layer)` of one layer's projections."""
        h, i = self.hidden, self.intermediate
        return [(h, self.q_dim, 1), (h, self.kv_dim, 2), (self.q_dim, h, 1), (h, i, 2), (i, h, 1)]

    def body_flops(self, tokens: int) -> float:
        per_token = sum(2 * a * b * n for a, b, n in self.layer_matmuls()) * self.layers
        return float(per_token) * tokens

    def head_flops(self, positions: int) -> float:
        return 2.0 * self.hidden * self.vocab * positions

    def attention_flops(self, context: int) -> float:
        """Scores and values for one token that sees `context` tokens, over all layers."""
        full = self.layers - self.sliding_layers
        seen_sliding = min(context, self.window) if self.window else context
        seen = full * context + self.sliding_layers * seen_sliding
        return 4.0 * self.q_heads * self.head_dim * seen

    def prefill_flops(self, length: int) -> float:
        return self.body_flops(length) + sum(self.attention_flops(c + 1) for c in range(length))

    def decode_flops(self, prompt: int, new: int) -> float:
        """`new` tokens decoded after a `prompt`: layers, attention and head per token."""
        return sum(
            self.body_flops(1) + self.attention_flops(prompt + t + 1) + self.head_flops(1)
            for t in range(new)
        )


def matmul_rate(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> float:
    """Median FLOP/s of `[m, k] x [k, n]` over enough repeats to last ~0.3 s."""
    a = torch.randn(m, k, device=device).to(dtype)
    weight_t = torch.randn(n, k, device=device).to(dtype).T  # as `nn.Linear` multiplies
    out = torch.mm(a, weight_t)
    sync(device)
    times = []
    deadline = time.perf_counter() + 0.3
    while len(times) < 3 or time.perf_counter() < deadline:
        started = time.perf_counter()
        torch.mm(a, weight_t, out=out)
        sync(device)
        times.append(time.perf_counter() - started)
    return 2.0 * m * k * n / statistics.median(times)


def roofline(shapes: Shapes, m: int, dtype: torch.dtype, device: torch.device,
             with_head: bool) -> float:
    """FLOP-weighted matmul rate of a phase's mix at width `m` (harmonic: time adds up)."""
    mix = [(a, b, n * shapes.layers) for a, b, n in shapes.layer_matmuls()]
    if with_head:
        mix.append((shapes.hidden, shapes.vocab, 1))
    flops = seconds = 0.0
    for k, n, times in mix:
        work = 2.0 * m * k * n * times
        flops += work
        seconds += work / matmul_rate(m, k, n, dtype, device)
    return flops / seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(device: torch.device, fn):
    sync(device)
    started = time.perf_counter()
    value = fn()
    sync(device)
    return value, time.perf_counter() - started


# ------------------------------------------------------------------ the engine's phases
def engine_sample(engine: Engine, adapter, prompts, group: int, max_tokens: int, step: int):
    results, seconds = timed(
        engine.device, lambda: engine.sample(sample_jobs(adapter, prompts, group, max_tokens, step))
    )
    return results, seconds


def engine_greedy(engine: Engine, adapter, prompts, max_tokens: int):
    stop = list(STOP_SEQUENCES["base"])
    jobs = [SampleJob(adapter, p, 1, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                    stop=stop)) for p in prompts]
    return timed(engine.device, lambda: engine.sample(jobs))


def sampled_flops(shapes: Shapes, prompts, results) -> float:
    total = 0.0
    for prompt, result in zip(prompts, results, strict=True):
        total += shapes.prefill_flops(len(prompt)) + shapes.head_flops(1)
        for seq in result.sequences:
            total += shapes.decode_flops(len(prompt), max(0, len(seq.tokens) - 1))
    return total


def train_flops(shapes: Shapes, data, group_sizes: list[int]) -> float:
    """Layers forward and backward over each group's computed tokens (prompt once), attention
    three times (forward, two backward products), the head over every position plus its
    backward where an advantage is non-zero."""
    total, cursor = 0.0, 0
    for size in group_sizes:
        members = data[cursor : cursor + size]
        cursor += size
        if not members:
            continue
        prompt = int(np.argmax(members[0].inputs["advantages"] != 0))
        tokens = prompt + sum(len(d.tokens) - prompt for d in members)
        total += 2 * shapes.body_flops(tokens) + shapes.head_flops(tokens)
        total += 3 * sum(shapes.attention_flops(c + 1) for c in range(prompt))
        for d in members:
            total += 3 * sum(shapes.attention_flops(c + 1) for c in range(prompt, len(d.tokens)))
            total += shapes.head_flops(int((d.inputs["advantages"] != 0).sum()))
    return total


# ------------------------------------------------------------------ plain transformers
def plain_generate(model, tokenizer, prompts, per_prompt: int, max_tokens: int, sample: bool):
    """`generate` on left-padded rows; returns the generated token count and seconds."""
    tokenizer.padding_side = "left"
    rows = [p for p in prompts for _ in range(per_prompt)]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=model.device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows],
                        device=model.device)
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample \
        else {"do_sample": False}
    with torch.inference_mode():
        out, seconds = timed(model.device, lambda: model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, pad_token_id=pad,
            stop_strings=list(STOP_SEQUENCES["base"]), tokenizer=tokenizer, **kwargs))
    new = out[:, width:]
    eos = tokenizer.eos_token_id
    count = int(((new != pad) & (new != eos)).sum()) + int((new == eos).any(1).sum())
    return count, seconds


def plain_forward_backward(model, data, rank: int, rows_per_batch: int = 4) -> float:
    """PEFT LoRA (all linear layers) forward+backward with full logits, `importance_sampling`'s
    loss, in micro-batches; returns seconds."""
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = get_peft_model(model, LoraConfig(r=rank, lora_alpha=32, target_modules=targets))
    device = model.device

    def run() -> None:
        for first in range(0, len(data), rows_per_batch):
            batch = data[first : first + rows_per_batch]
            width = max(len(d.tokens) for d in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            tgt = torch.zeros_like(ids)
            adv = torch.zeros((len(batch), width))
            old = torch.zeros((len(batch), width))
            mask = torch.zeros_like(ids)
            for r, d in enumerate(batch):
                n = len(d.tokens)
                ids[r, :n] = torch.from_numpy(d.tokens)
                tgt[r, :n] = torch.from_numpy(d.inputs["target_tokens"])
                adv[r, :n] = torch.from_numpy(d.inputs["advantages"])
                old[r, :n] = torch.from_numpy(d.inputs["logprobs"])
                mask[r, :n] = 1
            logits = lora(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            logp = torch.log_softmax(logits.float(), -1)
            logp = logp.gather(-1, tgt.to(device)[..., None])[..., 0]
            ratio = torch.exp(logp - old.to(device))
            (-(ratio * adv.to(device)).sum()).backward()
        lora.zero_grad(set_to_none=True)

    _, seconds = timed(device, run)
    lora.unload()
    return seconds


# ------------------------------------------------------------------ report
def row(name: str, flops: float, seconds: float, peak: float, tokens: float, plain: float | None,
        unit: str) -> str:
    achieved = flops / seconds
    ratio = f"{tokens / seconds / plain:6.2f}x" if plain else "     -"
    return (f"| {name:<26} | {seconds:8.1f} | {tokens / seconds:9.1f} {unit:<6} | "
            f"{achieved / 1e9:8.1f} | {peak / 1e9:8.1f} | {achieved / peak:6.1%} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="a Gemma 3 path or id (default: embedded)")
    parser.add_argument("--dtype", default=None, help="the engine's dtype (default: auto)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--baseline-tasks", type=int, default=64)
    parser.add_argument("--baseline-datums", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="32 eval tasks, smaller baselines")
    args = parser.parse_args()
    if args.quick:
        args.eval_tasks, args.baseline_tasks, args.baseline_datums = 32, 16, 8

    started = time.time()
    loaded = load_base_model(args.model, args.device, args.dtype)
    engine = Engine(loaded)
    device = engine.device
    shapes = Shapes.of(engine.model.config)
    reason = getattr(loaded, "dtype_reason", "")
    print(f"model {engine.model_name} on {device}/{engine.dtype} ({reason}); "
          f"threads {torch.get_num_threads()}; cpus {os.cpu_count()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    rows_decode = args.prompts * args.group
    print("\nmatmul roofline at the model's shapes (GFLOP/s):")
    rates = {}
    for dtype in sorted({torch.float32, engine.dtype}, key=str):
        for m, head in ((rows_decode, True), (TRAIN_WIDTH, False), (TRAIN_WIDTH, True)):
            rates[(dtype, m, head)] = roofline(shapes, m, dtype, device, head)
        print(f"  {str(dtype):15s} decode M={rows_decode} (+head) "
              f"{rates[(dtype, rows_decode, True)] / 1e9:7.1f}   training M={TRAIN_WIDTH} "
              f"layers {rates[(dtype, TRAIN_WIDTH, False)] / 1e9:7.1f}, +head "
              f"{rates[(dtype, TRAIN_WIDTH, True)] / 1e9:7.1f}")

    corpus = load_corpus("train")
    prompts = [prompt_tokens(engine.tokenizer, t, "base") for t in corpus[: args.prompts]]
    dev = load_corpus("dev")[: args.eval_tasks]
    eval_prompts = [prompt_tokens(engine.tokenizer, t, "base") for t in dev]
    state = engine.create_run(LoraSpec(rank=16), seed=0)
    adapter = state.adapter.frozen_copy()

    # Each engine phase runs twice on the same inputs and the faster run counts: the first
    # call at a new size also pays for first-touch allocations.
    samples, sample_s = best_of(lambda: engine_sample(engine, adapter, prompts, args.group,
                                                      args.max_tokens, 1))
    sample_tokens = sum(len(s.tokens) for r in samples for s in r.sequences)
    data = rollout_data(prompts, samples, seed=0)
    groups = [sum(1 for s in r.sequences if s.tokens) for r in samples]
    greedy, greedy_s = best_of(lambda: engine_greedy(engine, adapter, eval_prompts, 96))
    greedy_tokens = sum(len(s.tokens) for r in greedy for s in r.sequences)
    few = eval_prompts[: args.baseline_tasks]
    greedy_few, greedy_few_s = best_of(lambda: engine_greedy(engine, adapter, few, 96))
    greedy_few_tokens = sum(len(s.tokens) for r in greedy_few for s in r.sequences)

    job = lambda d: [ForwardBackwardJob(state, d, "importance_sampling", {}, False)]  # noqa: E731

    def train(d):
        out = timed(device, lambda: engine.forward_backward(job(d)))
        state.optimizer.zero_grad(set_to_none=True)
        return out

    fb_out, fb_s = best_of(lambda: train(data))
    kl = sampler_trainer_kl(data, fb_out[0].outputs)
    subset = data[: args.baseline_datums]
    _, fb_few_s = best_of(lambda: train(subset))

    step_started = time.perf_counter()
    step_samples, step_sample_s = engine_sample(
        engine, state.adapter.frozen_copy(), prompts, args.group, args.max_tokens, 2
    )
    step_data = rollout_data(prompts, step_samples, seed=1)
    step_groups = [sum(1 for s in r.sequences if s.tokens) for r in step_samples]
    engine.forward_backward(job(step_data))
    engine.optim_step(state, AdamParams(learning_rate=1e-4))
    sync(device)
    step_s = time.perf_counter() - step_started

    print(f"\nplain transformers baselines (fp32, {device}) ...", flush=True)
    from transformers import AutoModelForCausalLM

    from server.engine.model_loading import embedded_cache_path

    source = args.model or str(embedded_cache_path())
    plain = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(device)
    plain.eval()
    plain_generate(plain, engine.tokenizer, prompts[:2], 2, 4, sample=True)  # warm-up
    plain_sample_tokens, plain_sample_s = plain_generate(
        plain, engine.tokenizer, prompts, args.group, args.max_tokens, sample=True
    )
    plain_greedy_tokens, plain_greedy_s = plain_generate(
        plain, engine.tokenizer, few, 1, 96, sample=False
    )
    for p in plain.parameters():
        p.requires_grad_(False)
    plain_fb_s = plain_forward_backward(plain, subset, 16)

    train_tokens = sum(len(d.tokens) for d in data)
    few_tokens = sum(len(d.tokens) for d in subset)
    step_flops = (sampled_flops(shapes, prompts, step_samples)
                  + train_flops(shapes, step_data, step_groups))
    step_tokens = sum(len(s.tokens) for r in step_samples for s in r.sequences)
    peak_decode = rates[(engine.dtype, rows_decode, True)]
    peak_train = rates[(engine.dtype, TRAIN_WIDTH, True)]
    print(f"\n| phase ({engine.dtype}) | seconds | rate | GFLOP/s | roofline | fraction "
          "| vs plain |")
    print("|---|---|---|---|---|---|---|")
    print(row("sampling 8x8x64", sampled_flops(shapes, prompts, samples), sample_s, peak_decode,
              sample_tokens, plain_sample_tokens / plain_sample_s, "tok/s"))
    print(row(f"greedy eval {len(dev)} tasks", sampled_flops(shapes, eval_prompts, greedy),
              greedy_s, peak_decode, greedy_tokens, None, "tok/s"))
    print(row(f"greedy eval {len(few)} tasks", sampled_flops(shapes, few, greedy_few),
              greedy_few_s, peak_decode, greedy_few_tokens, plain_greedy_tokens / plain_greedy_s,
              "tok/s"))
    print(row(f"forward_backward {len(data)} datums", train_flops(shapes, data, groups), fb_s,
              peak_train, train_tokens, None, "tok/s"))
    few_groups = _group_sizes(groups, len(subset))
    print(row(f"forward_backward {len(subset)} datums", train_flops(shapes, subset, few_groups),
              fb_few_s, peak_train, few_tokens, few_tokens / plain_fb_s, "tok/s"))
    print(row("RL step (sample+fb+step)", step_flops, step_s, peak_train, step_tokens, None,
              "tok/s"))
    print(f"\nsampler-trainer KL at step 0 ({engine.dtype}): k1 {kl[0]:.2e}, k3 {kl[1]:.2e}, "
          f"largest |logprob gap| {kl[2]:.3f}")
    print(f"RL step {step_s:.1f} s (sampling {step_sample_s:.1f} s); greedy evaluation "
          f"{greedy_s / max(1, len(dev)):.3f} s per task, {greedy_s:.1f} s for {len(dev)}; "
          f"plain: generate sampling {plain_sample_s:.1f} s, greedy {plain_greedy_s:.1f} s for "
          f"{len(few)} tasks, forward+backward {plain_fb_s:.1f} s for {len(subset)} datums")
    print(f"'rate' is generated tokens/s for sampling and evaluation, datum tokens/s for "
          f"training; 'vs plain' divides it by plain transformers' on the same inputs. "
          f"Total {time.time() - started:.0f} s; load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def best_of(run, times: int = 2):
    """The faster of `times` runs of `run() -> (value, seconds)`."""
    return min((run() for _ in range(times)), key=lambda result: result[1])


def sampler_trainer_kl(data, outputs) -> tuple[float, float, float]:
    """KL(sampler || trainer) per sampled token at step 0 (the same weights): the k1 and k3
    estimates and the largest |logprob gap|, over the positions that were sampled."""
    sampled, trained = [], []
    for datum, output in zip(data, outputs, strict=True):
        where = datum.inputs["advantages"] != 0
        sampled.append(datum.inputs["logprobs"][where])
        trained.append(output["logprobs"][where])
    p, q = np.concatenate(sampled).astype(np.float64), np.concatenate(trained).astype(np.float64)
    log_ratio = q - p
    return float(np.mean(-log_ratio)), float(np.mean(np.expm1(log_ratio) - log_ratio)), \
        float(np.max(np.abs(log_ratio)))


def _group_sizes(groups: list[int], limit: int) -> list[int]:
    out, left = [], limit
    for size in groups:
        if left <= 0:
            break
        out.append(min(size, left))
        left -= size
    return out


if __name__ == "__main__":
    main()
