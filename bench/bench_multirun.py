"""Many runs, one accelerator: what fusion, scheduling and eviction buy, measured side by side.

Each benchmark starts an in-process server (`ServerThread`) on the packaged Gemma 3 270M (or
`--model DIR`), drives it through the `tinker` SDK from client threads, and prints the figures
it compares in one table, with the command that reproduces it and the machine's load average
(these are measurements on a shared machine, not pass/fail tests):

  fusion-sampling  4 runs each sample 8 completions for 4 prompts. Fused server with concurrent
                   clients, versus fusion off with concurrent clients (sampling still batches
                   across runs), versus the runs one after another (each waits for its samples
                   before the next starts). Aggregate generated tokens/s and ratios.
  fusion-training  4 runs each submit forward_backward + optim_step at once, fusion on vs off.
  duty-cycle       1 vs 3 concurrent RL clients (sample a group, score it, train on it) whose
                   reward step lasts as long as a real DuckDB scoring pass of 8 predictions
                   (measured with `rewards.RewardPool`; `--reward-seconds` overrides it). The
                   engine's duty cycle over each phase.
  memory           32 runs trained one step each with at most 8 resident, against all 32
                   resident, each in a fresh process: peak RSS of both, evictions, and the
                   latency of the first request after eviction vs a resident request.
  sampler          the server's batched sampler (no LoRA) vs plain `model.generate` on the same
                   prompts, greedy, same number of new tokens: tokens/s and ratio.

    python -m bench.bench_multirun all                 # every benchmark, moderate sizes
    python -m bench.bench_multirun fusion-sampling     # one of them
    python -m bench.bench_multirun all --quick         # smoke run, tiny sizes
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch

API_KEY = "tml-bench"
PROMPTS = [
    "Schema: authors(id, name, country), books(id, author_id, title, year, price).\n"
    "Question: How many books did authors from India publish after 2010?\nSQL:",
    "Schema: customers(id, name, city), orders(id, customer_id, total, placed_at).\n"
    "Question: Which five cities have the highest total order value?\nSQL:",
    "Schema: employees(id, name, department, salary, hired_on).\n"
    "Question: What is the average salary per department, highest first?\nSQL:",
    "Schema: flights(id, origin, destination, departs, arrives, carrier).\n"
    "Question: List the carriers with more than 100 flights out of Boston.\nSQL:",
    "Schema: products(id, name, category, price), reviews(id, product_id, stars).\n"
    "Question: Which categories have an average rating below three stars?\nSQL:",
    "Schema: students(id, name, year), grades(student_id, course, score).\n"
    "Question: Who scored above 90 in every course they took?\nSQL:",
    "Schema: stations(id, city), readings(station_id, day, temperature).\n"
    "Question: What was the hottest day recorded in each city?\nSQL:",
    "Schema: teams(id, name), matches(id, home_id, away_id, home_goals, away_goals).\n"
    "Question: Which team won the most home matches?\nSQL:",
]


# ------------------------------------------------------------------ output
def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header(name: str, args: argparse.Namespace) -> None:
    flags = [name]
    if args.quick:
        flags.append("--quick")
    if args.model:
        flags += ["--model", args.model]
    if name == "duty-cycle" and args.reward_seconds is not None:
        flags += ["--reward-seconds", str(args.reward_seconds)]
    print(f"\n=== {name} ===")
    print("command:", shlex.join(["python", "bench/bench_multirun.py", *flags]))
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} "
          f"loadavg(1,5,15) at start={loadavg()}", flush=True)


def table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def quiet() -> None:
    """Keep the tables readable: no progress bars, retry notices or server request logs."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("tinker").setLevel(logging.ERROR)  # long-poll "try_again" notices
    for name in ("server", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")


# ------------------------------------------------------------------ server
class Bench:
    """One in-process server and an SDK client talking to it."""

    def __init__(self, args: argparse.Namespace, data_dir: str, limits=None):
        import tinker

        from server.entrypoints.runtime import ServerConfig, ServerThread
        from server.service.service import Limits

        self.tinker = tinker
        config = ServerConfig(model=args.model, port=0, data_dir=Path(data_dir), api_keys="",
                              limits=limits or Limits())
        self.server = ServerThread(config).start()
        self.service = self.server.service
        self.engine = self.service.engine
        self.client = tinker.ServiceClient(base_url=self.server.url, api_key=API_KEY)
        self.base_model = self.service.base_model

    def set_fuse(self, on: bool) -> None:
        """Fusion is a scheduler policy: flipping it on one server keeps everything else equal."""
        self.service.scheduler.fuse = on

    def new_runs(self, count: int, rank: int = 8, seed: int = 0) -> list:
        return [self.client.create_lora_training_client(base_model=self.base_model, rank=rank,
                                                        seed=seed + i).result()
                for i in range(count)]

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self.service.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def batch_stats(self, kind: str) -> tuple[float, float]:
        """(batches, sum of runs per batch) so far, from the batch_runs histogram."""
        return (self.metric("autoresearch_batch_runs_count", {"kind": kind}),
                self.metric("autoresearch_batch_runs_sum", {"kind": kind}))

    def close(self) -> None:
        self.client.close("success")
        self.server.stop()


@contextlib.contextmanager
def bench_server(args: argparse.Namespace, limits=None) -> Iterator[Bench]:
    with tempfile.TemporaryDirectory(prefix="bench-multirun-") as data_dir:
        bench = Bench(args, data_dir, limits)
        try:
            yield bench
        finally:
            bench.close()


@dataclass
class Phase:
    """One measured phase: wall time, work done, engine busy time and batching."""

    label: str
    seconds: float
    tokens: int
    engine_seconds: float
    batches: float
    runs_per_batch: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def measure(bench: Bench, label: str, kind: str, work: Callable[[], int]) -> Phase:
    busy = bench.engine.stats.busy_seconds
    batches, runs = bench.batch_stats(kind)
    started = time.perf_counter()
    tokens = work()
    seconds = time.perf_counter() - started
    batches2, runs2 = bench.batch_stats(kind)
    count = batches2 - batches
    return Phase(label, seconds, tokens, bench.engine.stats.busy_seconds - busy, count,
                 (runs2 - runs) / count if count else 0.0)


def phase_table(phases: list[Phase], unit: str) -> None:
    rows = [("", "seconds", f"{unit} tokens", "tokens/s", "engine busy s", "batches",
             "runs/batch")]
    rows += [(p.label, f"{p.seconds:.2f}", str(p.tokens), f"{p.tokens_per_second:.1f}",
              f"{p.engine_seconds:.2f}", f"{p.batches:.0f}", f"{p.runs_per_batch:.2f}")
             for p in phases]
    table(rows)


def sft_datum(tokens: list[int]):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:],
                                       "weights": [1.0] * (len(tokens) - 1)})


