"""What the service raises, and which of it is the client's fault."""

from __future__ import annotations

from server.engine.engine import UserError
from server.engine.losses import LossError
from server.protocol.codec import WireError
from server.scheduling.scheduler import RunGone
from server.storage.checkpoints import CheckpointError
from server.storage.weight_export import ExportError

USER_ERRORS = (UserError, LossError, CheckpointError, ExportError, RunGone, WireError)
"""The client's fault (HTTP 400 / future category "user"); any other exception is a server
fault (HTTP 500 / category "server"), logged with its traceback."""


class NotFound(LookupError):
    """Unknown (or not yours) session, run, sampler or checkpoint."""


class QuotaExceeded(PermissionError):
    """A per-key limit that waiting will not lift (e.g. too many runs): HTTP 429, no retry."""


class SnapshotFreed(NotFound):
    """A sampler snapshot that existed but was freed under the lifecycle policy."""


class SessionGone(LookupError):
    """The session ended or expired: HTTP 410, which stops the SDK's heartbeat."""


class Backpressure(RuntimeError):
    """The key has too much work queued: HTTP 429, which the SDK retries after a pause."""
