"""One thread for all of an engine's host work: its model's loading, then its loop.

Why: torch's CPU kernels run on OpenMP (libgomp), and every thread that runs a parallel region
keeps a team of worker threads of its own for the rest of its life. When the teams' threads
outnumber the cores, libgomp stops spinning between parallel regions (100 spins, not 300,000)
and puts its workers to sleep on a futex after each one. A server that loaded its model on
the main thread and then trained on an engine thread had two teams on two cores: an SFT step
of the transfer recipe made about 96,000 voluntary context switches (13 when one thread did
both), and the recipe's steps ran 1.16x slower (`bench/bench_recipe_steps.py`). No environment
variable lifts the throttle (`OMP_WAIT_POLICY=active` leaves it at 1,000 spins), so the engine
keeps one team by doing everything on one thread: `EngineThread.call` runs the loading there,
and the scheduler's (or a sampler worker's) loop then takes the same thread over with
`run_loop`.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class EngineThread:
    """A daemon thread that runs calls handed to it, then, once, the loop that keeps it."""

    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future | None]]
        self._calls = queue.SimpleQueue()
        self._loop_taken = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run `fn` on this thread and return what it returns (or raise what it raised)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        if self._loop_taken:
            raise RuntimeError(f"the {self.name} thread already runs its loop")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((lambda: fn(*args, **kwargs), done))
        return done.result()

    def run_loop(self, loop: Callable[[], None]) -> EngineThread:
        """Hand the thread to `loop` (a scheduler's or a sampler's); it ends when `loop` returns."""
        if self._loop_taken:
            raise RuntimeError(f"the {self.name} thread already runs a loop")
        self._loop_taken = True
        self._calls.put((loop, None))
        return self

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _serve(self) -> None:
        while True:
            fn, done = self._calls.get()
            if done is None:
                fn()  # the loop: the thread is its own from here to the end
                return
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed back to the caller, which re-raises it
                done.set_exception(exc)


class Driven(Protocol):
    """What a loop drives: an engine, which keeps the thread it was built on."""

    thread: EngineThread | None


E = TypeVar("E", bound=Driven)


def start_loop(
    driven: object, loop: Callable[[], None], name: str
) -> threading.Thread | EngineThread:
    """Run `loop` on the thread `driven` was built on where it has one (one OpenMP team), else on
    a new daemon thread called `name`; the thread, started."""
    home: EngineThread | None = getattr(driven, "thread", None)
    if home is not None:
        return home.run_loop(loop)
    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def on_own_thread(build: Callable[[], E], name: str = "engine") -> E:
    """Build an engine (load its model, construct it) on a new `EngineThread`, and give the
    engine that thread (`engine.thread`), for the loop that will drive it."""
    thread = EngineThread(name)
    try:
        engine = thread.call(build)
    except BaseException:
        thread.run_loop(lambda: None)  # nothing will drive it: let the thread end
        raise
    engine.thread = thread
    return engine