def random_batch(rows: int, length: int, vocab: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [sft_datum(rng.integers(2, vocab, size=length + 1).tolist()) for _ in range(rows)]


# ------------------------------------------------------------------ ceilings
def _median_seconds(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def decode_batching_ceiling(bench: Bench, prompts: list[list[int]], runs: int, group: int,
                            max_tokens: int, rounds: int) -> float:
    """What batching alone buys this hardware for this sampling work, with no server involved.

    The plain base model (`model.generate`, greedy, a fixed number of new tokens) decodes one
    run's rows (prompts x group) `runs` times, then all runs' rows in one batch. The ratio of
    their throughputs bounds what any fusion of these runs can gain here.
    """
    model, tokenizer = bench.engine.model, bench.engine.tokenizer
    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                  eos_token_id=None, temperature=None, top_p=None, top_k=None)
    pad = int(tokenizer.pad_token_id or 0)

    def generate(batch: list[list[int]]) -> None:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    one_run = [p for p in prompts for _ in range(group)]
    generate(one_run)  # warm-up
    apart = _median_seconds(lambda: [generate(one_run) for _ in range(runs)], rounds)
    together = _median_seconds(lambda: generate(one_run * runs), rounds)
    return apart / together


def train_batching_ceiling(bench: Bench, runs: int, rows: int, length: int,
                           rounds: int) -> float:
    """The same bound for training: forward + backward of the plain base model (gradients to
    the input embeddings, as frozen base weights have none) on each run's batch in turn, versus
    all runs' rows in one batch."""
    model = bench.engine.model
    vocab = bench.engine.vocab_size
    embed = model.get_input_embeddings()
    rng = np.random.default_rng(0)

    def step(count: int) -> None:
        ids = torch.tensor(rng.integers(2, vocab, size=(count, length + 1)))
        inputs = embed(ids[:, :-1]).detach().requires_grad_(True)
        logits = model(inputs_embeds=inputs, use_cache=False).logits.float()
        picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])
        picked.sum().backward()

    step(rows)  # warm-up
    apart = _median_seconds(lambda: [step(rows) for _ in range(runs)], rounds)
    together = _median_seconds(lambda: step(rows * runs), rounds)
    return apart / together


