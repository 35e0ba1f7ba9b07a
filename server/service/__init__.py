"""The request service: sessions, training runs, sampling and REST/checkpoint requests,
turned into engine work behind quotas and futures.

May import `server.scheduling`, `storage`, `engine`, `protocol` and `observability`.
"""
