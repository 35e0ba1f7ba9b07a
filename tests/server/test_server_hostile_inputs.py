"""Every bad input a second tenant can send is a client error, keeps its run's order, and
leaves another key's run as it was.

One case per cause found by probing the server from outside (wrong JSON types, superscript
digits, deep nesting, corrupt zstd, non-ASCII keys, NUL bytes and long names, huge TTLs and
top-k, bad stop lists, tiny temperatures, huge top-k prompt logprobs, 3-D and mixed targets,
inconsistent loss inputs, one-sided clip thresholds, far-future seq_ids, sparse tensors that
would densify to gigabytes), then a bounded, seeded fuzz test over every endpoint. After each,
a victim run under another key must answer at once with bit-identical logprobs.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import tinker
import zstandard
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from tests.server.hostile_client import (
    PROTOBUF,
    WRONG_TYPES,
    HostileClient,
    Outcome,
    fill,
    forward_backward_body,
    mutate_body,
    mutate_proto,
    valid_bodies,
)
from tests.server.server_helpers import forward_logprobs, new_run, sft_datum, sft_step, start_server

VICTIM, ATTACKER = "tml-victim-key", "tml-attacker-key"


@dataclass
class Context:
    client: HostileClient
    base_model: str
    session_id: str
    run_id: str
    tokens: list[int]
    seq: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, *args, **kwargs) -> Outcome:
        outcome = self.client.send(*args, **kwargs)
        self.outcomes.append(outcome)
        return outcome

    def fb(self, data: list[types.Datum], loss_fn: str = "cross_entropy",
           config: dict[str, float] | None = None, seq_id: int | None = None,
           mutate: Callable[[pb.ForwardBackwardRequest], None] | None = None) -> Outcome:
        body = forward_backward_body(self.run_id, seq_id or self.next_seq(), data, loss_fn,
                                     config)
        if mutate is not None:
            message = pb.ForwardBackwardRequest()
            message.ParseFromString(body)
            mutate(message)
            body = message.SerializeToString()
        return self.send("POST", "/forward_backward", raw=body, headers=PROTOBUF)

    def good_fb(self) -> Outcome:
        """A valid request right after: it must run, so the refusal kept its place."""
        outcome = self.fb([sft_datum(self.tokens)])
        assert outcome.future == "ok", outcome
        return outcome


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory) -> Iterator:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("hostile"),
                          api_keys=f"{VICTIM},{ATTACKER}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def victim(keyed, base_model, sequences):
    service = tinker.ServiceClient(base_url=keyed.url, api_key=VICTIM)
    client = new_run(service, base_model, seed=50)
    data = [sft_datum(sequences[1])]
    sft_step(client, data)
    yield client, data, forward_logprobs(client, data)
    service.close("success").result()


@pytest.fixture(scope="module")
def ctx(keyed, base_model, sequences) -> Iterator[Context]:
    client = HostileClient(keyed.url, ATTACKER)
    session_id = client.session()
    yield Context(client, base_model, session_id, client.run(session_id, base_model, 0),
                  sequences[0])
    client.close()


@pytest.fixture(autouse=True)
def victim_untouched(victim, ctx) -> Iterator[None]:
    ctx.outcomes.clear()
    yield
    faults = [o for o in ctx.outcomes if o.server_fault]
    assert not faults, faults
    client, data, expected = victim
    for got, want in zip(forward_logprobs(client, data), expected, strict=True):
        assert np.array_equal(got, want)


def _client_errors(outcomes: list[Outcome]) -> None:
    for outcome in outcomes:
        assert 400 <= outcome.status < 500 or outcome.future == "user", outcome


# ------------------------------------------------------------ JSON bodies
@pytest.mark.parametrize(("method", "path", "body"), WRONG_TYPES,
                         ids=[f"{m} {p} {i}" for i, (m, p, _) in enumerate(WRONG_TYPES)])
def test_wrong_json_types_are_client_errors(ctx, method, path, body):
    if path.endswith("/finish"):
        path = fill(path, ctx.session_id, ctx.base_model, ctx.run_id)
        ctx.session_id = ctx.client.session()  # finishing (even refused) must not end ours
    outcome = ctx.send(method, path, fill(body, ctx.session_id, ctx.base_model, ctx.run_id))
    _client_errors([outcome])


def test_bodies_that_cannot_be_read_are_client_errors(ctx):
    outcomes = [
        ctx.send("POST", "/create_session", raw=b"[" * 200_000,
                 headers={"content-type": "application/json"}),
        ctx.send("POST", "/create_session", raw=b"\x28\xb5\x2f\xfd broken",
                 headers={"content-encoding": "zstd", "content-type": "application/json"}),
        # A frame that stops early decodes to nothing: an empty body must not pass as `{}`.
        ctx.send("POST", "/create_session", raw=b"\x28\xb5\x2f\xfd ?",
                 headers={"content-encoding": "zstd", "content-type": "application/json"}),
        ctx.send("POST", "/create_session", raw=zstandard.compress(b'{"tags": []}')[:-3],
                 headers={"content-encoding": "zstd", "content-type": "application/json"}),
        ctx.send("POST", "/forward_backward", raw=zstandard.compress(b"not protobuf"),
                 headers={"content-encoding": "zstd", **PROTOBUF}),
        ctx.send("POST", "/create_session", {"tags": []}, key="tml-\u00e9t\u00e9".encode()),
    ]
    _client_errors(outcomes)


def test_names_ids_and_ttls_that_would_break_the_file_system_are_client_errors(ctx):
    run = ctx.run_id
    outcomes = [
        ctx.send("POST", "/save_weights", {"model_id": run, "path": "a\x00b"}),
        ctx.send("POST", "/save_weights", {"model_id": run, "path": "n" * 5000}),
        ctx.send("POST", "/save_weights", {"model_id": run, "path": "\u00e9" * 150}),
        ctx.send("POST", "/save_weights", {"model_id": run, "path": "t", "ttl_seconds": 10**30}),
        ctx.send("POST", "/save_weights_external", {"model_id": run, "path": "x\x00"}),
        ctx.send("POST", "/save_weights_external",
                 {"model_id": run, "path": "ok", "age_encryption_recipients": "age1"}),
        ctx.send("POST", "/weights_info", {"tinker_path": f"tinker://{'r' * 3000}/weights/x"}),
        ctx.send("DELETE", f"/training_runs/{'r' * 3000}"),
        ctx.send("GET", "/training_runs/x%00y/checkpoints"),
        ctx.send("PUT", f"/training_runs/{run}/checkpoints/weights/none/ttl",
                 {"ttl_seconds": 10**30}),
    ]
    _client_errors(outcomes)
    ctx.good_fb()  # the run's order moved past the refused saves


# --------------------------------------------------------------- sampling
def _sample(ctx: Context, params: dict, **extra) -> Outcome:
    body = {"prompt": {"chunks": [{"type": "encoded_text", "tokens": ctx.tokens[:5]}]},
            "num_samples": 1, "base_model": ctx.base_model, "sampling_params": params,
            **extra}
    return ctx.send("POST", "/asample", body)


def test_sampling_parameters_that_cannot_be_used_are_refused(ctx):
    _client_errors([
        _sample(ctx, {"max_tokens": 2, "stop": [1.5]}),
        _sample(ctx, {"max_tokens": 2, "stop": [[1]]}),
        _sample(ctx, {"max_tokens": 2, "stop": ["x"] * 100}),
        _sample(ctx, {"max_tokens": 2}, topk_prompt_logprobs=65536, prompt_logprobs=True),
        _sample(ctx, {"max_tokens": 2}, num_samples=100_000),
        _sample(ctx, {"max_tokens": 10**9}),
        # The prompt has 5 tokens: at most its last 4 have a logprob to return.
        _sample(ctx, {"max_tokens": 1}, prompt_logprobs=True, prompt_logprobs_last_n=5),
        _sample(ctx, {"max_tokens": 1}, prompt_logprobs=True, prompt_logprobs_last_n=-1),
        _sample(ctx, {"max_tokens": 1}, prompt_logprobs=True, prompt_logprobs_last_n="two"),
        _sample(ctx, {"max_tokens": 1}, prompt_logprobs_last_n=2),
    ])


def test_sampling_parameters_at_their_limits_are_served(ctx):
    """Values that mean something else are read as that: a huge top-k is no top-k, a
    temperature under the floor is greedy, and more samples than one batch holds are decoded in
    several batches."""
    outcomes = [
        _sample(ctx, {"max_tokens": 3, "top_k": 10**30, "seed": 10**30}),
        _sample(ctx, {"max_tokens": 3, "temperature": 1e-40, "seed": 1}),
        _sample(ctx, {"max_tokens": 2, "seed": 3}, num_samples=300),
        _sample(ctx, {"max_tokens": 1}, topk_prompt_logprobs=4, prompt_logprobs=True),
        _sample(ctx, {"max_tokens": 1}, prompt_logprobs=True, prompt_logprobs_last_n=4),
    ]
    assert [o.future for o in outcomes] == ["ok"] * 5, outcomes


def test_a_temperature_below_the_floor_is_greedy_with_finite_logprobs(keyed, base_model, sequences):
    service = tinker.ServiceClient(base_url=keyed.url, api_key=ATTACKER)
    sampler = service.create_sampling_client(base_model=base_model)
    prompt = types.ModelInput.from_ints(sequences[0][:5])
    tiny = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, temperature=1e-40,
                                                          seed=1)).result()
    greedy = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=0.0)
                            ).result()
    for seq in tiny.sequences:
        assert seq.tokens == greedy.sequences[0].tokens
        assert all(math.isfinite(lp) for lp in seq.logprobs)


def test_many_samples_keep_the_random_stream_of_their_index(keyed, base_model, sequences):
    """A request wider than one decode batch samples, row for row, what narrower requests with
    the same seed sample for the same indices."""
    service = tinker.ServiceClient(base_url=keyed.url, api_key=ATTACKER)
    sampler = service.create_sampling_client(base_model=base_model)
    prompt = types.ModelInput.from_ints(sequences[0][:5])
    params = types.SamplingParams(max_tokens=3, temperature=1.0, seed=77)
    wide = sampler.sample(prompt, 200, params).result().sequences
    narrow = sampler.sample(prompt, 2, params).result().sequences
    assert len(wide) == 200
    assert [s.tokens for s in wide[:2]] == [s.tokens for s in narrow]


# --------------------------------------------------------- forward_backward
def _datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


def _rl(tokens: list[int], **extra) -> types.Datum:
    n = len(tokens) - 1
    return _datum(tokens, logprobs=[-1.0] * n, advantages=[0.5] * n, **extra)


def test_loss_inputs_that_do_not_fit_are_refused_in_order(ctx):
    tokens = ctx.tokens
    n = len(tokens) - 1

    def three_d(message: pb.ForwardBackwardRequest) -> None:
        tensor = message.data[0].loss_fn_inputs["target_tokens"]
        del tensor.shape[:]
        tensor.shape.extend([n, 1, 1])

    def huge_sparse(message: pb.ForwardBackwardRequest) -> None:
        tensor = message.data[0].loss_fn_inputs["weights"]
        tensor.ClearField("dense")
        del tensor.shape[:]
        tensor.shape.extend([n, 1 << 26])
        tensor.sparse_csr.crow_indices = np.zeros(n + 1, dtype="<i8").tobytes()

    def image_chunk(message: pb.ForwardBackwardRequest) -> None:
        message.data[0].model_input.add().image.data = b"\x89PNG"

    def extra_input(message: pb.ForwardBackwardRequest) -> None:
        weights = message.data[1].loss_fn_inputs["weights"]
        message.data[1].loss_fn_inputs["extra"].CopyFrom(weights)

    two_d = [[t, t] for t in tokens[1:]]
    cases = [
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n)], mutate=three_d),
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n)], mutate=huge_sparse),
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n)], mutate=image_chunk),
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n),
                        types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                    loss_fn_inputs={"target_tokens": np.array(two_d),
                                                    "weights": np.ones((n, 2), np.float32)})]),
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n), _datum(tokens, weights=[1.0] * n)],
                       mutate=extra_input),
        lambda: ctx.fb([_rl(tokens)], "ppo", {"clip_hi": 1.3}),
        lambda: ctx.fb([_datum(tokens, weights=[1.0] * n)], seq_id=ctx.seq + 100_000),
    ]
    for case in cases:
        _client_errors([case()])
        ctx.good_fb()


def test_a_per_token_clip_threshold_on_one_side_trains(ctx):
    tokens = ctx.tokens
    n = len(tokens) - 1
    outcome = ctx.fb([_rl(tokens, clip_low_threshold=[0.5] * n)], "ppo",
                     {"clip_high_threshold": 1.5})
    assert outcome.future == "ok", outcome


ID_ROUTES = ("/training_runs/{id}", "/training_runs/{id}/checkpoints", "/sessions/{id}",
             "/samplers/{id}",
             "/training_runs/{id}/checkpoints/external_weights/x/external_weights_urls")


@pytest.mark.parametrize("length", [254, 255, 256, 4096])
def test_ids_at_and_past_the_file_name_limit_are_client_errors(ctx, length):
    outcomes = [ctx.send("GET", route.replace("{id}", "r" * length)) for route in ID_ROUTES]
    outcomes.append(ctx.send("POST", "/get_info", {"model_id": "r" * length}))
    _client_errors(outcomes)


def test_null_in_every_field_of_every_body_is_a_client_error_or_served(ctx):
    """A null where the SDK's model admits one means "not given"; elsewhere it is refused."""
    for method, path, body in valid_bodies(ctx.session_id, ctx.base_model, ctx.run_id,
                                           ctx.tokens):
        ctx.send(method, path, dict.fromkeys(body))
        for key in body:
            ctx.send(method, path, {**body, key: None})
    assert all(o.status < 500 and o.future != "server" for o in ctx.outcomes), ctx.outcomes