# --------------------------------------------------------- fusion-sampling
def fusion_sampling(args: argparse.Namespace) -> None:
    from tinker import types

    runs, prompts_per_run, group = (4, 2, 2) if args.quick else (4, 4, 8)
    max_tokens = 4 if args.quick else 16
    header("fusion-sampling", args)
    with bench_server(args) as bench:
        samplers = [c.save_weights_and_get_sampling_client().result()
                    for c in bench.new_runs(runs)]
        prompts = [types.ModelInput.from_ints(bench.encode(p)) for p in PROMPTS[:prompts_per_run]]
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=7, stop=[])

        def one_run(sampler) -> int:
            futures = [sampler.sample(p, group, params) for p in prompts]
            return sum(len(s.tokens) for f in futures for s in f.result().sequences)

        def concurrent() -> int:
            with ThreadPoolExecutor(runs) as pool:
                return sum(pool.map(one_run, samplers))

        def sequential() -> int:
            return sum(one_run(s) for s in samplers)

        one_run(samplers[0])  # warm-up
        print(f"{runs} runs x {prompts_per_run} prompts x {group} samples, {max_tokens} new "
              f"tokens each (no early stop), temperature 1", flush=True)
        phases = []
        for label, fuse, work in [("fused, runs concurrent", True, concurrent),
                                  ("fusion off, runs concurrent", False, concurrent),
                                  ("one run after another", False, sequential)]:
            bench.set_fuse(fuse)
            phases.append(measure(bench, label, "sample", work))
        bench.set_fuse(True)
        ceiling = decode_batching_ceiling(bench, [p.to_ints() for p in prompts], runs, group,
                                          max_tokens, rounds=1 if args.quick else 2)
    phase_table(phases, "generated")
    fused, unfused, serial = phases
    print(f"ratio fused / one-after-another: "
          f"{fused.tokens_per_second / serial.tokens_per_second:.2f}x   "
          f"fused / fusion-off-concurrent: "
          f"{fused.tokens_per_second / unfused.tokens_per_second:.2f}x")
    print("(sampling always batches pending requests across runs, so 'fusion off, concurrent' "
          "batches too; 'one after another' is the single-tenant baseline)")
    print(f"ceiling on this machine: plain model.generate on all runs' rows in one batch vs each "
          f"run's rows in turn: {ceiling:.2f}x (no server, no LoRA: what batching alone buys)")
    print(f"loadavg at end: {loadavg()}", flush=True)


