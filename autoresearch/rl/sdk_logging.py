"""Quieting the one SDK log line that is not news.

The `tinker` SDK waits for a result by long polls; when a poll ends before the result is ready
(a training step on a CPU takes longer than one poll), it logs a warning, "Retrying request ...
because of try_again". Nothing is wrong and nothing is lost, but a trial of 30 steps prints
hundreds of them into a notebook cell or a study's log, where they bury real warnings. This
drops exactly that message from exactly that logger; every other SDK warning still shows.
"""

from __future__ import annotations

import logging

SDK_FUTURES_LOGGER = "tinker.lib.api_future_impl"


class LongPollNoise(logging.Filter):
    """Drops the SDK's warning for a long poll that ended before its result was ready."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "because of try_again" not in record.getMessage()


def quiet_long_polls() -> None:
    """Install the filter once on the SDK's futures logger (idempotent)."""
    logger = logging.getLogger(SDK_FUTURES_LOGGER)
    if not any(isinstance(f, LongPollNoise) for f in logger.filters):
        logger.addFilter(LongPollNoise())
