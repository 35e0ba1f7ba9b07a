"""Decoding through the SDK at batch width: greedy against sampling, and the scheduler's
batching window against the narrower one it had before, in one run on one in-process server.

48 random 100-token prompts on the embedded Gemma 3 270M, 64 new tokens each (no stop), each
prompt its own `sample` request, all submitted at once from one `SamplingClient` (as a study's
evaluation or an RL group does), then every result awaited. Rounds alternate greedy (temperature
0) and sampling (temperature 1) under the scheduler's batching window (`sample_quiet_seconds`,
`sample_gather_seconds`) and under the earlier one (50 ms of quiet, 300 ms at most). Prints
tokens per second and how many engine batches each round took (a round split in two decodes
its stragglers at a fraction of the width). Then the baseline, in the same run: the same 48
prompts in one batch through plain `transformers` `generate` (the model loaded as a user would,
in fp32 and in bf16), greedy and sampling at temperature 1, 64 new tokens each; and the SDK's
rates as multiples of it. Last, one greedy engine call on the same prompts under
`torch.profiler`: how much of it is matrix products, against the time the 3x target allows.

    python -m bench.bench_sdk_decode [--prompts 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from bench.bench_multirun import bench_server, loadavg, quiet

NEW_TOKENS = 64
EARLIER_WINDOW = (0.05, 0.3)
"""(quiet, at most) seconds of the sampling window the scheduler had before its default."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    args.quick = False
    quiet()
    from tinker import types

    with bench_server(args) as bench:
        scheduler = bench.service.scheduler
        windows = {"now": (scheduler.sample_quiet_seconds, scheduler.sample_gather_seconds),
                   "earlier": EARLIER_WINDOW}
        sampler = bench.client.create_sampling_client(base_model=bench.base_model)
        rng = np.random.default_rng(0)
        prompts = [types.ModelInput.from_ints(
            rng.integers(10, bench.engine.vocab_size - 10, size=100).tolist())
            for _ in range(args.prompts)]

        def round_(temperature: float) -> tuple[float, float]:
            params = types.SamplingParams(max_tokens=64, temperature=temperature, seed=1,
                                          stop=[])
            before = bench.batch_stats("sample")[0]
            started = time.perf_counter()
            futures = [sampler.sample(p, 1, params) for p in prompts]
            tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
            seconds = time.perf_counter() - started
            return tokens / seconds, bench.batch_stats("sample")[0] - before

        round_(1.0)  # connections, first-touch allocations
        results: dict[tuple[str, float], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for name, (quiet_s, gather_s) in windows.items():
                scheduler.sample_quiet_seconds, scheduler.sample_gather_seconds = quiet_s, gather_s
                for temperature in (0.0, 1.0):
                    rate, batches = round_(temperature)
                    results.setdefault((name, temperature), []).append((rate, batches))
                    print(f"  window {name} T={temperature:g}: {rate:.0f} tokens/s in "
                          f"{batches:.0f} batch(es)", flush=True)
        scheduler.sample_quiet_seconds, scheduler.sample_gather_seconds = windows["now"]
        token_lists = [p.to_ints() for p in prompts]
        call_seconds, product_seconds = on_engine_thread(
            scheduler, lambda: products_of_a_call(bench.engine, token_lists))
    baseline = {(dtype, t): plain_generate(args.model, token_lists, dtype, t)
                for dtype in (torch.float32, torch.bfloat16) for t in (0.0, 1.0)}
    print(f"\n{args.prompts} requests x 64 new tokens, median of {args.rounds} rounds; "
          f"load average {loadavg()}\n")
    print("| window | greedy tokens/s (batches) | sampling tokens/s (batches) | "
          "greedy / sampling |")
    print("| --- | --- | --- | --- |")
    for name, (quiet_s, gather_s) in windows.items():
        cells = []
        for temperature in (0.0, 1.0):
            got = results[(name, temperature)]
            cells.append((statistics.median(r for r, _ in got), [int(b) for _, b in got]))
        (greedy, gb), (sampled, sb) = cells
        print(f"| {name}: {quiet_s * 1000:.0f} ms quiet, {gather_s * 1000:.0f} ms at most | "
              f"{greedy:.0f} ({gb}) | {sampled:.0f} ({sb}) | {greedy / sampled:.2f}x |")
    print("\n| plain `generate`, one batch | greedy tokens/s | sampling tokens/s | SDK greedy / it "
          "| SDK sampling / it |")
    print("| --- | --- | --- | --- | --- |")
    sdk = {t: statistics.median(r for r, _ in results[("now", t)]) for t in (0.0, 1.0)}
    for dtype in (torch.float32, torch.bfloat16):
        greedy, sampled = baseline[(dtype, 0.0)], baseline[(dtype, 1.0)]
        print(f"| {str(dtype).removeprefix('torch.')} | {greedy:.0f} | {sampled:.0f} | "
              f"{sdk[0.0] / greedy:.2f}x | {sdk[1.0] / sampled:.2f}x |")
    needed = len(token_lists) * NEW_TOKENS / (3 * baseline[(torch.float32, 0.0)])
    print(f"\nOne greedy engine call on the same prompts under `torch.profiler`: "
          f"{call_seconds:.1f} s, of which matrix products (mm, bmm, addmm, baddbmm; the "
          f"output head's included) {product_seconds:.1f} s ({product_seconds / call_seconds:.0%})."
          f"\n3x fp32 `generate`'s greedy rate needs the whole call within {needed:.1f} s: "
          f"the products alone are {product_seconds / needed:.2f}x that.")


PRODUCTS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")


def on_engine_thread(scheduler, fn):
    """`fn()` run by the scheduler as a control action, on the engine's own thread (another
    thread would start a second OpenMP team and time it slower, `engine_thread`)."""
    from concurrent.futures import Future

    from server.scheduling.scheduler import Work

    done: Future = Future()

    def finish(result, error) -> None:
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)

    scheduler.submit_control(Work(None, "profile", finish, action=fn))
    return done.result()


