"""The SDK's long-poll warning is dropped from trials' logs; its other warnings still show."""

from __future__ import annotations

import inspect
import logging

import tinker.lib.api_future_impl as futures

from autoresearch.rl.sdk_logging import SDK_FUTURES_LOGGER, quiet_long_polls


def test_the_long_poll_warning_is_dropped_and_other_sdk_warnings_are_kept(caplog):
    # The filter matches the SDK's own wording, on the logger the SDK really logs it with.
    assert futures.logger.name == SDK_FUTURES_LOGGER
    assert "because of try_again" in inspect.getsource(futures)
    quiet_long_polls()
    quiet_long_polls()  # idempotent: one filter
    logger = logging.getLogger(SDK_FUTURES_LOGGER)
    assert len(logger.filters) == 1
    request_id = "req-7-forward_backward"
    with caplog.at_level(logging.WARNING, logger=SDK_FUTURES_LOGGER):
        logger.warning(f"Retrying request {request_id=} because of try_again")
        logger.warning("Request failed with status 500")
    assert [r.getMessage() for r in caplog.records] == ["Request failed with status 500"]