# --------------------------------------------------------- fusion-training
def fusion_training(args: argparse.Namespace) -> None:
    from tinker import types

    runs, rows, length = 4, (2 if args.quick else 4), (16 if args.quick else 32)
    rounds = 1 if args.quick else 2
    header("fusion-training", args)
    with bench_server(args) as bench:
        clients = bench.new_runs(runs)
        batches = [random_batch(rows, length, bench.engine.vocab_size, seed=i)
                   for i in range(runs)]

        def step(pair) -> int:
            client, data = pair
            fb = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(types.AdamParams(learning_rate=1e-4))
            fb.result()
            opt.result()
            return sum(d.model_input.length for d in data)

        def all_runs() -> int:
            with ThreadPoolExecutor(runs) as pool:
                return sum(pool.map(step, zip(clients, batches, strict=True)))

        all_runs()  # warm-up
        print(f"{runs} runs, each forward_backward + optim_step on {rows} x {length} tokens, "
              f"submitted at once; {rounds} round(s) per mode, alternating", flush=True)
        phases: dict[bool, list[Phase]] = {True: [], False: []}
        for _ in range(rounds):
            for fuse in (True, False):
                bench.set_fuse(fuse)
                label = "fused" if fuse else "fusion off"
                phases[fuse].append(measure(bench, label, "train", all_runs))
        bench.set_fuse(True)
        ceiling = train_batching_ceiling(bench, runs, rows, length, rounds=max(2, rounds))
    every = phases[True] + phases[False]
    phase_table(every, "trained")
    on = statistics.median(p.seconds for p in phases[True])
    off = statistics.median(p.seconds for p in phases[False])
    print(f"ratio fused / fusion off (throughput, median wall time): {off / on:.2f}x")
    print(f"ceiling on this machine: plain forward+backward on all runs' rows in one batch vs "
          f"each run's rows in turn: {ceiling:.2f}x (no server, no LoRA, no optimizer)")
    print(f"loadavg at end: {loadavg()}", flush=True)


# -------------------------------------------------------------- duty-cycle
def reward_seconds(args: argparse.Namespace) -> tuple[float, str]:
    """How long scoring one group of 8 predictions takes with the real DuckDB rewards."""
    if args.reward_seconds is not None:
        return args.reward_seconds, "given by --reward-seconds (sleep)"
    try:
        from rewards import RewardPool
        from sqltasks import load_corpus
    except ImportError as exc:
        return 0.5, f"rewards not importable ({exc}); sleeping a default 0.5 s"
    tasks = load_corpus("train")[:6]
    timings = []
    with RewardPool(workers=2) as pool:
        for task in tasks:
            gold = task.gold_sql
            predictions = [gold, gold.replace("SELECT", "SELECT DISTINCT", 1), "SELECT 1",
                           "SELECT * FROM missing_table", gold + " LIMIT 1", gold.lower(),
                           "not sql at all", gold]
            started = time.perf_counter()
            pool.score_many([(p, task) for p in predictions])
            timings.append(time.perf_counter() - started)
    seconds = statistics.median(timings[1:])  # the first pass also starts the workers
    return seconds, (f"median of {len(timings) - 1} real scoring passes (8 predictions, one new "
                     f"task each, RewardPool with 2 workers): {seconds:.3f} s; clients sleep it")


