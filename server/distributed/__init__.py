"""The distributed server: stateless gateways, trainer replicas, sampler workers, over Redis.

Roles (`python -m server <role> --redis-url URL ...`):

- gateway (`gateway.py`): serves the same `/api/v1` surface as the single-process server. It
  authenticates, turns every request into an *op* (method, path, owner, body) in Redis, pushed to
  the queue of the trainer that owns the op's session (`placement.py`), and waits for the op's
  reply; `retrieve_future` is answered from Redis, so any gateway answers any future.
- trainer (`trainer.py`): the single-process `TrainingService` (engine, scheduler, residency,
  checkpoints) behind a dispatcher that takes ops from its own reliable queue and runs them
  through the ordinary FastAPI app in process. Futures resolve into Redis
  (`store.RedisFutureStore`). Any number of replicas run side by side, each owning the sessions
  placed on it; a replica whose heartbeat lapses is taken over by another.
- sampler (`sampler.py`): takes sampling jobs that name an immutable, content-addressed adapter
  snapshot in the shared data dir and runs them on any backend with `sample(jobs)`.

Guarantees and where they come from:

- Every queue hand-off is one atomic Redis command (BLMOVE pending -> processing, LREM to
  acknowledge), so an op is never lost between reading and deleting it.
- Results are written once (SET NX): a replayed op recomputes its result and the write is a no-op.
- State-changing ops are appended to a durable op log (`journal.py`, per session and per run)
  atomically with their acknowledgement, fenced on the session's placement; the trainer that
  takes a session over restores each run's last saved state and replays the rest.

May import `server.api`, `service` and everything below them; the roles start from
`server.entrypoints.roles`.
"""
