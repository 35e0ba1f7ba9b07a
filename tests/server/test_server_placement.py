"""Placement of ops on trainer replicas: which session an op names (as the gateway reads it)
and the Lua scripts that route, withdraw and take over, against a real `redis-server`.

The processes themselves (two trainers, one killed mid-step) run in the deployment rehearsal
(`tests/deploy/test_deploy_rehearsal.py`).
"""

from __future__ import annotations

import json

import pytest
import redis
from tinker.proto import tinker_public_pb2 as pb

from server.distributed.placement import (
    ENQUEUE_ROUTED,
    NEW_SESSION_TOKENS,
    TAKE_OVER,
    WITHDRAW_ROUTED,
    new_session_id,
    session_of_id,
    shard_of,
)
from server.distributed.store import Keys
from tests.server.server_helpers import NEEDS_REDIS

pytestmark = NEEDS_REDIS


def _json(**fields) -> bytes:
    return json.dumps(fields).encode()


def _forward_backward(model_id: str) -> bytes:
    return pb.ForwardBackwardRequest(model_id=model_id, seq_id=3).SerializeToString()


@pytest.mark.parametrize(("method", "path", "body", "session"), [
    ("POST", "/create_session", b"{}", new_session_id("op-0123456789abcdef")),
    ("POST", "/create_model", _json(session_id="sess-a"), "sess-a"),
    ("POST", "/forward_backward", _forward_backward("sess-b:train:0"), "sess-b"),
    ("POST", "/forward_backward", b"\xff\xfe not protobuf", None),
    ("POST", "/optim_step", _json(model_id="sess-c:train:2", seq_id=4), "sess-c"),
    ("POST", "/asample", _json(sampling_session_id="sess-d:sample:1"), "sess-d"),
    ("POST", "/asample", _json(model_path="tinker://sess-e:train:0/sampler_weights/s"),
     "sess-e"),
    ("POST", "/weights_info", _json(path="tinker://sess-f:train:1/weights/w"), "sess-f"),
    ("POST", "/session_heartbeat", _json(session_id="sess-g"), "sess-g"),
    ("GET", "/training_runs/sess-h:train:0/checkpoints", b"", "sess-h"),
    ("GET", "/samplers/sess-i:sample:0", b"", "sess-i"),
    ("POST", "/sessions/sess-j/finish", b"{}", "sess-j"),
    ("GET", "/training_runs", b"", None),
    ("GET", "/get_server_capabilities", b"", None),
    ("POST", "/create_model", _json(session_id=None), None),
    ("POST", "/create_model", _json(session_id="sess-" + "x" * 300), None),
    ("POST", "/create_model", b"[1, 2]", None),
])
def test_the_gateway_reads_the_session_every_op_names(method, path, body, session) -> None:
    assert shard_of("op-0123456789abcdef", method, path, body) == session


def test_ids_the_server_issues_name_their_session() -> None:
    assert session_of_id("sess-a1:train:7") == "sess-a1"
    assert session_of_id("tinker://sess-a1:train:7/weights/step-1") == "sess-a1"
    assert session_of_id("copy-1234") is None
    assert session_of_id(12) is None


@pytest.fixture(scope="module")
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _enqueue(client: redis.Redis, keys: Keys, op_id: str, session: str, live: list[str],
             creates: bool = False) -> int:
    script = client.register_script(ENQUEUE_ROUTED)
    return script(keys=[keys.claim(op_id), keys.op(op_id), keys.reply(op_id)],
                  args=[60, op_id, keys.prefix, session,
                        str(NEW_SESSION_TOKENS) if creates else "0", len(live),
                        *live, "method", "POST"])


