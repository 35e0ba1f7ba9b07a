"""The server's command-line flags and the `ServerConfig` they describe (shared by every role)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from server.service.lifecycle import (
    DEFAULT_SESSION_TIMEOUT_SECONDS,
    DEFAULT_SNAPSHOT_TTL_SECONDS,
    DEFAULT_SNAPSHOTS_PER_RUN,
    LifecyclePolicy,
)

if TYPE_CHECKING:
    from server.entrypoints.runtime import ServerConfig


def build_parser(prog: str = "autoresearch-server") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A self-hosted, Tinker-compatible LoRA training server.",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="Hugging Face id or local directory (default: packaged Gemma 3 270M)",
    )
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
    parser.add_argument(
        "--emulate-device",
        choices=("cuda", "mps"),
        default=None,
        help="run that device's numerics on the CPU (model wholly in bf16, its attention and "
        "invariance paths, the capability flags it reports): the device's code path without "
        "the device",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--data-dir", type=Path, default=None, help="where checkpoints are written")
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        default=None,
        help="file with one API key per line (else AUTORESEARCH_API_KEYS)",
    )
    parser.add_argument(
        "--no-fuse",
        action="store_true",
        help="run each training run's batches alone instead of fusing runs",
    )
    parser.add_argument(
        "--tokenizer-id",
        default=None,
        help="tokenizer id reported to clients (default: the model's)",
    )
    parser.add_argument(
        "--model-name",
        default=None,
        help="name clients address the model by (e.g. the Hub id of a local directory)",
    )
    parser.add_argument("--max-runs-per-key", type=int, default=None)
    parser.add_argument(
        "--max-queued-tokens-per-key",
        type=int,
        default=None,
        help="beyond this, submissions get 429 and the SDK retries later",
    )
    parser.add_argument(
        "--max-resident-runs",
        type=int,
        default=None,
        help="cap on adapters kept in device memory; idle ones spill to disk",
    )
    parser.add_argument(
        "--max-resident-samplers",
        type=int,
        default=32,
        help="sampler snapshots kept in memory; older ones wait on disk until sampled again",
    )
    parser.add_argument(
        "--idle-evict-seconds",
        type=float,
        default=None,
        help="spill a run's adapter to disk after this long without requests",
    )
    parser.add_argument(
        "--snapshots-per-run",
        type=int,
        default=DEFAULT_SNAPSHOTS_PER_RUN,
        help="unnamed sampler snapshots kept per run (the newest; 0: all); older ones are freed",
    )
    parser.add_argument(
        "--snapshot-ttl-seconds",
        type=float,
        default=DEFAULT_SNAPSHOT_TTL_SECONDS,
        help="free an unnamed sampler snapshot unused for this long (0: never)",
    )
    parser.add_argument(
        "--session-timeout-seconds",
        type=float,
        default=DEFAULT_SESSION_TIMEOUT_SECONDS,
        help="end a session (freeing its snapshots) this long after its last heartbeat (0: never)",
    )
    parser.add_argument("--log-json", action="store_true", help="structured JSON log lines")
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from server.entrypoints.runtime import ServerConfig
    from server.service.service import Limits

    config = ServerConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        emulate_device=args.emulate_device,
        host=args.host,
        port=args.port,
        api_keys_file=args.api_keys_file,
        fuse=not args.no_fuse,
        tokenizer_id=args.tokenizer_id,
        model_name=args.model_name,
        limits=Limits(
            args.max_runs_per_key,
            args.max_queued_tokens_per_key,
            args.max_resident_runs,
            args.idle_evict_seconds,
            args.max_resident_samplers,
            LifecyclePolicy(  # 0 turns a bound off
                snapshots_per_run=args.snapshots_per_run or None,
                snapshot_ttl_seconds=args.snapshot_ttl_seconds or None,
                session_timeout_seconds=args.session_timeout_seconds or None,
            ),
        ),
    )
    config.log_json = args.log_json  # type: ignore[attr-defined]
    if args.data_dir is not None:
        config.data_dir = args.data_dir
    return config


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """The single process's sampler: vLLM beside the engine on CUDA, or the engine itself."""
    from server.samplers.colocated import SAMPLERS

    group = parser.add_argument_group("sampling (the single process)")
    group.add_argument(
        "--sampler",
        choices=SAMPLERS,
        default="auto",
        help="auto: vLLM beside the engine on CUDA when it can start (else the engine); vllm: "
        "always try it; torch: the engine samples (bit-equal to training where invariant)",
    )
    group.add_argument("--vllm-url", default=None,
                       help="sample on this running vLLM instead of starting one")
    group.add_argument("--vllm-executable", default="vllm",
                       help="the command that starts vLLM")
    group.add_argument("--vllm-port", type=int, default=0, help="0: a free port")
    group.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3,
                       help="vLLM's share of the GPU's memory; the engine trains in the rest")
    group.add_argument("--vllm-max-lora-rank", type=int, default=64,
                       help="runs of a higher rank sample on the engine (8-512, vLLM's steps)")
    group.add_argument("--vllm-max-loras", type=int, default=8,
                       help="adapters vLLM holds on the GPU at once")


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    from server.samplers.colocated import VLLMOptions

    parser = build_parser()
    add_sampling_flags(parser)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    config.sampling = VLLMOptions(
        sampler=args.sampler, url=args.vllm_url, executable=args.vllm_executable,
        port=args.vllm_port, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_lora_rank=args.vllm_max_lora_rank, max_loras=args.vllm_max_loras)
    return config
