"""The `autoresearch` command line.

    autoresearch trial --config trial.yaml [--server-url URL] [--out DIR]

Without `--server-url` (or `TINKER_BASE_URL`) it starts the embedded training server in this
process. API keys come from `TINKER_API_KEY`, never from a config file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from autoresearch.config import TrialConfig


@contextlib.contextmanager
def server_url(url: str | None, data_dir: Path) -> Iterator[str]:
    """The given server, or an embedded one for the duration of the block."""
    url = url or os.environ.get("TINKER_BASE_URL")
    if url:
        yield url
        return
    from server.runtime import ServerConfig, ServerThread

    with ServerThread(ServerConfig(port=0, data_dir=data_dir)) as server:
        yield server.url


def _api_key() -> str:
    return os.environ.get("TINKER_API_KEY") or "tml-local"


def cmd_trial(args: argparse.Namespace) -> int:
    from autoresearch.progress import TrialProgress
    from autoresearch.trial import run_trial

    config = TrialConfig.from_file(args.config)
    out = Path(args.out or Path("runs") / f"{config.name}-{config.fingerprint()}")
    progress = TrialProgress(config.sft.steps + config.rl.steps, config.name)
    try:
        with server_url(args.server_url, out / "server-data") as url:
            result = run_trial(config, out, url, _api_key(), progress)
    finally:
        progress.close()
    summary = {
        "directory": str(result.directory),
        "dev_accuracy": (result.dev or {}).get("accuracy"),
        "test_accuracy": (result.test or {}).get("accuracy"),
        "steps": result.steps,
        "tokens": result.tokens,
        "wall_seconds": result.wall_seconds,
        "checkpoint": result.checkpoint,
    }
    print(json.dumps(summary, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoresearch", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    trial = sub.add_parser("trial", help="run (or resume) one trial from a config file")
    trial.add_argument("--config", required=True, type=Path)
    trial.add_argument("--server-url", default=None)
    trial.add_argument(
        "--out", default=None, type=Path, help="trial directory (an existing one is resumed)"
    )
    trial.set_defaults(func=cmd_trial)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    # The SDK logs every long-poll that ends in "try again" (normal while a batch runs).
    logging.getLogger("tinker").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