@pytest.mark.parametrize("value", [2**63 - 1, 2**63, -(2**63) - 1, 10**30])
def test_every_integer_field_at_and_past_int64_is_a_client_error_or_served(ctx, value):
    for method, path, body in valid_bodies(ctx.session_id, ctx.base_model, ctx.run_id,
                                           ctx.tokens):
        for key, field_value in body.items():
            if isinstance(field_value, int) and not isinstance(field_value, bool):
                ctx.send(method, path, {**body, key: value})
    stop = {"max_tokens": 2, "stop": [value]}
    ctx.outcomes.append(_sample(ctx, stop))
    _client_errors(ctx.outcomes[-1:])
    assert all(o.status < 500 and o.future != "server" for o in ctx.outcomes), ctx.outcomes


def test_references_to_deleted_and_expired_objects_are_client_errors(ctx):
    run = ctx.run_id
    saved = ctx.send("POST", "/save_weights", {"model_id": run, "path": "gone",
                                               "seq_id": ctx.next_seq()})
    assert saved.future == "ok", saved
    path = f"tinker://{run}/weights/gone"
    assert ctx.send("DELETE", f"/training_runs/{run}/checkpoints/weights/gone").status < 300
    outcomes = [
        ctx.send("POST", "/weights_info", {"tinker_path": path}),
        ctx.send("POST", "/copy_weights", {"source_path": path}),
        ctx.send("POST", "/load_weights", {"model_id": run, "path": path,
                                           "seq_id": ctx.next_seq()}),
        ctx.send("POST", "/create_sampling_session", {"session_id": ctx.session_id,
                                                      "sampling_session_seq_id": 7,
                                                      "model_path": path}),
        ctx.send("GET", f"/training_runs/{run}/checkpoints/weights/gone/external_weights_urls"),
        ctx.send("PUT", f"/training_runs/{run}/checkpoints/weights/gone/ttl",
                 {"ttl_seconds": 60}),
    ]
    _client_errors(outcomes)
    ctx.good_fb()


