"""The trainer's durable memory: which ops change state, and saved run state to replay from.

An op that changes state is journaled when the trainer accepts it: session-level ops (sessions,
run creation, sampling sessions, deletion) on the control log, a run's own ops on that run's log
with their `seq_id`. The trainer saves each run's state (adapter, AdamW state) every few
optimizer steps together with the point it covers: the next `seq_id` and the ids of unsequenced
ops already applied. After a restart, runs are rebuilt from the control log, their saved state
and the ops of their logs that the save does not cover, in `seq_id` order as before.

Ops must be deterministic to replay: `normalize` fills in what the single-process server would
draw at random (a LoRA seed, a checkpoint name) from the op id instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tinker.proto import tinker_public_pb2 as pb

from server.distributed.state_writer import host_copy
from server.engine.engine import Engine, RunState
from server.engine.lora import AdapterWeights, LoraSpec

CONTROL_PATHS = {"/create_session", "/create_model", "/create_sampling_session"}
RUN_PATHS = {"/optim_step", "/save_weights", "/save_weights_for_sampler", "/load_weights"}


@dataclass(frozen=True)
class Target:
    """Where an accepted op is journaled: the control log, or a run's log."""

    run_id: str | None = None
    seq_id: int | None = None

    @property
    def control(self) -> bool:
        return self.run_id is None


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _seq(value: Any) -> int | None:
    return None if value is None else int(value)


def classify(method: str, path: str, body: bytes) -> Target | None:
    """The journal an accepted op belongs to, or None for ops that change no trainer state."""
    if method == "POST" and (path in CONTROL_PATHS or
                             (path.startswith("/sessions/") and path.endswith("/finish"))):
        return Target()
    if method == "DELETE" and path.startswith("/training_runs/") and path.count("/") == 2:
        return Target()
    if method != "POST":
        return None
    if path == "/forward_backward":
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(body)
        return Target(msg.model_id, int(msg.seq_id))
    if path in RUN_PATHS:
        data = parse_json(body)
        if path == "/load_weights" and data.get("session_id") is not None:
            return Target()  # loads into a new run: creates it
        return Target(str(data["model_id"]), _seq(data.get("seq_id")))
    return None


def normalize(op_id: str, path: str, body: bytes) -> bytes:
    """Replace what the server would choose at random by values derived from the op id."""
    if path not in ("/create_model", "/save_weights"):
        return body
    data = parse_json(body)
    derived = int(hashlib.sha256(op_id.encode()).hexdigest()[:8], 16)
    if path == "/create_model":
        lora = dict(data.get("lora_config") or {})
        if lora.get("seed") is None:
            lora["seed"] = derived % 2**31
            data["lora_config"] = lora
    elif not data.get("path"):
        data["path"] = f"step-{derived:08x}"
    return json.dumps(data).encode()


def log_entry(op_id: str, seq_id: int | None) -> str:
    return f"{op_id}|{'' if seq_id is None else seq_id}"


def parse_entry(raw: bytes | str) -> tuple[str, int | None]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    op_id, _, seq = text.partition("|")
    return op_id, (int(seq) if seq else None)


@dataclass
class SavePoint:
    """What a saved run state covers: seq_ids below `next_seq` and these unsequenced ops."""

    next_seq: int
    unsequenced: list[str] = field(default_factory=list)
    file: str = ""

    def covers(self, op_id: str, seq_id: int | None) -> bool:
        return op_id in self.unsequenced if seq_id is None else seq_id < self.next_seq


class RunStateSaves:
    """`<data_dir>/distributed/run-state/<run>/`: the saved state files of each run.

    Which file is in force is not decided here: its pointer (a `SavePoint`) is written to Redis
    by the trainer, in the same transaction that trims the journal and fenced on the session's
    placement, so a trainer that lost the session can write a file nobody points to, never a
    pointer. A `point.json` beside the files is the pointer of saves made before that, still
    read when Redis has none."""

    def __init__(self, data_dir: Path):
        self.root = Path(data_dir) / "distributed" / "run-state"

    def _dir(self, run_id: str) -> Path:
        return self.root / run_id.replace("/", "_").replace(":", "_")

    @staticmethod
    def snapshot(state: RunState) -> dict[str, Any]:
        """What a save writes, copied to host memory: taken on the engine thread between steps,
        written later by `write` while the engine goes on."""
        adapter = state.adapter
        return host_copy({
            "spec": asdict(adapter.spec),
            "a": dict(adapter.a),
            "b": dict(adapter.b),
            "optimizer": state.optimizer.state_dict(),
            "steps": state.steps,
        })

    def write(self, run_id: str, payload: dict[str, Any], point: SavePoint,
              writer: str = "") -> None:
        """The state file, whole or not at all (`point.file` names it). The name carries the
        writer, so two trainers that both believe they own a run never write the same file."""
        directory = self._dir(run_id)
        directory.mkdir(parents=True, exist_ok=True)
        point.file = f"state-{point.next_seq}{'-' + writer if writer else ''}.pt"
        _atomic(directory / point.file, lambda tmp: torch.save(payload, tmp))

    def prune(self, run_id: str, keep: str) -> None:
        """Remove every state file but the one in force (and the legacy pointer)."""
        for old in self._dir(run_id).glob("state-*.pt"):
            if old.name != keep:
                old.unlink(missing_ok=True)
        (self._dir(run_id) / "point.json").unlink(missing_ok=True)

    def prune_file(self, run_id: str, name: str) -> None:
        """Remove one state file (a save whose pointer was refused)."""
        (self._dir(run_id) / name).unlink(missing_ok=True)

    def legacy_point(self, run_id: str) -> SavePoint | None:
        """The pointer file of a save made before pointers moved to Redis."""
        try:
            return SavePoint(**json.loads((self._dir(run_id) / "point.json").read_text()))
        except FileNotFoundError:
            return None

    def load(self, run_id: str, point: SavePoint, engine: Engine) -> RunState:
        payload = torch.load(self._dir(run_id) / point.file, map_location=engine.device,
                             weights_only=True)
        adapter = AdapterWeights(LoraSpec(**payload["spec"]), payload["a"], payload["b"])
        state = engine.restore_run(adapter, payload["optimizer"])
        state.steps = payload["steps"]
        return state

    def delete(self, run_id: str) -> None:
        directory = self._dir(run_id)
        for file in directory.glob("*"):
            file.unlink(missing_ok=True)
        if directory.exists():
            directory.rmdir()


def _atomic(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