def duty_cycle(args: argparse.Namespace) -> None:
    from tinker import types

    header("duty-cycle", args)
    reward_s, how = reward_seconds(args)
    print(f"reward step: {how}", flush=True)
    iterations, group = (2, 4) if args.quick else (3, 8)
    max_tokens = 4 if args.quick else 16
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=[])

    def rl_client(client, prompt: list[int], seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(iterations):
            sampler = client.save_weights_and_get_sampling_client().result()
            sequences = sampler.sample(types.ModelInput.from_ints(prompt), group,
                                       params).result().sequences
            time.sleep(reward_s)  # the scoring pass
            rewards = [rng.random() for _ in sequences]
            mean = sum(rewards) / len(rewards)
            data = []
            for seq, r in zip(sequences, rewards, strict=True):
                ids = prompt + list(seq.tokens)
                pad = [0.0] * (len(prompt) - 1)
                data.append(types.Datum(
                    model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": ids[1:],
                                    "logprobs": pad + list(seq.logprobs),
                                    "advantages": pad + [r - mean] * len(seq.tokens)}))
            fb = client.forward_backward(data, "importance_sampling")
            opt = client.optim_step(types.AdamParams(learning_rate=1e-5))
            fb.result()
            opt.result()

    results = []
    with bench_server(args) as bench:
        prompts = [bench.encode(p) for p in PROMPTS]
        clients = bench.new_runs(3)
        if not args.quick:
            rl_client(clients[0], prompts[0], seed=99)  # warm-up
        for count in (1, 3):
            busy = bench.engine.stats.busy_seconds
            started = time.monotonic()
            with ThreadPoolExecutor(count) as pool:
                list(pool.map(rl_client, clients[:count], prompts[:count], range(count)))
            ended = time.monotonic()
            wall = ended - started
            # The duty cycle keeps 60 s of history: a longer phase is judged on its last minute.
            window = min(wall, bench.service.metrics.duty.window)
            duty = bench.service.metrics.duty.fraction(window=window, now=ended)
            bench.service.metrics.refresh()
            scraped = bench.metric("autoresearch_engine_duty_cycle")
            results.append((count, wall, duty, (bench.engine.stats.busy_seconds - busy) / wall,
                            scraped))
    print(f"each client: {iterations} iterations of [snapshot, sample {group} x {max_tokens} "
          f"tokens, reward {reward_s:.3f} s, forward_backward(importance_sampling) + optim_step]")
    rows = [("clients", "wall s", "duty cycle (phase, last <= 60 s)", "engine busy / wall",
             "gauge (last 60 s)")]
    rows += [(str(c), f"{w:.2f}", f"{d:.1%}", f"{b:.1%}", f"{s:.1%}")
             for c, w, d, b, s in results]
    table(rows)
    print("(duty cycle = share of wall time the engine thread was executing a batch; the gauge "
          "covers the last minute, so it mixes phases when a phase is shorter)")
    print(f"loadavg at end: {loadavg()}", flush=True)