def test_an_op_goes_to_its_sessions_owner_and_new_sessions_spread(client) -> None:
    keys = Keys("route")
    live = ["trainer-1", "trainer-2"]
    client.set(keys.placement("sess-a"), "trainer-1")
    client.sadd(keys.owned("trainer-1"), "sess-a")
    assert _enqueue(client, keys, "op-1", "sess-a", live) == 1
    # A burst of new sessions: each is placed at once, so the next sees the load it added.
    assert _enqueue(client, keys, "op-2", "sess-b", live, creates=True) == 1
    assert _enqueue(client, keys, "op-3", "sess-c", live, creates=True) == 1
    assert client.get(keys.placement("sess-b")) == b"trainer-2"
    assert client.get(keys.placement("sess-c")) in (b"trainer-1", b"trainer-2")
    assert {client.scard(keys.owned(t)) for t in live} == {1, 2}
    # An op for an unknown session creates no placement (ids a client invents cost nothing).
    assert _enqueue(client, keys, "op-4", "sess-invented", live) == 1
    assert not client.exists(keys.placement("sess-invented"))
    assert _enqueue(client, keys, "op-5", "", []) == 1  # no trainer alive: the shared queue
    assert _enqueue(client, keys, "op-1", "sess-a", live) == 0  # a retry: once only
    assert client.lrange(keys.queue("trainer-1"), 0, -1)[-1] == b"op-1"
    assert b"op-2" in client.lrange(keys.queue("trainer-2"), 0, -1)
    assert client.lrange(keys.shared_ops, 0, -1) == [b"op-5"]
    assert client.hget(keys.op("op-1"), "session") == b"sess-a"
    withdraw = client.register_script(WITHDRAW_ROUTED)
    assert withdraw(keys=[keys.op("op-2"), keys.claim("op-2")], args=["op-2"]) == 1
    assert b"op-2" not in client.lrange(keys.queue("trainer-2"), 0, -1)
    assert not client.exists(keys.op("op-2"))


def test_new_sessions_go_where_the_fewest_tokens_are_trained(client) -> None:
    """Placement counts tokens, not sessions: a trainer busy with one large session gets no
    new one while another trains less with more; a burst spreads by the nominal load each
    placed session adds until the trainers publish what they measured."""
    keys = Keys("load")
    live = ["busy", "light"]
    client.sadd(keys.owned("busy"), "sess-big")
    client.sadd(keys.owned("light"), "sess-1", "sess-2", "sess-3")
    client.hset(keys.trainer_load, mapping={"busy": 50_000, "light": 2_000})
    assert _enqueue(client, keys, "op-n1", "sess-new-1", live, creates=True) == 1
    assert client.get(keys.placement("sess-new-1")) == b"light"
    placed = []
    for i in range(2, 14):
        _enqueue(client, keys, f"op-n{i}", f"sess-new-{i}", live, creates=True)
        placed.append(client.get(keys.placement(f"sess-new-{i}")).decode())
    # light carries 2,000 + 4,096 per new session: it takes them while it is below busy's
    # 50,000 (its 12th puts it at 51,152), then busy takes the next.
    assert placed == ["light"] * 11 + ["busy"]


def test_a_take_over_moves_sessions_and_ops_in_order_and_only_from_the_dead(client) -> None:
    keys = Keys("take")
    members = keys.members("trainer")
    client.sadd(members, "dead", "alive", "taker")
    client.set(keys.alive("alive", "x"), "1")
    for trainer, sessions in (("dead", ["sess-a", "sess-b"]), ("alive", ["sess-c"])):
        for session in sessions:
            client.set(keys.placement(session), trainer)
            client.sadd(keys.owned(trainer), session)
    # Oldest at the right, as gateways push (LPUSH) and trainers take (BLMOVE RIGHT LEFT).
    client.lpush(keys.taken("dead"), "op-1", "op-2")
    client.lpush(keys.queue("dead"), "op-3", "op-4")
    client.lpush(keys.queue("taker"), "op-mine")
    take = client.register_script(TAKE_OVER)

    def take_over(dead: str):
        return take(keys=[keys.alive("trainer", dead), keys.owned(dead), keys.queue(dead),
                          keys.taken(dead), keys.owned("taker"), keys.queue("taker"), members],
                    args=[keys.prefix, dead, "taker"])

    client.set(keys.alive("trainer", "alive"), "1")
    assert take_over("alive") is None  # its heartbeat stands: nothing moves
    assert sorted(take_over("dead")) == [b"sess-a", b"sess-b"]
    assert client.get(keys.placement("sess-a")) == b"taker"
    assert client.get(keys.placement("sess-c")) == b"alive"
    assert client.smembers(keys.owned("taker")) == {b"sess-a", b"sess-b"}
    # Taken in the order the queue is read: its own op, then the dead one's taken, then pending.
    order = [client.rpop(keys.queue("taker")) for _ in range(5)]
    assert order == [b"op-mine", b"op-1", b"op-2", b"op-3", b"op-4"]
    assert client.smembers(members) == {b"alive", b"taker"}
    assert take_over("dead") == []  # a second taker finds nothing left
