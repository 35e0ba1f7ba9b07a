"""Each run's ordered stream: sequence numbers, duplicates and refusals."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from server.engine.engine import UserError
from server.protocol.futures import FutureRecord
from server.scheduling.scheduler import Work
from server.service.core import ServiceCore
from server.service.errors import Backpressure
from server.service.records import Run


class RunOrdering(ServiceCore):
    """A run's requests execute in `seq_id` order, duplicates get the first answer, and a
    refused request still takes its place."""

    @contextlib.contextmanager
    def _refusal_keeps_order(
        self, owner: str, run: Run, seq_id: int | None, kind: str
    ) -> Iterator[None]:
        """A request refused before it is queued still takes its place in the run's order.

        Without this, a refused `seq_id` would never execute and every later request of the
        run would wait for it forever. The refusal is queued at that `seq_id` as work that
        fails with the same error, so the stream moves past it (and a retry of the same
        `seq_id` gets the same answer). Backpressure is not a refusal: the SDK retries it.
        """
        try:
            yield
        except Backpressure:
            raise
        except Exception as exc:  # a server fault too must not leave a hole in the order
            if seq_id is not None and self.scheduler.has_stream(run.run_id):
                error = exc

                def refuse() -> None:
                    raise error

                self._ordered_action(owner, run, seq_id, kind, refuse)
            raise

    def _ordered_action(
        self,
        owner: str,
        run: Run,
        seq_id: int | None,
        kind: str,
        action,
        work_kind: str | None = None,
    ) -> FutureRecord:
        """Queue `action` on the run's ordered stream; its result completes the future."""
        return self._ordered(
            owner,
            run,
            seq_id,
            kind,
            lambda rec: Work(run.run_id, work_kind or kind, self._complete(rec), action=action),
        )

    def _ordered(
        self, owner: str, run: Run, seq_id: int | None, kind: str, make_work
    ) -> FutureRecord:
        """Queue work on a run's ordered stream, answering duplicates with the first future."""
        if seq_id is not None:
            existing = self._dedup.get((run.run_id, seq_id))
            if existing is not None:
                return existing
        record = self.futures.create(owner, kind)
        record.run_id = run.run_id
        work: Work = make_work(record)
        work.run_id, work.seq_id, work.owner = run.run_id, seq_id, owner
        if seq_id is None:
            self.scheduler.submit_control(work)
            return record
        try:
            accepted = self.scheduler.submit_ordered(work)
        except UserError as exc:
            self.futures.fail(record, str(exc))
            raise
        if not accepted:
            self.futures.fail(record, f"seq_id {seq_id} was already used for {run.run_id}")
            return record
        self._remember_dedup(run.run_id, seq_id, record)
        return record
