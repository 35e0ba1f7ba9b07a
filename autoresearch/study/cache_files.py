"""Files of the study caches (warm-ups, finished trials): where they live, how an entry is
published, and how checkpoints travel between embedded servers' data directories.

An entry is staged in a temporary directory beside its final place and renamed into place
whole, so a reader never sees half of one; two studies publishing the same entry at once are
both right, and the first rename wins.

An embedded server's data directory is private to its study, so a checkpoint another study
should start from (a cached warm-up) or score (a cached trial) travels as files: the adapter
directory and its run's metadata, laid out as in a server's data directory. The server reads
checkpoints from disk when they are used, and run ids are random and unique, so an installed
copy is loadable like one the server wrote itself.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir(kind: str) -> Path:
    """$AUTORESEARCH_CACHE/<kind>, else ~/.cache/autoresearch/<kind>."""
    root = os.environ.get("AUTORESEARCH_CACHE") or Path.home() / ".cache" / "autoresearch"
    return Path(root) / kind


def publish_entry(target: Path, fill: Callable[[Path], None]) -> None:
    """Create the cache entry `target` unless it exists: `fill` writes it into a staging
    directory, which is then renamed into place (removed if anything fails)."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        fill(staging)
        if target.exists():
            shutil.rmtree(staging)
            return
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def checkpoint_paths(data_dir: Path, checkpoint: str) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) of `checkpoint` in a server data directory, as the
    server's own store lays them out."""
    from server.storage.checkpoints import CheckpointStore, TinkerPath

    path = TinkerPath.parse(checkpoint)
    store = CheckpointStore(data_dir)
    return store.run_dir(path.run_id), store.checkpoint_dir(path)


def copy_checkpoint(source_data: Path, target_data: Path, checkpoint: str) -> None:
    """Copy one checkpoint (and its run's metadata) from one data directory into another that
    is not in use yet (a cache entry being staged)."""
    source_run, source = checkpoint_paths(source_data, checkpoint)
    target_run, target = checkpoint_paths(target_data, checkpoint)
    shutil.copytree(source, target)
    shutil.copy2(source_run / "run.json", target_run / "run.json")


def install_checkpoint(source_data: Path, server_data: Path, checkpoint: str,
                       owner: str) -> None:
    """Make a copied checkpoint loadable by the server whose data directory is `server_data`,
    owned by `owner` (the key the study's trials use). Each file lands by an atomic rename, so
    a server never reads half a checkpoint."""
    source_run, source = checkpoint_paths(source_data, checkpoint)
    target_run, target = checkpoint_paths(server_data, checkpoint)
    if not source.exists():
        raise FileNotFoundError(f"{source_data} holds no copy of {checkpoint}")
    if not (target / "adapter_model.safetensors").exists():
        (server_data / "runs").mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".import-", dir=server_data / "runs"))
        shutil.copytree(source, staging / target.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / target.name, target)
        shutil.rmtree(staging, ignore_errors=True)
    meta = json.loads((source_run / "run.json").read_text())
    meta["owner"] = owner
    tmp = target_run / ".run.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, target_run / "run.json")
