"""`autoresearch-server` / `python -m server`: serve the Tinker API on one resident model.

`python -m server gateway|trainer|sampler --redis-url URL ...` runs one role of the distributed
server instead (`server.distributed`); the gateway role never imports torch.
"""

from __future__ import annotations

import sys

from server.entrypoints.args import parse_args
from server.observability.logs import configure as configure_logging

ROLES = ("gateway", "trainer", "sampler")


def main(argv: list[str] | None = None) -> None:
    from server.storage.ownership import StorageOwnershipError

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in ROLES:
            from server.entrypoints.roles import main as run_role

            run_role(argv[0], argv[1:])
            return
        from server.engine.model_loading import ModelNotFound
        from server.entrypoints.runtime import serve

        config = parse_args(argv)
        configure_logging(json_lines=getattr(config, "log_json", False))
        try:
            serve(config)
        except ModelNotFound as exc:  # a gated or offline model: say what to do, no traceback
            raise SystemExit(f"error: {exc}") from None
    except StorageOwnershipError as exc:  # the share's owner, not a traceback, in the pod log
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
