"""What a GPU (or a Mac) shows that the CPU cannot: one pass, a JSON record and a table.

For each model shape (the tests' tiny Gemma 3, then random models of Gemma 3 270M's and 1B's
exact shapes, built here: no Hub access needed) on `--device`:

1. **Layout and claims**: the dtype, the activation dtype, and the flags the server would
   report (`batch_invariant`, `sampler_trainer_bitwise`, `deterministic`).
2. **First samples**: with and without an adapter (a wholly-bf16 model once crashed here).
3. **Every loss** trains (forward_backward, then optim_step).
4. **Numerics, measured, not claimed**: the trainer's logprob of each sampled token against the
   sampler's (largest and mean gap); a request alone against the same request fused with three
   others (share of equal tokens and of bitwise-equal logprobs), with the device's default path
   and with the invariant path forced on; a training run alone and fused (bitwise-equal
   gradients); the same request twice alone (run-to-run determinism).
5. **Host synchronisations inside the layer loop** (training and sampling), counted.
6. **Speed** (the 270M and 1B shapes): this machine's bf16 matmul rate (an 8192-cube product,
   measured in this run: the roofline); greedy and T=1 decoding of 48 prompts x 64 new tokens
   through the engine against batched `transformers` generate on the same prompts, in tokens/s
   and as a ratio; an SFT step (8 x 512 tokens) and an RL step (64 rollouts) as tokens/s and as
   a fraction of the roofline (6 x parameters x tokens).
7. **The SDK's whole surface** against `python -m server --device DEVICE` on the tiny model (the
   compatibility report's counts).
8. **vLLM**: whether it is installed; when it is, the documented serve command is printed (its
   run needs a trained adapter and minutes of start-up: `bench/bench_vllm.py`).

    python -m bench.device_check --device cuda --out runs/device-check     # ~5 min on one H200
    python -m bench.device_check --device mps --shapes tiny,270m           # on a Mac

Every section is guarded: a failure is recorded with its error and the next section runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from server.engine.engine import (
    AdamParams,
    Engine,
    ForwardBackwardJob,
    SampleJob,
    SamplingParams,
)
from server.engine.lora import LoraSpec
from server.engine.losses import LOSSES, RECORDED_LOGPROBS, RECORDED_MASK
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from tools.gemma_shapes import SHAPES, build_model
from tools.host_syncs import syncs_inside_layers

RECORD: dict = {}
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS handle


def guarded(name: str, out: Path):
    """Run a section, record its result or its error, write the record after each."""
    def wrap(fn):
        started = time.perf_counter()
        try:
            RECORD[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a device check reports every failure
            RECORD[name] = {"error": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc()[-2000:]}
        RECORD.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(RECORD, indent=1, default=str))
        print(f"[{name}] {json.dumps(RECORD[name], default=str)[:1500]}", flush=True)
        return RECORD[name]
    return wrap


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def new_state(engine: Engine, seed: int, rank: int = 8):
    state = engine.create_run(LoraSpec(rank=rank), seed=seed)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed + 100)
        for b in state.adapter.b.values():
            b.copy_(torch.randn(b.shape, generator=generator) * 0.02)
    return state


def rl_group(rng, vocab: int, prompt_len: int, sizes: list[int]) -> list[Datum]:
    prompt = rng.integers(5, vocab, size=prompt_len)
    data = []
    for size in sizes:
        full = np.concatenate([prompt, rng.integers(5, vocab, size=size)])
        n = len(full) - 1
        advantages = np.zeros(n, np.float32)
        advantages[prompt_len - 1:] = rng.normal()
        logprobs = np.zeros(n, np.float32)
        logprobs[prompt_len - 1:] = rng.normal(-2.0, 0.3, size=size)
        data.append(Datum(full[:-1], {"target_tokens": full[1:], "logprobs": logprobs,
                                      "advantages": advantages,
                                      RECORDED_LOGPROBS: logprobs.copy(),
                                      RECORDED_MASK: (logprobs != 0).astype(np.float32)}))
    return data


def sft_data(rng, vocab: int, count: int, length: int, scored: int) -> list[Datum]:
    data = []
    for _ in range(count):
        full = rng.integers(5, vocab, size=length + 1)
        weights = np.zeros(length, np.float32)
        weights[-scored:] = 1.0
        data.append(Datum(full[:-1], {"target_tokens": full[1:], "weights": weights}))
    return data


# ---------------------------------------------------------------- per-shape checks
def layout_facts(engine: Engine) -> dict:
    return {"device": str(engine.device), "layout": engine.layout.name,
            "dtype": str(engine.dtype), "activation_dtype": str(engine.activation_dtype),
            "invariant_path_default": engine.batch_invariant,
            "batch_invariant_claimed": engine.invariance_guaranteed,
            "sampler_trainer_bitwise_claimed": engine.invariance_guaranteed,
            "deterministic": engine.invariance_guaranteed or engine.deterministic,
            "fused_optimizer": engine.fused_optimizer}


def first_samples(engine: Engine) -> dict:
    out = {}
    for name, adapter in (("base", None), ("adapter", new_state(engine, 1).adapter)):
        result = engine.sample([SampleJob(adapter, [5, 6, 7, 8, 9], 2,
                                          SamplingParams(max_tokens=8, seed=1))])[0]
        out[name] = [len(s.tokens) for s in result.sequences]
    return out


def every_loss(engine: Engine) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for loss in sorted(LOSSES):
        state = new_state(engine, 2)
        data = (sft_data(rng, engine.vocab_size, 2, 40, 10) if loss == "cross_entropy"
                else rl_group(rng, engine.vocab_size, 24, [8, 12, 6]))
        config = {"beta": 0.05} if loss == "dro" else {}
        result = engine.forward_backward([ForwardBackwardJob(state, data, loss, config,
                                                             False)])[0]
        engine.optim_step(state, AdamParams(learning_rate=1e-3))
        out[loss] = round(float(result.metrics["loss:sum"]), 4)
    return out


def sampler_vs_trainer(engine: Engine) -> dict:
    state = new_state(engine, 3)
    prompt = list(range(5, 45))
    result = engine.sample([SampleJob(state.adapter, prompt, 8,
                                      SamplingParams(max_tokens=32, seed=3, stop=[]))])[0]
    data = []
    for seq in result.sequences:
        full = np.asarray(prompt + seq.tokens, dtype=np.int64)
        data.append(Datum(full[:-1], {"target_tokens": full[1:],
                                      "weights": np.ones(len(full) - 1, np.float32)}))
    trained = engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {},
                                                          True)])[0]
    gaps = np.concatenate([
        np.abs(out["logprobs"][len(prompt) - 1:] - np.asarray(seq.logprobs, np.float32))
        for seq, out in zip(result.sequences, trained.outputs, strict=True)])
    return {"tokens": int(gaps.size), "max_gap": float(gaps.max()),
            "mean_gap": float(gaps.mean()), "bitwise_equal_share": float(np.mean(gaps == 0))}


def _request(engine: Engine, others: int) -> list[SampleJob]:
    rng = np.random.default_rng(3)
    vocab = engine.vocab_size
    jobs = [SampleJob(new_state(engine, 1).adapter, rng.integers(5, vocab, 14).tolist(), 6,
                      SamplingParams(max_tokens=24, seed=7, stop=[]), prompt_logprobs=True)]
    for k, (length, samples, max_tokens) in enumerate([(45, 3, 40), (5, 9, 8), (20, 1, 30)]):
        if k < others:
            jobs.append(SampleJob(new_state(engine, 30 + k).adapter,
                                  rng.integers(5, vocab, length).tolist(), samples,
                                  SamplingParams(max_tokens=max_tokens, seed=k,
                                                 temperature=0.8 + 0.3 * k)))
    return jobs


def _train(engine: Engine, others: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    vocab = engine.vocab_size
    jobs = [ForwardBackwardJob(new_state(engine, 1), rl_group(rng, vocab, 12, [5, 9, 3, 7]),
                               "importance_sampling", {}, False)]
    for k in range(others):
        other = np.random.default_rng(10 + k)
        jobs.append(ForwardBackwardJob(new_state(engine, 20 + k),
                                       rl_group(other, vocab, 30 + 7 * k, [4, 11]), "ppo", {},
                                       False))
    engine.forward_backward(jobs)
    return {name: t.grad.detach().clone() for name, t in
            zip(sorted(jobs[0].state.adapter.b), [jobs[0].state.adapter.b[n]
                                                  for n in sorted(jobs[0].state.adapter.b)])}


def alone_and_fused(engine: Engine) -> dict:
    out = {}
    default = engine.batch_invariant
    for path, invariant in (("default path", default), ("invariant path forced", True)):
        engine.batch_invariant = invariant
        try:
            alone = engine.sample(_request(engine, 0))[0]
            again = engine.sample(_request(engine, 0))[0]
            fused = engine.sample(_request(engine, 3))[0]
            pairs = list(zip(alone.sequences, fused.sequences, strict=True))
            tokens_equal = float(np.mean([a.tokens == b.tokens for a, b in pairs]))
            lp_equal = float(np.mean([np.array_equal(a.logprobs, b.logprobs) for a, b in pairs
                                      if a.tokens == b.tokens] or [0.0]))
            repeat = all(a.tokens == b.tokens and np.array_equal(a.logprobs, b.logprobs)
                         for a, b in zip(alone.sequences, again.sequences, strict=True))
            prompt_equal = bool(np.array_equal(alone.prompt_logprobs, fused.prompt_logprobs,
                                               equal_nan=True))
            grads_alone, grads_fused = _train(engine, 0), _train(engine, 3)
            grads_equal = all(torch.equal(grads_alone[n], grads_fused[n]) for n in grads_alone)
            grads_repeat = all(torch.equal(grads_alone[n], g)
                               for n, g in _train(engine, 0).items())
            out[path] = {"invariant": invariant, "sample_tokens_equal_share": tokens_equal,
                         "sample_logprobs_bitwise_share": lp_equal,
                         "prompt_logprobs_bitwise": prompt_equal,
                         "same_request_twice_bitwise": repeat,
                         "training_grads_alone_vs_fused_bitwise": grads_equal,
                         "training_grads_twice_bitwise": grads_repeat}
        finally:
            engine.batch_invariant = default
    return out


def host_syncs(engine: Engine) -> dict:
    rng = np.random.default_rng(0)
    layers = list(engine.model.model.layers)
    state = new_state(engine, 1)
    data = rl_group(rng, engine.vocab_size, 40, [6, 9, 4])
    jobs = [SampleJob(state.adapter, list(range(5, 45)), 4, SamplingParams(max_tokens=6, seed=1))]
    with syncs_inside_layers(layers) as seen:
        engine.forward_backward([ForwardBackwardJob(state, data, "ppo", {}, False)])
        engine.sample(jobs)
    return {"inside_layers": dict(seen), "steps": "one forward_backward, one 6-token sample"}


# ---------------------------------------------------------------- speed
def matmul_roofline(device: torch.device) -> dict:
    if device.type == "cpu":
        n, dtype = 2048, torch.float32
    else:
        n, dtype = 8192, torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    seconds = (time.perf_counter() - started) / 10
    return {"n": n, "dtype": str(dtype), "tflops": round(2 * n**3 / seconds / 1e12, 1)}


def decode_speed(engine: Engine, directory: Path, prompts: int = 48, prompt_len: int = 100,
                 new: int = 64) -> dict:
    from transformers import AutoModelForCausalLM

    rng = np.random.default_rng(0)
    tokens = [rng.integers(5, 300, prompt_len).tolist() for _ in range(prompts)]
    out = {"prompts": prompts, "prompt_tokens": prompt_len, "new_tokens": new}
    for name, temperature in (("greedy", 0.0), ("T=1", 1.0)):
        jobs = [SampleJob(None, t, 1, SamplingParams(max_tokens=new, temperature=temperature,
                                                     seed=i, stop=[]))
                for i, t in enumerate(tokens)]
        engine.sample(jobs)  # warm-up at the full width: the allocator and kernel choices
        sync(engine.device)
        started = time.perf_counter()
        results = engine.sample(jobs)
        sync(engine.device)
        seconds = time.perf_counter() - started
        made = sum(len(r.sequences[0].tokens) for r in results)
        out[f"engine {name} tokens/s"] = round(made / seconds, 1)
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=engine.dtype).to(engine.device)
    plain.eval()
    ids = torch.tensor(tokens, device=engine.device)
    mask = torch.ones_like(ids)
    for name, sample in (("greedy", False), ("T=1", True)):
        kwargs = {"do_sample": sample, "max_new_tokens": new, "min_new_tokens": new,
                  "attention_mask": mask, "pad_token_id": 0}
        if sample:
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
        with torch.inference_mode():
            plain.generate(ids, **kwargs)  # warm-up at the full width
            sync(engine.device)
            started = time.perf_counter()
            generated = plain.generate(ids, **kwargs)
            sync(engine.device)
        seconds = time.perf_counter() - started
        made = (generated.shape[1] - prompt_len) * prompts
        out[f"transformers {name} tokens/s"] = round(made / seconds, 1)
        out[f"{name} ratio"] = round(out[f"engine {name} tokens/s"]
                                     / out[f"transformers {name} tokens/s"], 2)
    del plain
    if torch.are_deterministic_algorithms_enabled():
        # What the deterministic kernels cost: the engine at T=1 again with them off.
        torch.use_deterministic_algorithms(False)
        try:
            jobs = [SampleJob(None, t, 1, SamplingParams(max_tokens=new, seed=i, stop=[]))
                    for i, t in enumerate(tokens)]
            engine.sample(jobs)
            sync(engine.device)
            started = time.perf_counter()
            results = engine.sample(jobs)
            sync(engine.device)
            made = sum(len(r.sequences[0].tokens) for r in results)
            out["engine T=1 tokens/s, deterministic kernels off"] = round(
                made / (time.perf_counter() - started), 1)
        finally:
            torch.use_deterministic_algorithms(True, warn_only=True)
    return out


def step_speed(engine: Engine, roofline_tflops: float) -> dict:
    params = sum(p.numel() for p in engine.model.parameters())
    rng = np.random.default_rng(0)
    out = {"parameters": params}
    shapes = {"SFT step (8 x 512 tokens, last 64 scored)":
              ("cross_entropy", sft_data(rng, engine.vocab_size, 8, 512, 64)),
              "RL step (8 prompts x 8 samples, 100 + 64 tokens)":
              ("importance_sampling", [d for _ in range(8)
                                       for d in rl_group(rng, engine.vocab_size, 100, [64] * 8)])}
    for name, (loss, data) in shapes.items():
        state = new_state(engine, 4, rank=16)
        job = ForwardBackwardJob(state, data, loss, {}, False)
        engine.forward_backward([job])
        engine.optim_step(state, AdamParams(learning_rate=1e-4))
        sync(engine.device)
        started = time.perf_counter()
        for _ in range(3):
            engine.forward_backward([ForwardBackwardJob(state, data, loss, {}, False)])
            engine.optim_step(state, AdamParams(learning_rate=1e-4))
        sync(engine.device)
        seconds = (time.perf_counter() - started) / 3
        tokens = sum(len(d.tokens) for d in data)
        # A frozen base costs about 4·N a token (forward, and backward to the activations
        # only); LoRA's own weight gradients are a rounding error beside it. 6·N, the count
        # for training every weight, would overstate the fraction 1.5x.
        flops = 4 * params * tokens
        out[name] = {"seconds": round(seconds, 3), "tokens/s": round(tokens / seconds),
                     "roofline_fraction": round(flops / seconds / (roofline_tflops * 1e12), 3)}
    # Sized from free memory at the first step above (or fixed, with the reason).
    out["microbatch"] = {"tokens": engine.tokens_per_microbatch,
                         "sizing": engine.microbatch_sizing}
    return out


def fused_runs(engine: Engine) -> dict:
    """Four small runs (2 prompts x 8 samples x 24 tokens each) with the invariant path forced:
    their samples in one `sample` call against a call per run, then their training's
    micro-batches in shared body passes against one pass each, same data; where a small run
    leaves the device idle, this is what fusing runs buys."""
    rng = np.random.default_rng(1)
    data = [[d for _ in range(2) for d in rl_group(rng, engine.vocab_size, 100, [24] * 8)]
            for _ in range(4)]
    states = [new_state(engine, 30 + k, rank=16) for k in range(4)]
    default, was_fused, out, grads = engine.batch_invariant, engine.fuse_invariant_runs, {}, {}
    engine.batch_invariant = True
    try:
        prompts = [rng.integers(5, engine.vocab_size, 40).tolist() for _ in range(2)]
        per_run = [[SampleJob(state.adapter, prompt, 8,
                              SamplingParams(max_tokens=24, seed=k, temperature=1.0, stop=[]))
                    for k, prompt in enumerate(prompts)] for state in states]
        tokens = {}
        for together in (True, False, True, False):
            sync(engine.device)
            started = time.perf_counter()
            if together:
                results = engine.sample([job for jobs in per_run for job in jobs])
            else:
                results = [r for jobs in per_run for r in engine.sample(jobs)]
            sync(engine.device)
            label = "samples in one call" if together else "samples in a call per run"
            out[f"{label} seconds"] = round(time.perf_counter() - started, 3)
            tokens[together] = [[s.tokens for s in r.sequences] for r in results]
        out["sampling speed-up"] = round(out["samples in a call per run seconds"]
                                         / out["samples in one call seconds"], 2)
        out["samples identical"] = tokens[True] == tokens[False]
        for fuse in (True, False, True, False):
            engine.fuse_invariant_runs = fuse
            for state in states:
                state.optimizer.zero_grad(set_to_none=True)
            sync(engine.device)
            started = time.perf_counter()
            engine.forward_backward([ForwardBackwardJob(state, d, "importance_sampling", {},
                                                        False) for state, d in zip(states, data)])
            sync(engine.device)
            label = "fused passes" if fuse else "one pass per micro-batch"
            out[f"{label} seconds"] = round(time.perf_counter() - started, 3)
            grads[fuse] = [t.grad.clone() for s in states for t in s.adapter.parameters()]
    finally:
        engine.batch_invariant, engine.fuse_invariant_runs = default, was_fused
    out["training speed-up"] = round(out["one pass per micro-batch seconds"]
                                     / out["fused passes seconds"], 2)
    out["gradients bitwise equal"] = all(torch.equal(a, b)
                                         for a, b in zip(grads[True], grads[False]))
    return out


# ---------------------------------------------------------------- the SDK
def sdk_surface(model_dir: Path, device: str, workdir: Path, report: Path) -> dict:
    from tools import compat_report
    from tools.compat_report import Status
    from tools.processes import ServiceProcess, server_command

    port = 8765
    env = {**os.environ, "AUTORESEARCH_API_KEYS": "tml-device-check", "HF_HUB_OFFLINE": "1"}
    command = server_command("--model", str(model_dir), "--device", device, "--port", str(port),
                             "--data-dir", str(workdir / "server-data"))
    with ServiceProcess(command, workdir / "server.log", f"http://127.0.0.1:{port}", env) as srv:
        started = time.perf_counter()
        srv.wait_answers(timeout=180)
        up = time.perf_counter() - started
        compat_report.main(["--url", srv.url, "--api-key", "tml-device-check", "--out",
                            str(report), "--timeout", "60", "--model-label",
                            f"tiny Gemma 3 on {device}"])
    text = report.read_text()
    summary = next((line for line in text.splitlines() if "supported**" in line), "")
    failed = [line for line in text.splitlines()
              if line.startswith("| `") and f"| {Status.FAILED.value} |" in line]
    return {"server_start_seconds": round(up, 1), "summary": summary, "failed_rows": failed[:20]}


def vllm_status() -> dict:
    if importlib.util.find_spec("vllm") is None:
        return {"installed": False,
                "note": "vllm is not installed here; bench/bench_vllm.py runs it where it is"}
    import vllm

    from server.samplers.vllm_process import serve_command

    return {"installed": True, "version": vllm.__version__,
            "serve_command": serve_command("MODEL_DIR", served_model_name="google/gemma-3-270m")}


def check_shape(shape: str, directory: Path, device: str, tflops: float,
                record_path: Path) -> None:
    """Every per-shape section on one engine (speed only for the real models' shapes)."""
    engine = Engine(load_base_model(str(directory), device=device))
    checks = [("layout", layout_facts), ("first samples", first_samples),
              ("every loss", every_loss), ("sampler vs trainer", sampler_vs_trainer),
              ("alone vs fused", alone_and_fused), ("host syncs", host_syncs)]
    if shape != "tiny":
        checks += [("decoding", lambda e: decode_speed(e, directory)),
                   ("training steps", lambda e: step_speed(e, tflops)),
                   ("fused runs", fused_runs)]
    for name, check in checks:
        guarded(f"{shape}: {name}", record_path)(lambda check=check: check(engine))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="tiny,270m,1b",
                        help=f"comma-separated: tiny and any of {', '.join(SHAPES)}")
    parser.add_argument("--out", type=Path, default=Path("runs/device-check"))
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where models and server data go (default: a temporary folder)")
    parser.add_argument("--no-sdk", action="store_true", help="skip the server round trip")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record_path = args.out / "device_check.json"
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="device-check-"))
    device = torch.device(args.device)
    RECORD["machine"] = {
        "torch": torch.__version__,
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)),
        "capability": (".".join(map(str, torch.cuda.get_device_capability(device)))
                       if device.type == "cuda" else None),
    }
    roofline = guarded("roofline", record_path)(lambda: matmul_roofline(device))
    tflops = roofline.get("tflops", 0.0) if isinstance(roofline, dict) else 0.0
    for shape in ["tiny", *(s for s in args.shapes.split(",") if s != "tiny")]:
        directory = workdir / f"gemma3-{shape}"
        if not (directory / "config.json").exists():
            build_model(directory, shape, device=args.device if shape != "tiny" else "cpu")
        if shape == "tiny" and not args.no_sdk:  # the SDK first: it matters more than speed
            guarded("sdk surface", record_path)(
                lambda directory=directory: sdk_surface(directory, args.device, workdir,
                                                         args.out / "compat.md"))
        if shape in args.shapes.split(","):
            check_shape(shape, directory, args.device, tflops, record_path)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    guarded("vllm", record_path)(vllm_status)
    print(f"wrote {record_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