# ------------------------------------------------------------------ memory
class PeakRss:
    """Samples this process's resident set size on a thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def memory_cell(args: argparse.Namespace) -> None:
    """One configuration of the memory benchmark, in a process of its own: prints its figures
    as one `MEMORY {json}` line for `memory` to compare."""
    from tinker import types

    from server.service.service import Limits

    runs, cap = args.runs, args.cap
    mib = 1024 * 1024
    with bench_server(args, Limits(max_resident_runs=cap)) as bench:
        base_rss = psutil.Process().memory_info().rss
        data = random_batch(2, 24, bench.engine.vocab_size, seed=0)
        probe = data[:1]

        def create_and_train(seed: int):
            client = bench.client.create_lora_training_client(
                base_model=bench.base_model, rank=8, seed=seed).result()
            fb = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(types.AdamParams(learning_rate=1e-4))
            fb.result()
            opt.result()
            return client

        started = time.perf_counter()
        with PeakRss() as rss, ThreadPoolExecutor(4) as pool:
            clients = list(pool.map(create_and_train, range(runs)))
        train_s = time.perf_counter() - started
        spill = sum(p.stat().st_size for p in (bench.service.store.root / ".spill").glob("*.pt"))

        def timed_forward(client) -> float:
            t = time.perf_counter()
            client.forward(probe, "cross_entropy").result()
            return time.perf_counter() - t

        cold, warm = [], []
        for client in clients[: 2 if args.quick else 4]:
            run = bench.service.runs[client.model_id]
            if run.state is not None:
                continue
            cold.append(timed_forward(client))  # reloads the run from disk
            warm.append(timed_forward(client))  # now resident
        figures = {
            "train_s": train_s, "base_mib": base_rss / mib, "peak_mib": rss.peak / mib,
            "evictions": bench.metric("autoresearch_evictions_total"),
            "resident": bench.metric("autoresearch_resident_adapters"),
            "spill_mib": spill / mib,
            "cold_ms": 1000 * statistics.median(cold) if cold else None,
            "warm_ms": 1000 * statistics.median(warm) if warm else None,
        }
    print("MEMORY " + json.dumps(figures), flush=True)


def memory(args: argparse.Namespace) -> None:
    """The same 32 runs with at most 8 resident, and with all of them resident (the baseline),
    each in a fresh process so neither inherits the other's heap: peak RSS measured in both."""
    import subprocess

    runs, cap = (8, 2) if args.quick else (32, 8)
    header("memory", args)
    cells = {}
    for label, limit in (("capped", cap), ("all resident", runs)):
        command = [sys.executable, __file__, "memory-cell", "--runs", str(runs), "--cap",
                   str(limit), *(["--quick"] if args.quick else []),
                   *(["--model", args.model] if args.model else [])]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("MEMORY ")), None)
        if line is None:
            raise SystemExit(f"memory cell {label} failed:\n{done.stdout[-2000:]}"
                             f"{done.stderr[-2000:]}")
        cells[label] = json.loads(line.removeprefix("MEMORY "))
    capped, full = cells["capped"], cells["all resident"]
    print(f"{runs} runs (LoRA rank 8 on every projection and lm_head), each created and trained "
          f"one step (2 x 24 tokens) from 4 client threads; max_resident_runs={cap} against "
          f"{runs} (all resident), each in its own process")

    def value(cell: dict, key: str, fmt: str) -> str:
        return "n/a" if cell[key] is None else format(cell[key], fmt)

    growth = {k: c["peak_mib"] - c["base_mib"] for k, c in cells.items()}
    table([
        ("", f"max {cap} resident", f"all {runs} resident", "ratio"),
        ("create + train all runs, s", value(capped, "train_s", ".1f"),
         value(full, "train_s", ".1f"), f"{capped['train_s'] / full['train_s']:.2f}"),
        ("RSS after model load, MiB", value(capped, "base_mib", ".0f"),
         value(full, "base_mib", ".0f"), ""),
        ("peak RSS while training, MiB", value(capped, "peak_mib", ".0f"),
         value(full, "peak_mib", ".0f"), f"{capped['peak_mib'] / full['peak_mib']:.2f}"),
        ("peak RSS - RSS after load, MiB", f"{growth['capped']:.0f}",
         f"{growth['all resident']:.0f}",
         f"{growth['capped'] / max(growth['all resident'], 1e-9):.2f}"),
        ("evictions", value(capped, "evictions", ".0f"), value(full, "evictions", ".0f"), ""),
        ("resident adapters at end", value(capped, "resident", ".0f"),
         value(full, "resident", ".0f"), ""),
        ("spill files on disk, MiB", value(capped, "spill_mib", ".0f"),
         value(full, "spill_mib", ".0f"), ""),
        ("first request after eviction, ms (median)", value(capped, "cold_ms", ".0f"), "", ""),
        ("same request once resident, ms (median)", value(capped, "warm_ms", ".0f"), "", ""),
    ])
    print("(latency: forward on 1 x 24 tokens through the SDK on evicted runs, each asked twice "
          "in a row)")
    print(f"loadavg at end: {loadavg()}", flush=True)


