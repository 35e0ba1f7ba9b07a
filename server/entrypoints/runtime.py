"""Assembling and running a server: configuration, the model, the app, uvicorn.

`ServerConfig` is the one typed description of a server; the command line, tests and benchmarks
all build servers through `build_app` / `ServerThread`, so they exercise the same wiring.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import uvicorn

from server.api.auth import KeyRing, is_loopback
from server.api.http_protocol import HeaderTimeoutProtocol
from server.engine.engine import Engine
from server.engine.engine_thread import on_own_thread
from server.engine.model_loading import (
    default_cache_dir,
    embedded_cache_path,
    is_embedded,
    load_base_model,
)
from server.protocol.futures import FutureStore
from server.samplers.colocated import VLLMOptions, start_beside
from server.service.service import Limits, TrainingService
from server.storage.checkpoints import CheckpointStore

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    model: str | None = None
    """Hugging Face id or local directory; None serves the packaged Gemma 3 270M."""
    device: str | None = None
    dtype: str | None = None
    emulate_device: str | None = None
    """Run this device's layout (cuda or mps) on the CPU (`server.engine.devices`)."""
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = field(default_factory=lambda: default_cache_dir().parent / "server-data")
    api_keys_file: Path | None = None
    api_keys: str | None = None
    """Comma-separated keys; None reads AUTORESEARCH_API_KEYS."""
    fuse: bool = True
    tokenizer_id: str | None = None
    model_name: str | None = None
    """The name clients address the model by (default: `model`); lets a local directory be
    served under its Hub id, which is what clients load the tokenizer by."""
    max_context: int | None = None
    limits: Limits = field(default_factory=Limits)
    sampling: VLLMOptions = field(default_factory=lambda: VLLMOptions(sampler="torch"))
    """The single process's sampler (`server.samplers.colocated`); the command line's default
    is `auto` (vLLM beside the engine on CUDA), a `ServerConfig` built in code samples on the
    engine unless it asks."""


def build_service(config: ServerConfig) -> tuple[TrainingService, KeyRing]:
    keys = KeyRing.from_sources(config.api_keys_file, config.api_keys)
    if keys.open and not is_loopback(config.host):
        raise SystemExit(
            f"refusing to listen on {config.host} without API keys: configure --api-keys-file "
            "or AUTORESEARCH_API_KEYS, or bind to 127.0.0.1"
        )
    store = CheckpointStore(config.data_dir)
    service = TrainingService(
        build_engine(config),  # the scheduler's loop runs on the thread that loaded it
        store,
        FutureStore(),
        fuse=config.fuse,
        tokenizer_id=tokenizer_id_of(config),
        limits=config.limits,
    )
    return service, keys


def build_engine(config: ServerConfig, thread_name: str = "engine") -> Engine:
    """The configured model's engine under the name clients address it by, loaded on the
    thread whose loop will drive it (`engine.thread`). Every role that holds a torch engine
    (the single process, a trainer, a torch sampler worker) builds it here, so they agree on
    the model's name and on the thread."""

    def build() -> Engine:
        loaded = load_base_model(config.model, config.device, config.dtype,
                                 emulate=config.emulate_device)
        if config.model_name:
            loaded.model_name = config.model_name
        return Engine(loaded, max_context=config.max_context)

    return on_own_thread(build, name=thread_name)


def tokenizer_id_of(config: ServerConfig) -> str | None:
    """The tokenizer the server reports: the configured one, else for the packaged model its
    converted cache, which clients on this machine load straight from disk."""
    if config.tokenizer_id is None and is_embedded(config.model):
        return str(embedded_cache_path())
    return config.tokenizer_id


def attach_sampler(service: TrainingService, config: ServerConfig) -> None:
    """vLLM beside the engine where `config.sampling` asks for it and it starts; else the
    engine samples (the reason logged). The single process only: a trainer role has no
    sampler."""
    model = str(embedded_cache_path()) if is_embedded(config.model) else str(config.model)
    sampling = replace(config.sampling, port=config.sampling.port or free_port())
    beside = start_beside(service.engine, sampling, model, config.data_dir, service.metrics)
    if beside is not None:
        service.attach_vllm(beside)


def build_app(config: ServerConfig):
    from server.api.app import create_app

    service, keys = build_service(config)
    attach_sampler(service, config)
    return create_app(service, keys)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    """A real HTTP server on a background thread (for notebooks, tests and benchmarks)."""

    def __init__(self, config: ServerConfig):
        if not config.port:
            config.port = free_port()
        self.config = config
        self.app = build_app(config)
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host=config.host,
                port=config.port,
                log_level="warning",
                lifespan="off",
                http=HeaderTimeoutProtocol,
            )
        )
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def service(self) -> TrainingService:
        return self.app.state.service

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def start(self) -> ServerThread:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("server failed to start")
            threading.Event().wait(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.service.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(config: ServerConfig) -> None:
    app = build_app(config)
    try:
        uvicorn.run(
            app, host=config.host, port=config.port, log_level="info", http=HeaderTimeoutProtocol
        )
    finally:
        app.state.service.close()


__all__ = ["ServerConfig", "ServerThread", "build_app", "serve", "Path"]
