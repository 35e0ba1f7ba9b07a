"""The vLLM sampler against the torch engine on one NVIDIA GPU: logprob agreement and speed.

What it does, in order:

1. loads the packaged Gemma 3 270M (the converted cache, `embedded_cache_path()`) into the
   torch engine and trains a LoRA (attention + MLP; vLLM cannot serve LoRA on Gemma's tied
   `lm_head`) for a few cross-entropy steps, so the adapter really moves the model;
2. starts `vllm serve` on the same cache directory with the flags the backend needs
   (`server.samplers.vllm_process.serve_command`: multi-LoRA, runtime adapter loading,
   `--logprobs-mode processed_logprobs`) and connects a `VLLMSampler`, which probes the
   server's logprob semantics;
3. agreement: samples with vLLM through the trained adapter at temperature 1 (and 0.7), then
   scores the same tokens with the trainer (the engine's forward_backward, forward only, at
   T = 1; the same forward with logits / T otherwise) and reports the mean and max absolute
   difference of per-token logprobs. This is the sampler-vs-trainer mismatch an RL loss sees;
4. speed: the same jobs (prompts x samples, fixed length: `stop=[]`) through the vLLM sampler
   and through the torch sampler, tokens per second each, and the ratio.

It needs a CUDA GPU and a `vllm` executable (vLLM pins its own torch, so it usually lives in a
separate environment: pass `--vllm-cmd /path/to/env/bin/vllm`); without either it exits with
status 2 and says which is missing. It exits 1 when the server's logprobs are not tempered or
the mean T = 1 disagreement exceeds `--tolerance`.

    python -m bench.bench_vllm
    python -m bench.bench_vllm --vllm-cmd /opt/vllm/bin/vllm --steps 5 --prompts 32
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "Write a SQL query that lists the names of all customers from Paris.",
    "Count the orders placed in 2023, grouped by month.",
    "Which products have never been ordered? Answer with SQL.",
    "Return the ten employees with the highest salary and their departments.",
    "Find the average rating of every movie released after 2010.",
    "List the airports that have more departures than arrivals.",
    "SQL: total revenue per region, largest first.",
    "Select the students enrolled in more than three courses.",
]
TRAINING_TEXT = [
    "Question: how many users are there? SQL: SELECT COUNT(*) FROM users;",
    "Question: list all cities. SQL: SELECT DISTINCT city FROM addresses;",
    "Question: the newest order. SQL: SELECT * FROM orders ORDER BY created_at DESC LIMIT 1;",
    "Question: names of admins. SQL: SELECT name FROM users WHERE role = 'admin';",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="vLLM sampler vs torch engine: logprob agreement and tokens/s (needs a GPU)")
    parser.add_argument("--vllm-cmd", default="vllm",
                        help="the vllm executable, possibly with a prefix (default: vllm)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="dtype of both the torch engine and vLLM (default: bfloat16)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (default: 16)")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: 5)")
    parser.add_argument("--lr", type=float, default=5e-4, help="learning rate (default: 5e-4)")
    parser.add_argument("--prompts", type=int, default=32,
                        help="prompts in the speed test (default: 32)")
    parser.add_argument("--samples", type=int, default=4,
                        help="samples per prompt (default: 4)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens per sample in the speed test (default: 128)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="vLLM's share of the GPU; the torch engine uses the rest")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest acceptable mean |logprob difference| at T=1")
    parser.add_argument("--ready-timeout", type=float, default=900.0,
                        help="seconds to wait for vllm serve to answer (default: 900)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where adapters and the vLLM log go (default: a temp dir)")
    return parser.parse_args(argv)


def die(status: int, message: str) -> None:
    print(f"bench_vllm: {message}", file=sys.stderr)
    raise SystemExit(status)


def preflight(args: argparse.Namespace) -> None:
    """Fail fast, before loading anything, when the machine cannot run this benchmark."""
    import torch

    if not torch.cuda.is_available():
        die(2, "no CUDA GPU is available; this benchmark needs an NVIDIA GPU (vLLM is "
               "Linux + NVIDIA only)")
    executable = shlex.split(args.vllm_cmd)[0]
    if shutil.which(executable) is None:
        die(2, f"{executable!r} not found; install vLLM (pip install 'vllm>=0.10.2', best in its "
               "own environment) or pass --vllm-cmd /path/to/bin/vllm")


def lora_rank_cap(rank: int) -> int:
    from server.samplers.vllm_process import LORA_RANKS

    return next(r for r in LORA_RANKS if r >= rank)


def train_adapter(engine, args: argparse.Namespace):
    """A few cross-entropy steps on SQL-ish text; returns the run and its losses."""
    import numpy as np

    from server.engine.engine import AdamParams, ForwardBackwardJob
    from server.engine.lora import LoraSpec
    from server.protocol.codec import Datum

    run = engine.create_run(LoraSpec(rank=args.rank, train_unembed=False), seed=0)
    data = []
    for text in TRAINING_TEXT:
        ids = np.asarray(engine.tokenizer.encode(text), dtype=np.int64)
        data.append(Datum(ids[:-1], {"target_tokens": ids[1:],
                                     "weights": np.ones(len(ids) - 1, dtype=np.float32)}))
    losses = []
    for _ in range(args.steps):
        result = engine.forward_backward([ForwardBackwardJob(run, data, "cross_entropy", {},
                                                             False)])[0]
        engine.optim_step(run, AdamParams(learning_rate=args.lr))
        losses.append(result.metrics["loss:sum"])
    return run, losses


def trainer_logprobs(engine, run, prompt: list[int], tokens: list[int], temperature: float):
    """The trainer's logprobs of `tokens` after `prompt` under temperature `temperature`."""
    import numpy as np
    import torch

    from server.engine.engine import ForwardBackwardJob
    from server.engine.lora import RowGroup, routing
    from server.protocol.codec import Datum

    if temperature == 1.0:  # exactly the training path: forward_backward, forward only
        full = np.asarray(prompt + tokens, dtype=np.int64)
        datum = Datum(full[:-1], {"target_tokens": full[1:],
                                  "weights": np.zeros(len(full) - 1, dtype=np.float32)})
        out = engine.forward_backward([ForwardBackwardJob(run, [datum], "cross_entropy", {},
                                                          True)])[0]
        return out.outputs[0]["logprobs"][len(prompt) - 1:]
    ids = torch.tensor([prompt + tokens], device=engine.device)
    with torch.inference_mode(), routing([RowGroup(run.adapter, 0, 1)]):
        logits = engine.model(input_ids=ids, use_cache=False).logits[0].float()
    rows = logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)] / temperature
    picked = torch.tensor(tokens, device=engine.device)[:, None]
    return torch.log_softmax(rows, -1).gather(-1, picked)[:, 0].cpu().numpy()


