"""A hostile second tenant against a healthy one: what each kind of bad input gets, and what it
costs the server and the other tenant.

`python -m server` runs in its own process on a tiny random Gemma 3 with Gemma's real vocabulary
(262144, so every output-head tensor has its real width), with two API keys. The victim trains
a run one step and records its logprobs; the attacker then sends every kind of bad input found
by probing the protocol (wrong JSON types, unreadable bodies, names and TTLs that break file
systems, sampling parameters past their limits, loss inputs that do not fit, non-finite steps,
requests that ask for far more memory than they carry) and a seeded fuzz of every endpoint.

Printed per kind: requests, status classes (futures by their failure category), server faults
(target 0). Then the victim: its logprobs compared bit for bit with those before, and its next
step's latency against the same step before the campaign (a ratio measured in this run); and
the server's RSS before and after, with the number of results it still holds.

    python -m bench.bench_hostile               # 400 fuzzed JSON + 100 fuzzed protobuf requests
    python -m bench.bench_hostile --fuzz 2000
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

VICTIM, ATTACKER = "tml-bench-victim", "tml-bench-attacker"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fuzz", type=int, default=400, help="fuzzed JSON requests")
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()

    import tinker
    from tinker import types

    from bench.bench_soak import build_model, rss_mb
    from tests.server import hostile_client as hostile
    from tests.server.server_helpers import SubprocessServer, forward_logprobs, sft_datum

    os.environ["TINKER_TELEMETRY"] = "0"
    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    model_dir = build_model(work / "model")
    process = SubprocessServer(model_dir, work / "data", work / "server.log",
                               api_keys=f"{VICTIM},{ATTACKER}")
    url, server = process.url, process.process
    try:
        process.wait_healthy()
        rng = np.random.default_rng(0)
        victim_tokens = rng.integers(10, 262_144, size=24).tolist()
        attacker_tokens = rng.integers(10, 262_144, size=20).tolist()
        service = tinker.ServiceClient(base_url=url, api_key=VICTIM)
        victim = service.create_lora_training_client(base_model=str(model_dir), rank=8,
                                                      seed=1).result()
        data = [sft_datum(victim_tokens)]
        victim.forward_backward(data, "cross_entropy").result()
        victim.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        before = forward_logprobs(victim, data)
        quiet_latency = _median_latency(lambda: forward_logprobs(victim, data))
        rss_before = rss_mb(server.pid)

        client = hostile.HostileClient(url, ATTACKER)
        session_id = client.session()
        run_id = client.run(session_id, str(model_dir), 0)
        kinds: dict[str, list[hostile.Outcome]] = collections.defaultdict(list)
        seq = [0]

        def fb(kind: str, datums, loss_fn="cross_entropy", config=None, seq_id=None,
               mutate=None) -> None:
            if seq_id is None:
                seq[0] += 1
                seq_id = seq[0]
            body = hostile.forward_backward_body(run_id, seq_id, datums, loss_fn, config)
            if mutate is not None:
                message = hostile.pb.ForwardBackwardRequest()
                message.ParseFromString(body)
                mutate(message)
                body = message.SerializeToString()
            kinds[kind].append(client.send("POST", "/forward_backward", raw=body,
                                           headers=hostile.PROTOBUF))

        started = time.perf_counter()
        for method, path, body in hostile.WRONG_TYPES:
            if path.endswith("/finish"):
                path = hostile.fill(path, session_id, str(model_dir), run_id)
                session_id = client.session()
            kinds["wrong JSON types, superscript digits, negative pages"].append(
                client.send(method, path, hostile.fill(body, session_id, str(model_dir),
                                                       run_id)))
        unreadable = kinds["unreadable bodies (deep JSON, corrupt zstd, non-ASCII key)"]
        unreadable.append(client.send("POST", "/create_session", raw=b"[" * 200_000,
                                      headers={"content-type": "application/json"}))
        unreadable.append(client.send("POST", "/create_session", raw=b"\x28\xb5\x2f\xfd ?",
                                      headers={"content-encoding": "zstd"}))
        unreadable.append(client.send("POST", "/create_session", {"tags": []},
                                      key="tml-\u00e9t\u00e9".encode()))
        names = kinds["names, ids and TTLs (NUL, 5000 chars, 10**30 s)"]
        for body in ({"model_id": run_id, "path": "a\x00b"},
                     {"model_id": run_id, "path": "n" * 5000},
                     {"model_id": run_id, "path": "t", "ttl_seconds": 10**30}):
            names.append(client.send("POST", "/save_weights", body))
        names.append(client.send("POST", "/save_weights_external", {"model_id": run_id,
                                                                     "path": "x\x00"}))
        names.append(client.send("DELETE", f"/training_runs/{'r' * 3000}"))

        def sample(params: dict, **extra) -> hostile.Outcome:
            return client.send("POST", "/asample", {
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": attacker_tokens[:8]}]},
                "num_samples": 1, "base_model": str(model_dir), "sampling_params": params,
                **extra})

        big = kinds["memory asks (topk 65536, 1024 samples, 32 MB metadata)"]
        big.append(sample({"max_tokens": 2}, topk_prompt_logprobs=65536, prompt_logprobs=True))
        big.append(sample({"max_tokens": 2, "seed": 1}, num_samples=1024))
        big.append(client.send("POST", "/create_session",
                               {"tags": [], "user_metadata": {"k": "x" * (32 << 20)}}))
        limits = kinds["sampling limits (stop [1.5], top_k 10**30, T 1e-40)"]
        limits.append(sample({"max_tokens": 2, "stop": [1.5]}))
        limits.append(sample({"max_tokens": 2, "stop": [[1]]}))
        limits.append(sample({"max_tokens": 2, "top_k": 10**30, "seed": 2}))
        limits.append(sample({"max_tokens": 2, "temperature": 1e-40}))

        n = len(attacker_tokens) - 1
        plain = types.Datum(model_input=types.ModelInput.from_ints(attacker_tokens[:-1]),
                            loss_fn_inputs={"target_tokens": attacker_tokens[1:],
                                            "weights": [1.0] * n})

        def huge_sparse(message) -> None:
            tensor = message.data[0].loss_fn_inputs["weights"]
            tensor.ClearField("dense")
            del tensor.shape[:]
            tensor.shape.extend([n, 1 << 26])
            tensor.sparse_csr.crow_indices = np.zeros(n + 1, dtype="<i8").tobytes()

        def three_d(message) -> None:
            tensor = message.data[0].loss_fn_inputs["target_tokens"]
            del tensor.shape[:]
            tensor.shape.extend([n, 1, 1])

        loss = "loss inputs (sparse [N, 2^26], 3-D, far-future seq_id)"
        fb(loss, [plain], mutate=huge_sparse)
        fb(loss, [plain], mutate=three_d)
        fb(loss, [plain], seq_id=seq[0] + 100_000)
        fb(loss, [plain])  # the order goes on
        stale = types.Datum(model_input=types.ModelInput.from_ints(attacker_tokens[:-1]),
                            loss_fn_inputs={"target_tokens": attacker_tokens[1:],
                                            "logprobs": [-200.0] * n, "advantages": [1.0] * n})
        nonfinite = "non-finite steps (stale IS logprobs, lr 1e30, wd 1e30)"
        fb(nonfinite, [stale], "importance_sampling")
        for adam in ({"learning_rate": 1e-3}, {"learning_rate": 1e30},
                     {"learning_rate": 1e-3, "weight_decay": 1e30}):
            kinds[nonfinite].append(client.send("POST", "/optim_step",
                                                {"model_id": run_id, "adam_params": adam}))

        fuzz = random.Random(args.seed)
        bodies = hostile.valid_bodies(session_id, str(model_dir), run_id, attacker_tokens)
        for _ in range(args.fuzz):
            method, path, body = bodies[fuzz.randrange(len(bodies))]
            kinds["fuzzed JSON bodies (every endpoint)"].append(
                client.send(method, path, hostile.mutate_body(body, fuzz)))
        for _ in range(args.fuzz // 4):
            fb("fuzzed forward_backward protobuf", [plain],
               mutate=lambda m: hostile.mutate_proto(m, fuzz))
            fb("fuzzed forward_backward protobuf", [plain])
        campaign_seconds = time.perf_counter() - started

        after = forward_logprobs(victim, data)
        loaded_latency = _median_latency(lambda: forward_logprobs(victim, data))
        unchanged = all(np.array_equal(a, b) for a, b in zip(after, before, strict=True))
        rss_after = rss_mb(server.pid)
        client.close()

        print(f"hostile campaign: {sum(len(v) for v in kinds.values())} requests in "
              f"{campaign_seconds:.0f} s against python -m server (tiny Gemma 3, vocab 262144)")
        print(f"{'kind':<62} {'count':>6}  {'status classes':<38} {'faults':>6}")
        faults_total = 0
        for kind, outcomes in kinds.items():
            classes = collections.Counter(
                (o.future if o.future else f"{o.status // 100}xx") for o in outcomes)
            faults = sum(o.server_fault for o in outcomes)
            faults_total += faults
            shown = ", ".join(f"{k} {v}" for k, v in sorted(classes.items()))
            print(f"{kind:<62} {len(outcomes):>6}  {shown:<38} {faults:>6}")
        print(f"server faults in all: {faults_total} (target 0)")
        print(f"victim: logprobs bit-identical after the campaign: {unchanged}; forward latency "
              f"{loaded_latency * 1e3:.0f} ms vs {quiet_latency * 1e3:.0f} ms before "
              f"({loaded_latency / quiet_latency:.2f}x)")
        print(f"server RSS: {rss_before:.0f} MB before, {rss_after:.0f} MB after "
              f"({rss_after / rss_before:.2f}x)")
    finally:
        process.stop()


def _median_latency(call, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


if __name__ == "__main__":
    main()
