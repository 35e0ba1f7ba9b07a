"""Observability: Prometheus metrics and structured logs. The bottom layer: imports nothing of
`server`.
"""
