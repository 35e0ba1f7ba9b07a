"""Executors: run one trial to the end and return its result. `base` (the protocol and the
result line), `local` (in this process) and `kubernetes` (one Job per trial).

May import `autoresearch.study.spec`, `autoresearch.rl`; not the runner.
"""