def products_of_a_call(engine, prompts: list[list[int]]) -> tuple[float, float]:
    """Seconds of one greedy `sample` call over `prompts` (64 new tokens each, in process) and
    the self time of its matrix products, from `torch.profiler`: what no scheduling or Python
    saves, only faster kernels or other numbers."""
    from torch.profiler import ProfilerActivity, profile

    from server.engine.engine import SampleJob, SamplingParams

    jobs = [SampleJob(None, prompt, 1, SamplingParams(max_tokens=NEW_TOKENS, seed=i,
                                                      temperature=0.0, stop=[]))
            for i, prompt in enumerate(prompts)]
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        started = time.perf_counter()
        engine.sample(jobs)
        seconds = time.perf_counter() - started
    products = sum(event.self_cpu_time_total for event in profiler.key_averages()
                   if event.key in PRODUCTS) / 1e6
    return seconds, products


def plain_generate(model: str | None, prompts: list[list[int]], dtype: torch.dtype,
                   temperature: float) -> float:
    """Tokens/s of plain `transformers` `generate` on all prompts in one batch (equal lengths,
    so no padding), exactly 64 new tokens each."""
    from transformers import AutoModelForCausalLM

    from server.engine.model_loading import embedded_cache_path

    plain = AutoModelForCausalLM.from_pretrained(model or str(embedded_cache_path()),
                                                 dtype=dtype).eval()
    ids = torch.tensor(prompts)
    kwargs = ({"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
              if temperature > 0 else {"do_sample": False})
    with torch.inference_mode():
        plain.generate(input_ids=ids[:2], max_new_tokens=2, min_new_tokens=2, **kwargs)
        started = time.perf_counter()
        out = plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=64, min_new_tokens=64, **kwargs)
        seconds = time.perf_counter() - started
    print(f"  plain generate {dtype} T={temperature:g}: {seconds:.1f} s", flush=True)
    return (out.shape[1] - ids.shape[1]) * len(prompts) / seconds


if __name__ == "__main__":
    main()
