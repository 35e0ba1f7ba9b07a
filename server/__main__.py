"""`autoresearch-server` / `python -m server`: serve the Tinker API on one resident model."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from server.runtime import ServerConfig, serve


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser(
        prog="autoresearch-server",
        description="A self-hosted, Tinker-compatible LoRA training server.",
    )
    parser.add_argument("--model", default=None,
                        help="Hugging Face id or local directory (default: packaged Gemma 3 270M)")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where checkpoints are written")
    parser.add_argument("--api-keys-file", type=Path, default=None,
                        help="file with one API key per line (else AUTORESEARCH_API_KEYS)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="run each training run's batches alone instead of fusing runs")
    parser.add_argument("--tokenizer-id", default=None,
                        help="tokenizer id reported to clients (default: the model's)")
    args = parser.parse_args(argv)
    config = ServerConfig(model=args.model, device=args.device, dtype=args.dtype, host=args.host,
                          port=args.port, api_keys_file=args.api_keys_file, fuse=not args.no_fuse,
                          tokenizer_id=args.tokenizer_id)
    if args.data_dir is not None:
        config.data_dir = args.data_dir
    return config


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    serve(parse_args(argv))


if __name__ == "__main__":
    main()
