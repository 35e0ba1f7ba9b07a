"""`python -m server gateway|trainer|sampler`: one role of the distributed server per process.

Every role takes the single-process server's flags (`python -m server --help`) plus the Redis
ones below; a worker's `--host/--port` serve its health, readiness and metrics endpoints only.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

import uvicorn

from server.api.http_protocol import HeaderTimeoutProtocol
from server.entrypoints.args import build_parser, config_from_args
from server.observability.logs import configure as configure_logging

log = logging.getLogger(__name__)



def role_parser(role: str) -> argparse.ArgumentParser:
    parser = build_parser(prog=f"autoresearch-server {role}")
    group = parser.add_argument_group("distributed")
    group.add_argument("--redis-url", required=True, help="redis://[:password@]host:port/db")
    group.add_argument("--redis-prefix", default="ar",
                       help="key prefix, so deployments can share one Redis")
    group.add_argument("--worker-id", default=None,
                       help="this worker's id (default: role, host name and pid; a trainer "
                       "adds a suffix per life)")
    group.add_argument("--heartbeat-ttl", type=float, default=10.0,
                       help="seconds a heartbeat lasts unless renewed; a trainer whose "
                       "heartbeat lapses has its sessions taken over by another replica")
    if role == "trainer":
        group.add_argument("--save-every", type=int, default=4,
                           help="save a run's state every this many optimizer steps")
        group.add_argument("--stall-seconds", type=float, default=120.0,
                           help="not ready when the engine has not come round this long")
    if role == "sampler":
        group.add_argument("--backend", default="torch",
                           help="torch, vllm, or module:factory called with these arguments")
        group.add_argument("--vllm-url", default=None, help="the vLLM server (--backend vllm)")
        group.add_argument("--vllm-wait-seconds", type=float, default=900.0,
                           help="how long to wait for vLLM to answer at start (it loads the "
                           "model first), with backoff")
        group.add_argument("--adapter-root", type=Path, default=None,
                           help="writable directory, seen by vLLM at the same path, where "
                           "adapters are published (<root>/adapters; default: --data-dir)")
        group.add_argument("--max-rows", type=int, default=64,
                           help="most samples decoded together in one batch (torch)")
        group.add_argument("--max-in-flight", type=int, default=32,
                           help="most jobs sent to vLLM at once; each is sent as it is taken "
                           "and answered as it finishes (vllm)")
    return parser


def _worker_id(role: str, args: argparse.Namespace) -> str:
    return args.worker_id or f"{role}-{socket.gethostname()}-{os.getpid()}"


def run_gateway(args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    from server.api.auth import KeyRing, is_loopback
    from server.distributed.gateway import create_gateway_app
    from server.distributed.store import SOCKET_TIMEOUT_SECONDS

    keys = KeyRing.from_sources(args.api_keys_file)
    if keys.open and not is_loopback(args.host):
        raise SystemExit(f"refusing to listen on {args.host} without API keys: configure "
                         "--api-keys-file or AUTORESEARCH_API_KEYS, or bind to 127.0.0.1")
    client = aioredis.Redis.from_url(args.redis_url, socket_timeout=SOCKET_TIMEOUT_SECONDS,
                                     socket_keepalive=True, health_check_interval=30)
    app = create_gateway_app(client, keys, args.redis_prefix)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="info", http=HeaderTimeoutProtocol
    )


def run_trainer(args: argparse.Namespace) -> None:
    from server.distributed.health import health_app
    from server.distributed.store import Keys, RedisFutureStore, Store, connect
    from server.distributed.trainer import DistributedService, TrainerWorker
    from server.entrypoints.runtime import build_engine, tokenizer_id_of
    from server.storage.checkpoints import CheckpointStore

    config = config_from_args(args)
    checkpoints = CheckpointStore(config.data_dir)  # before the model: a share it cannot write
    store = Store(connect(args.redis_url), Keys(args.redis_prefix))
    service = DistributedService(build_engine(config), checkpoints,
                                 RedisFutureStore(store), store, save_every=args.save_every,
                                 fuse=config.fuse, tokenizer_id=tokenizer_id_of(config),
                                 limits=config.limits)
    service.scheduler.stall_limit = args.stall_seconds
    worker = TrainerWorker(service, _worker_id("trainer", args), args.heartbeat_ttl)
    # Health is served while the worker takes over lapsed replicas and replays their journals.
    threading.Thread(target=worker.start, name="trainer-start", daemon=True).start()
    app = health_app("autoresearch trainer", worker.readiness, service.metrics.render)
    try:
        uvicorn.run(
            app, host=args.host, port=args.port, log_level="warning", http=HeaderTimeoutProtocol
        )
    finally:
        worker.stop()


def _backend(args: argparse.Namespace, config: Any, fallbacks: Any = None) -> tuple[Any, Any]:
    """(backend, device to load adapters on)."""
    if args.backend == "torch":
        from server.entrypoints.runtime import build_engine

        engine = build_engine(config, "sampler")
        return engine, engine.device
    if args.backend == "vllm":
        from server.samplers import make_sampler

        # vLLM reads adapters from the shared data dir, as this worker does.
        return make_sampler("vllm", base_url=args.vllm_url,
                            adapter_root=args.adapter_root or config.data_dir,
                            model=config.model, fallbacks=fallbacks,
                            wait_s=args.vllm_wait_seconds), "cpu"
    module, _, name = args.backend.partition(":")
    if not name:
        raise SystemExit(f"unknown sampling backend {args.backend!r}: use torch, vllm or "
                         "module:factory")
    factory = getattr(importlib.import_module(module), name)
    return factory(args), "cpu"


def run_sampler(args: argparse.Namespace) -> None:
    from server.distributed.health import health_app
    from server.distributed.sampler import SamplerWorker
    from server.distributed.store import Keys, Store, connect
    from server.observability.metrics import SamplerWorkerMetrics
    from server.samplers.fallbacks import REASONS, FallbackLog

    config = config_from_args(args)
    metrics = SamplerWorkerMetrics(REASONS)
    backend, device = _backend(args, config, FallbackLog(metrics.count_fallback))
    store = Store(connect(args.redis_url), Keys(args.redis_prefix))
    worker = SamplerWorker(store, backend, device, _worker_id("sampler", args),
                           args.heartbeat_ttl, max_rows=args.max_rows,
                           max_in_flight=args.max_in_flight).start()
    app = health_app("autoresearch sampler", worker.readiness, metrics.render)
    try:
        uvicorn.run(
            app, host=args.host, port=args.port, log_level="warning", http=HeaderTimeoutProtocol
        )
    finally:
        worker.stop()


def main(role: str, argv: list[str]) -> None:
    args = role_parser(role).parse_args(argv)
    configure_logging(json_lines=args.log_json)
    {"gateway": run_gateway, "trainer": run_trainer, "sampler": run_sampler}[role](args)
