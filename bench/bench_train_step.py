"""One LoRA training step through the server versus the same math in process.

Server side: the `tinker` SDK against an in-process `ServerThread` serving the packaged Gemma 3
270M; one step is `forward_backward(batch, "cross_entropy")` plus `optim_step(AdamParams())`,
both submitted and then awaited, as a training loop does. In-process side: transformers + peft
on a second copy of the same weights, with what the server trains:

- LoRA rank r (default 8), alpha 32 (scale 32 / r), dropout 0, on q/k/v/o, gate/up/down and
  lm_head; A starts from the server run's own initial A and B from zero, so both sides compute
  the same losses step after step (printed as a check);
- loss: cross entropy weighted per token and summed over tokens;
- torch.optim.AdamW with the SDK's defaults (lr 1e-4, betas (0.9, 0.95), eps 1e-12, no weight
  decay).

Both are warmed up, then alternated (server, in-process, server, ...) so that drift in the load
of the shared machine falls on both; the medians and their ratio are what to read. The engine's
own busy time for the server step is shown too: the rest is HTTP, serialisation and polling.

    python -m bench.bench_train_step           # 10 rounds
    python -m bench.bench_train_step --quick   # 2 rounds, smoke run
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head"]


@dataclass
class Batch:
    """A right-padded batch and the per-sequence pieces the SDK sends."""

    tokens: list[np.ndarray]
    targets: list[np.ndarray]
    weights: list[np.ndarray]

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, mask, targets, weights) as `[B, T]` tensors, right-padded like the server."""
        width = max(len(t) for t in self.tokens)
        shape = (len(self.tokens), width)
        tokens, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
        targets, weights = torch.zeros(shape, dtype=torch.long), torch.zeros(shape)
        for i, (tok, tgt, w) in enumerate(zip(self.tokens, self.targets, self.weights,
                                              strict=True)):
            n = len(tok)
            tokens[i, :n] = torch.from_numpy(tok)
            mask[i, :n] = 1
            targets[i, :n] = torch.from_numpy(tgt)
            weights[i, :n] = torch.from_numpy(w)
        return tokens, mask, targets, weights


def make_batch(rows: int, length: int, vocab: int, prompt: float, seed: int = 0) -> Batch:
    """`rows` sequences of about `length` tokens; the first `prompt` fraction has weight 0."""
    rng = np.random.default_rng(seed)
    batch = Batch([], [], [])
    for _ in range(rows):
        n = int(length + rng.integers(-4, 5))
        seq = rng.integers(2, vocab, size=n + 1, dtype=np.int64)
        weights = np.ones(n, dtype=np.float32)
        weights[: int(n * prompt)] = 0.0
        batch.tokens.append(seq[:-1])
        batch.targets.append(seq[1:])
        batch.weights.append(weights)
    return batch


@dataclass
class Timings:
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    engine_seconds: list[float] = field(default_factory=list)


class ServerSide:
    """The SDK's training client against a server in this process."""

    def __init__(self, rank: int, data_dir: str):
        import tinker

        from server.entrypoints.runtime import ServerConfig, ServerThread

        self.tinker = tinker
        self.server = ServerThread(ServerConfig(port=0, data_dir=data_dir)).start()
        self.service = tinker.ServiceClient(base_url=self.server.url, api_key="tml-bench")
        self.client = self.service.create_lora_training_client(
            base_model=self.server.service.base_model, rank=rank, seed=0
        ).result()
        self.engine = self.server.service.engine

    def initial_adapter(self):
        (run,) = self.server.service.runs.values()
        return run.state.adapter

    def datums(self, batch: Batch) -> list:
        types = self.tinker.types
        return [
            types.Datum(
                model_input=types.ModelInput.from_ints(tok.tolist()),
                loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(tgt),
                                "weights": types.TensorData.from_numpy(w)},
            )
            for tok, tgt, w in zip(batch.tokens, batch.targets, batch.weights, strict=True)
        ]

    def step(self, data: list, out: Timings) -> None:
        busy = self.engine.stats.busy_seconds
        started = time.perf_counter()
        fb = self.client.forward_backward(data, "cross_entropy")
        opt = self.client.optim_step(self.tinker.types.AdamParams())
        result = fb.result()
        opt.result()
        out.seconds.append(time.perf_counter() - started)
        out.engine_seconds.append(self.engine.stats.busy_seconds - busy)
        out.losses.append(float(result.metrics["loss:sum"]))

    def close(self) -> None:
        self.service.close("success").result()
        self.server.stop()


