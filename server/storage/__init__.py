"""What outlives a request: checkpoints (tinker:// paths, PEFT files), the spill format for
evicted adapters and sampler snapshots, adapter residency and the sampler cache.

May import `server.engine`, `protocol` and `observability`; not `scheduling`.
"""
