"""The body of a scoring worker process: hard limits first, then a loop over scoring jobs.

A worker caps its own address space (RLIMIT_AS) before DuckDB allocates anything, asks the
kernel to kill it when its parent dies, and then serves batches of jobs from its pipe. For each
job it first does the trusted work (databases, gold results), sends `("arm", job_id)` so the
parent starts the kill clock, runs the prediction and sends `("done", job_id, result)`. After a
memory error the worker exits, because the DuckDB instance may be left in a poor state; the
parent starts a fresh one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import signal
from multiprocessing.connection import Connection

from rewards.codeversion import LOADED
from rewards.config import RewardConfig, SandboxLimits
from rewards.sandbox import Outcome, Sandbox, SandboxBroken
from rewards.score import CRASHED, Scorer, ScoreResult
from rewards.task import Task

Job = tuple[int, Task, str, RewardConfig]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux only: SIGKILL this process when the process that started it exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _cap_memory(limits: SandboxLimits) -> None:
    cap = limits.address_space_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux), reported with every result."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _arm(connection: Connection, job_id: int) -> None:
    connection.send(("arm", job_id))


def main(fd: int, limits_json: str) -> None:
    """Entry point of a worker process; `fd` is its end of the socket pair to the pool."""
    _die_with_parent()
    connection = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limits = SandboxLimits.model_validate_json(limits_json)
    _cap_memory(limits)
    scorer = Scorer(Sandbox(limits))
    connection.send(("ready", os.getpid(), LOADED))
    while True:
        try:
            batch: list[Job] = connection.recv()
        except (EOFError, OSError):
            return
        for job_id, task, prediction, config in batch:
            try:
                result = scorer.score(
                    task, prediction, config, on_untrusted=lambda j=job_id: _arm(connection, j)
                )
            except MemoryError:
                connection.send(("done", job_id, ScoreResult.zero("memory", "out of memory")))
                return
            except SandboxBroken as error:
                connection.send(("done", job_id, ScoreResult.zero(CRASHED, str(error))))
                return
            except Exception as error:  # report it; a worker never dies silently
                result = ScoreResult.zero(CRASHED, f"{type(error).__name__}: {error}"[:500])
            measured = {**result.meta, "peak_rss_mb": _peak_rss_mb()}
            result = dataclasses.replace(result, meta=measured)
            connection.send(("done", job_id, result))
            if result.outcome == Outcome.MEMORY:
                return
