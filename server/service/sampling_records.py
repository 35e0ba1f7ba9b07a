"""What `record_stability_info=True` keeps of each sampled sequence, for `stable_reinforce`.

A sampling request made with `record_stability_info=True` leaves, per returned sequence, the
prompt's length, the sampled tokens and the sampler's log-probability of each sampled token,
keyed by the sequence's `sequence_id`. A training request names those sequences through its datums'
provenance spans (`loss_fn_input_spans`); `resolve` turns the spans into two per-position inputs
the loss reads (`recorded_logprobs`, `recorded_mask`).

As Tinker documents: records belong to the session that sampled them (a training request from
another session, or another key, cannot name them), and they can be trained on for a day after
sampling, each training request that uses one restarting its day. Memory stays bounded: past
`max_tokens` recorded tokens the least recently used records are dropped, and a training request
that names a dropped record gets a user error that says so.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from server.engine.losses import RECORDED_LOGPROBS, RECORDED_MASK, LossError
from server.protocol.codec import Span

DAY_SECONDS = 24 * 3600.0
DEFAULT_MAX_TOKENS = 8_000_000
"""Budget in prompt plus sampled tokens; only sampled tokens and their log-probabilities are
stored (12 bytes each), so the records stay under about 100 MB."""


@dataclass
class SequenceRecord:
    owner: str
    session_id: str
    prompt_length: int
    tokens: np.ndarray
    logprobs: np.ndarray
    last_used: float

    @property
    def size(self) -> int:
        return self.prompt_length + len(self.tokens)


def session_of(resource_id: str) -> str:
    """`sess:train:3` and `sess:sample:1` both belong to session `sess`."""
    return resource_id.split(":", 1)[0]


class SamplingRecords:
    def __init__(
        self,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        ttl_seconds: float = DAY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_tokens = max_tokens
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._records: OrderedDict[str, SequenceRecord] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    @property
    def recorded_tokens(self) -> int:
        return self._tokens

    def add(
        self,
        owner: str,
        session_id: str,
        sequence_id: str,
        prompt_length: int,
        tokens: list[int],
        logprobs: list[float],
    ) -> None:
        record = SequenceRecord(
            owner,
            session_id,
            prompt_length,
            np.asarray(tokens, dtype=np.int64),
            np.asarray(logprobs, dtype=np.float32),
            self._clock(),
        )
        with self._lock:
            old = self._records.pop(sequence_id, None)
            if old is not None:
                self._tokens -= old.size
            self._records[sequence_id] = record
            self._tokens += record.size
            self._prune()

    def _prune(self) -> None:
        now = self._clock()
        while self._records:
            sequence_id, oldest = next(iter(self._records.items()))
            expired = now - oldest.last_used > self.ttl_seconds
            if not expired and self._tokens <= self.max_tokens:
                break
            del self._records[sequence_id]
            self._tokens -= oldest.size

    def _lookup(self, owner: str, session_id: str, sequence_id: str, where: str) -> SequenceRecord:
        record = self._records.get(sequence_id)
        if record is not None and self._clock() - record.last_used > self.ttl_seconds:
            record = None
        if record is None or record.owner != owner or record.session_id != session_id:
            raise LossError(
                f"{where}: no sampling record for sequence_id {sequence_id!r} in this session. "
                "Records exist only for sequences sampled with record_stability_info=True in the "
                "same session, for a day after their last use (or until the server's record "
                "budget drops the least recently used); sample again."
            )
        return record

    def resolve(
        self, owner: str, session_id: str, index: int, targets: np.ndarray, spans: list[Span]
    ) -> dict[str, np.ndarray]:
        """The recorded inputs of one datum from its `loss_fn_input_spans`; raises `LossError`
        if the spans do not tile the targets, name unknown sequences, or disagree with them."""
        where = f"data[{index}].loss_fn_input_spans"
        n = len(targets)
        if sum(span.length for span in spans) != n:
            raise LossError(f"{where}: the spans cover {sum(s.length for s in spans)} positions "
                            f"but target_tokens has {n}; they must tile it exactly")
        logprobs = np.zeros(n, dtype=np.float32)
        mask = np.zeros(n, dtype=np.float32)
        used: list[SequenceRecord] = []
        with self._lock:
            position = 0
            for span in spans:
                record = self._lookup(owner, session_id, span.sequence_id, where)
                used.append(record)
                end = span.offset + span.length
                available = len(record.tokens) if span.sampled else record.prompt_length
                if end > available:
                    kind = "sampled tokens" if span.sampled else "prompt tokens"
                    raise LossError(
                        f"{where}: span [{span.offset}, {end}) is past the {available} {kind} "
                        f"of sequence {span.sequence_id!r}"
                    )
                if span.sampled and span.length:
                    here = slice(position, position + span.length)
                    if not np.array_equal(targets[here], record.tokens[span.offset : end]):
                        raise LossError(
                            f"{where}: target_tokens[{position}:{position + span.length}] are not "
                            f"the tokens sampled as sequence {span.sequence_id!r}"
                        )
                    logprobs[here] = record.logprobs[span.offset : end]
                    mask[here] = 1.0
                position += span.length
            now = self._clock()
            for record in used:
                record.last_used = now
            for span in spans:
                if span.sequence_id in self._records:
                    self._records.move_to_end(span.sequence_id)
        return {RECORDED_LOGPROBS: logprobs, RECORDED_MASK: mask}