# ----------------------------------------------------------------- sampler
def sampler_vs_generate(args: argparse.Namespace) -> None:
    from tinker import types

    from server.engine.model_loading import load_base_model

    rows, max_tokens = (4, 4) if args.quick else (8, 24)
    rounds = 1 if args.quick else 2
    header("sampler", args)
    plain = load_base_model(args.model)
    tokenizer = plain.tokenizer
    prompts = [tokenizer.encode(p) for p in PROMPTS[:rows]]
    config = copy.deepcopy(plain.model.generation_config)
    config.update(do_sample=False, max_new_tokens=max_tokens, min_new_tokens=None,
                  eos_token_id=None, temperature=None, top_p=None, top_k=None)

    def generate() -> tuple[int, list[list[int]]]:
        width = max(len(p) for p in prompts)
        pad = int(tokenizer.pad_token_id or 0)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = plain.model.generate(input_ids=ids, attention_mask=mask,
                                       generation_config=config)
        new = out[:, width:].tolist()
        return sum(len(r) for r in new), new

    with bench_server(args) as bench:
        sampler = bench.client.create_sampling_client(base_model=bench.base_model).result()
        params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=[])

        def serve() -> tuple[int, list[list[int]]]:
            futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
            seqs = [f.result().sequences[0].tokens for f in futures]
            return sum(len(s) for s in seqs), [list(s) for s in seqs]

        serve()
        generate()  # warm-ups
        timings: dict[str, list[float]] = {"server sampler": [], "model.generate": []}
        busy: list[float] = []
        batches_before = bench.batch_stats("sample")[0]
        outputs: dict[str, list[list[int]]] = {}
        tokens = 0
        for _ in range(rounds):
            for label, fn in (("server sampler", serve), ("model.generate", generate)):
                engine_busy = bench.engine.stats.busy_seconds
                started = time.perf_counter()
                tokens, outputs[label] = fn()
                timings[label].append(time.perf_counter() - started)
                if label == "server sampler":
                    busy.append(bench.engine.stats.busy_seconds - engine_busy)
        batches = (bench.batch_stats("sample")[0] - batches_before) / rounds
    same = sum(a == b for x, y in zip(outputs["server sampler"], outputs["model.generate"],
                                      strict=True) for a, b in zip(x, y, strict=False))
    total = sum(len(x) for x in outputs["server sampler"])
    print(f"{rows} prompts, greedy, {max_tokens} new tokens each (no early stop), one batch; "
          f"{rounds} round(s) alternating, median shown")
    rows_out = [("", "seconds", "tokens/s")]
    medians = {k: statistics.median(v) for k, v in timings.items()}
    rows_out += [(k, f"{s:.2f}", f"{tokens / s:.1f}") for k, s in medians.items()]
    engine_s = statistics.median(busy)
    rows_out.insert(2, ("  of which engine busy", f"{engine_s:.2f}", f"{tokens / engine_s:.1f}"))
    table(rows_out)
    print(f"ratio server sampler / model.generate (tokens/s): "
          f"{medians['model.generate'] / medians['server sampler']:.2f}x")
    print(f"greedy tokens identical: {same}/{total}; the server decoded its {rows} requests in "
          f"{batches:.1f} engine batches per round (the first to arrive starts alone)")
    print(f"loadavg at end: {loadavg()}", flush=True)


BENCHMARKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "fusion-sampling": fusion_sampling,
    "fusion-training": fusion_training,
    "duty-cycle": duty_cycle,
    "memory": memory,
    "sampler": sampler_vs_generate,
}
CELLS: dict[str, Callable[[argparse.Namespace], None]] = {"memory-cell": memory_cell}
"""Parts a benchmark runs in a child process of its own; not benchmarks by themselves."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("benchmark", choices=[*BENCHMARKS, "all", *CELLS])
    parser.add_argument("--model", default=None,
                        help="model directory or id (default: the packaged Gemma 3 270M)")
    parser.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    parser.add_argument("--reward-seconds", type=float, default=None,
                        help="duty-cycle: sleep this long per reward step instead of measuring "
                             "a real scoring pass")
    parser.add_argument("--runs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    quiet()
    if args.benchmark in CELLS:
        CELLS[args.benchmark](args)
        return
    print("command:", shlex.join(["python", "bench/bench_multirun.py", *sys.argv[1:]]))
    names = list(BENCHMARKS) if args.benchmark == "all" else [args.benchmark]
    for name in names:
        BENCHMARKS[name](args)


if __name__ == "__main__":
    main()
