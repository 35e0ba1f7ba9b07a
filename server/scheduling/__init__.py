"""Scheduling: queues per run and the fused batches handed to the engine.

May import `server.engine`, `protocol` and `observability`.
"""