FUZZ_REQUESTS = 400


def test_bounded_fuzz_of_every_endpoint_finds_no_server_fault(ctx):
    rng = random.Random(23)
    bodies = valid_bodies(ctx.session_id, ctx.base_model, ctx.run_id, ctx.tokens)
    # The run's own order advances through the fuzzed optimizer steps and saves, so keep it in
    # step: a body's seq_id, when fuzz sets none, is the server's to assign.
    seen: dict[str, int] = {}
    for _ in range(FUZZ_REQUESTS):
        method, path, body = bodies[rng.randrange(len(bodies))]
        mutated = mutate_body(body, rng)
        if rng.random() < 0.1:
            raw = json.dumps(mutated).encode()
            cut = raw[: rng.randrange(1, len(raw))]
            outcome = ctx.send(method, path, raw=cut, headers={"content-type": "application/json"})
        else:
            outcome = ctx.send(method, path, mutated)
        seen[outcome.future or str(outcome.status // 100) + "xx"] = seen.get(
            outcome.future or str(outcome.status // 100) + "xx", 0) + 1
    n = len(ctx.tokens) - 1
    for _ in range(FUZZ_REQUESTS // 4):
        ctx.fb([_datum(ctx.tokens, weights=[1.0] * n)], mutate=lambda m: mutate_proto(m, rng))
        ctx.good_fb()  # whatever the mutation did, the run's order goes on
    assert len(ctx.outcomes) == FUZZ_REQUESTS + FUZZ_REQUESTS // 2
    assert seen.get("4xx", 0) + seen.get("user", 0) > FUZZ_REQUESTS // 4, seen