def agreement(engine, run, sampler, prompts: list[list[int]], temperature: float) -> dict:
    import numpy as np

    from server.engine.engine import SampleJob, SamplingParams

    adapter = run.adapter.frozen_copy()
    jobs = [SampleJob(adapter, p, 4, SamplingParams(max_tokens=64, temperature=temperature,
                                                    seed=i))
            for i, p in enumerate(prompts)]
    diffs = []
    for job, result in zip(jobs, sampler.sample(jobs), strict=True):
        for seq in result.sequences:
            if seq.tokens:
                ref = trainer_logprobs(engine, run, job.prompt, seq.tokens, temperature)
                diffs.append(np.abs(np.asarray(seq.logprobs) - ref))
    flat = np.concatenate(diffs)
    return {"temperature": temperature, "tokens": int(flat.size),
            "mean_abs_diff": float(flat.mean()), "max_abs_diff": float(flat.max())}


def tokens_per_second(sample, jobs, rounds: int = 3) -> float:
    """Median generated tokens per second of `sample(jobs)` over a few rounds."""
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        results = sample(jobs)
        seconds = time.perf_counter() - started
        rates.append(sum(len(s.tokens) for r in results for s in r.sequences) / seconds)
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preflight(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from server.engine.engine import Engine, SampleJob, SamplingParams
    from server.engine.model_loading import embedded_cache_path, load_base_model
    from server.entrypoints.runtime import free_port
    from server.samplers import VLLMSampler
    from server.samplers.openai_http import OpenAICompatClient
    from server.samplers.vllm_process import VLLMServer, serve_command

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    loaded = load_base_model(device="cuda", dtype=args.dtype)
    engine = Engine(loaded)
    run, losses = train_adapter(engine, args)
    print(f"trained rank-{args.rank} LoRA for {args.steps} steps: loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}")

    port = free_port()
    argv_, env = serve_command(
        embedded_cache_path(), served_model_name=engine.model_name, port=port, max_loras=4,
        max_lora_rank=lora_rank_cap(args.rank), dtype=args.dtype, max_model_len=2048,
        gpu_memory_utilization=args.gpu_memory_utilization, executable=args.vllm_cmd)
    url = f"http://127.0.0.1:{port}"
    server = VLLMServer(argv_, env, url, workdir / "vllm.log")
    print("starting:", shlex.join(argv_))
    summary: dict = {"losses": losses}
    try:
        server.start(args.ready_timeout)
        sampler = VLLMSampler(OpenAICompatClient(url), workdir, model=engine.model_name,
                              eos_token_ids=engine.eos_ids, strict_logprobs=False).start()
        try:
            summary["semantics"] = sampler.semantics.describe()
            print("vLLM logprobs:", summary["semantics"])
            prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
            temperatures = (1.0, 0.7) if sampler.semantics.tempered else (1.0,)
            summary["agreement"] = [agreement(engine, run, sampler, prompts, t)
                                    for t in temperatures]
            for row in summary["agreement"]:
                print(f"agreement T={row['temperature']}: {row['tokens']} tokens, mean |diff| "
                      f"{row['mean_abs_diff']:.4f}, max |diff| {row['max_abs_diff']:.4f}")

            adapter = run.adapter.frozen_copy()
            speed_prompts = [prompts[i % len(prompts)] for i in range(args.prompts)]
            jobs = [SampleJob(adapter, p, args.samples,
                              SamplingParams(max_tokens=args.max_tokens, stop=[], seed=i))
                    for i, p in enumerate(speed_prompts)]
            sampler.sample(jobs[:2])  # warm-up: adapter load, CUDA graphs
            engine.sample(jobs[:2])
            vllm_rate = tokens_per_second(sampler.sample, jobs)
            torch_rate = tokens_per_second(engine.sample, jobs)
            summary["speed"] = {"jobs": len(jobs), "samples": args.samples,
                                "max_tokens": args.max_tokens, "vllm_tokens_per_s": vllm_rate,
                                "torch_tokens_per_s": torch_rate,
                                "ratio": vllm_rate / torch_rate}
            print(f"speed: vLLM {vllm_rate:,.0f} tok/s, torch {torch_rate:,.0f} tok/s, "
                  f"ratio {vllm_rate / torch_rate:.1f}x")
        finally:
            sampler.close()
    finally:
        server.stop()
    print(json.dumps(summary))
    if not sampler.semantics.tempered:
        print("FAIL: vLLM reports raw logprobs", file=sys.stderr)
        return 1
    if summary["agreement"][0]["mean_abs_diff"] > args.tolerance:
        print(f"FAIL: mean |logprob diff| at T=1 exceeds {args.tolerance}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
