"""Which trainer owns what: sessions are placed on trainers, and ops follow their session.

A Tinker session (one `ServiceClient`) owns its runs and sampling sessions, and every id the
server hands out names it (`sess-…`, `sess-…:train:N`, `sess-…:sample:N`). So the unit of
placement is the session: all of a session's state lives on one trainer, which journals it, and
every op that names the session, one of its runs or one of its samplers goes to that trainer's
queue. Ops that name no session (listings, capabilities) go to the least-loaded live trainer,
since they read the shared data directory.

Placement is changed only by Lua scripts, so it is atomic with respect to the gateways' enqueue:
an op is pushed to the queue of the trainer that owns its session at that instant, and a
take-over moves the dead trainer's queue and re-places its sessions in one step, so no op is
ever pushed to a queue nobody reads.
"""

from __future__ import annotations

from tinker.proto import tinker_public_pb2 as pb

from server.distributed.journal import parse_json

NEW_SESSION_TOKENS = 4096
"""The load a newly placed session adds to its trainer until the trainer next publishes what it
measured: one key's share of a fused training batch (`Scheduler.key_share_tokens`)."""

SESSION_PREFIX = "sess-"
def session_of_id(value: object) -> str | None:
    """The session a server-issued id belongs to (`sess-x`, `sess-x:train:3`, a tinker path)."""
    if not isinstance(value, str):
        return None
    text = value.removeprefix("tinker://")
    head = text.split("/", 1)[0].split(":", 1)[0]
    return head if head.startswith(SESSION_PREFIX) and len(head) <= 64 else None


def new_session_id(op_id: str) -> str:
    """The id `create_session` gives: derived from the op id, so a replay gives the same one."""
    return f"{SESSION_PREFIX}{op_id.removeprefix('op-')[:12]}"


def shard_of(op_id: str, method: str, path: str, body: bytes) -> str | None:
    """The session an op belongs to, or None when it names none."""
    if method == "POST" and path == "/create_session":
        return new_session_id(op_id)
    parts = path.split("/")
    if len(parts) > 2 and parts[1] in ("sessions", "training_runs", "samplers"):
        return session_of_id(parts[2])
    if method != "POST":
        return None
    if path == "/forward_backward":
        message = pb.ForwardBackwardRequest()
        try:
            message.ParseFromString(body)
        except Exception:  # noqa: BLE001 - malformed: any trainer refuses it the same way
            return None
        return session_of_id(message.model_id)
    data = parse_json(body)
    for field in ("session_id", "model_id", "sampling_session_id", "model_path", "path",
                  "source_path"):
        session = session_of_id(data.get(field))
        if session is not None:
            return session
    return None


ENQUEUE_ROUTED = """
-- KEYS: claim, op hash, reply. ARGV: ttl, op id, key prefix, session or '', the nominal load
-- of a new session if the op creates one ('0' if not), the number n of live trainers, their
-- ids (n), then the op's fields.
-- An op goes to its session's owner; a new session is placed, at once, on the live trainer with
-- the least load (the tokens it trained, sampled and has queued over the last minute, as it last
-- published them), then the fewest sessions; placing a session adds a new session's nominal
-- load at once (ARGV[5]), so a burst of new sessions spreads before the next heartbeat says
-- more; an op that names no session goes to that trainer too; with no trainer alive, to the
-- shared queue.
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local prefix, session, n = ARGV[3], ARGV[4], tonumber(ARGV[6])
redis.call('DEL', KEYS[3], KEYS[3] .. ':n')
redis.call('HSET', KEYS[2], unpack(ARGV, 7 + n))
local owner = false
if session ~= '' then owner = redis.call('GET', prefix .. ':placement:' .. session) end
if not owner then
  local least, fewest = nil, nil
  for i = 1, n do
    local id = ARGV[6 + i]
    local load = tonumber(redis.call('HGET', prefix .. ':trainer:load', id) or '0') or 0
    local sessions = redis.call('SCARD', prefix .. ':trainer:sessions:' .. id)
    if least == nil or load < least or (load == least and sessions < fewest) then
      least, fewest, owner = load, sessions, id
    end
  end
  if owner and ARGV[5] ~= '0' and session ~= '' then
    redis.call('SET', prefix .. ':placement:' .. session, owner)
    redis.call('SADD', prefix .. ':trainer:sessions:' .. owner, session)
    redis.call('HINCRBY', prefix .. ':trainer:load', owner, tonumber(ARGV[5]))
  end
end
local queue = prefix .. ':ops'
if owner then queue = prefix .. ':ops:queue:' .. owner end
redis.call('HSET', KEYS[2], 'session', session, 'queue', queue)
redis.call('LPUSH', queue, ARGV[2])
return 1
"""

WITHDRAW_ROUTED = """
-- KEYS: op hash, claim. ARGV: op id. Takes back an op still waiting in the queue it was put in.
local queue = redis.call('HGET', KEYS[1], 'queue')
if queue and redis.call('LREM', queue, 1, ARGV[1]) == 1 then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
"""

TAKE_OVER = """
-- KEYS: the dead trainer's alive key, its sessions, its queue, its taken list, the taker's
-- sessions, the taker's queue, the trainer members. ARGV: prefix, dead id, taker id.
-- Refuses while the dead trainer still heartbeats; returns the sessions taken over.
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local sessions = redis.call('SMEMBERS', KEYS[2])
for _, session in ipairs(sessions) do
  redis.call('SET', ARGV[1] .. ':placement:' .. session, ARGV[3])
  redis.call('SADD', KEYS[5], session)
end
-- Taken-but-unacknowledged ops first, then the pending ones, both in their original order.
while redis.call('LMOVE', KEYS[4], KEYS[6], 'RIGHT', 'LEFT') do end
while redis.call('LMOVE', KEYS[3], KEYS[6], 'RIGHT', 'LEFT') do end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[7], ARGV[2])
return sessions
"""