class InProcessSide:
    """transformers + peft with the server's LoRA, loss and optimizer settings."""

    def __init__(self, rank: int, adapter, batch: Batch):
        import transformers
        from peft import LoraConfig, get_peft_model

        from server.engine.lora import LORA_ALPHA
        from server.engine.model_loading import embedded_cache_path

        base = transformers.AutoModelForCausalLM.from_pretrained(
            str(embedded_cache_path()), dtype=torch.float32
        )
        base.eval()
        for param in base.parameters():
            param.requires_grad_(False)
        config = LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                            target_modules=LORA_TARGETS)
        self.model = get_peft_model(base, config)
        self.model.eval()
        copied = self._copy_adapter(adapter)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if copied * 2 != len(trainable):
            raise RuntimeError(f"peft trains {len(trainable)} tensors, the server {copied * 2}")
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                           weight_decay=0.0)
        self.tokens, self.mask, self.targets, self.weights = batch.padded()

    def _copy_adapter(self, adapter) -> int:
        """Start from the server run's initial A and B, so both sides follow one trajectory."""
        inner = self.model.base_model.model
        with torch.no_grad():
            for name, a in adapter.a.items():
                module = inner.get_submodule(name)
                module.lora_A["default"].weight.copy_(a)
                module.lora_B["default"].weight.copy_(adapter.b[name])
        return len(adapter.a)

    def step(self, out: Timings) -> None:
        started = time.perf_counter()
        logits = self.model(input_ids=self.tokens, attention_mask=self.mask).logits
        token_loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), self.targets.flatten(), reduction="none"
        )
        loss = (token_loss * self.weights.flatten()).sum()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out.seconds.append(time.perf_counter() - started)
        out.losses.append(float(loss.detach()))


def quiet() -> None:
    """Keep the table readable: no progress bars, retry warnings or peft's tied-weight note."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("tinker").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="measured server/in-process pairs")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured pairs first")
    parser.add_argument("--rows", type=int, default=8, help="sequences per batch")
    parser.add_argument("--length", type=int, default=41, help="mean tokens per sequence")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--prompt-fraction", type=float, default=1 / 3,
                        help="leading share of each sequence with weight 0 (a prompt)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 warm-up, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 2, 1
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    quiet()

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} "
          f"loadavg(1,5,15)={loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as data_dir:
        server = ServerSide(args.rank, data_dir)
        try:
            batch = make_batch(args.rows, args.length, server.engine.vocab_size,
                               args.prompt_fraction)
            local = InProcessSide(args.rank, server.initial_adapter(), batch)
            data = server.datums(batch)
            tokens = sum(len(t) for t in batch.tokens)
            weighted = int(sum((w != 0).sum() for w in batch.weights))
            print(f"batch: {args.rows} sequences, {tokens} tokens ({weighted} weighted, "
                  f"padded to {local.tokens.shape[1]}), LoRA rank {args.rank} on "
                  f"{', '.join(LORA_TARGETS)}", flush=True)
            warm_server, warm_local = Timings(), Timings()
            for _ in range(args.warmup):
                server.step(data, warm_server)
                local.step(warm_local)
            served, inproc = Timings(), Timings()
            for i in range(args.rounds):
                server.step(data, served)
                local.step(inproc)
                print(f"  round {i + 1}: server {served.seconds[-1]:.3f}s  "
                      f"in-process {inproc.seconds[-1]:.3f}s  loadavg={loadavg()}", flush=True)
        finally:
            server.close()

    all_server = warm_server.losses + served.losses
    all_local = warm_local.losses + inproc.losses
    drift = max(abs(s - p) / max(abs(p), 1e-9) for s, p in zip(all_server, all_local, strict=True))
    server_s = statistics.median(served.seconds)
    engine_s = statistics.median(served.engine_seconds)
    local_s = statistics.median(inproc.seconds)
    print()
    print(f"{'per step (median of ' + str(args.rounds) + ')':<32}{'seconds':>10}")
    print(f"{'server, SDK end to end':<32}{server_s:>10.3f}")
    print(f"{'  of which engine busy':<32}{engine_s:>10.3f}")
    print(f"{'in-process transformers+peft':<32}{local_s:>10.3f}")
    print(f"ratio server/in-process: {server_s / local_s:.3f}  "
          f"(engine only: {engine_s / local_s:.3f})")
    print(f"losses, first step: server {all_server[0]:.4f}  in-process {all_local[0]:.4f}; "
          f"last step: server {all_server[-1]:.4f}  in-process {all_local[-1]:.4f}; "
          f"max relative difference {drift:.1e}")
    print(f"loadavg at end: {loadavg()}")


if __name__ == "__main__":
    main()
