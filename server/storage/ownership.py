"""A data directory this process can write, or an error that says whose it is and what to do.

A fresh Filestore share is owned by root with mode 755, and the Filestore CSI driver does not
apply a pod's `fsGroup` to it, so every role running as uid 10001 would otherwise die on its
first `mkdir` with a bare `Permission denied`. The deployment gives the share to that uid once
(`deploy/gke/share-owner`); this check names that step when it has not run.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SHARE_OWNER_HINT = (
    "A fresh Filestore share is owned by root and its CSI driver ignores fsGroup: give the "
    "share to the pods' user once with `deploy/gke/share-owner/apply.sh` (docs/deploy-gke.md, "
    "'Storage ownership')."
)


class StorageOwnershipError(PermissionError):
    """The data directory cannot be created or written by this process's user."""


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def describe_owner(path: Path) -> str:
    """`path`'s owner, group and mode, as `ls -ln` would say them."""
    info = path.stat()
    return f"uid {info.st_uid}, gid {info.st_gid}, mode {stat.filemode(info.st_mode)}"


def ensure_writable_dir(path: str | Path) -> Path:
    """Create `path` (and its parents) and check this process can write in it; otherwise raise
    `StorageOwnershipError` naming the directory in the way, its owner and the fix."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        writable = os.access(directory, os.W_OK | os.X_OK)
    except PermissionError:
        writable = False
    if writable:
        return directory
    blocking = _nearest_existing(directory)
    if blocking == directory:
        where = f"{directory} exists but is not writable"
    else:
        where = f"cannot create {directory}: {blocking} is not writable"
    raise StorageOwnershipError(
        f"{where} by this process (uid {os.getuid()}, gid {os.getgid()}, groups "
        f"{sorted(os.getgroups())}); it belongs to {describe_owner(blocking)}. {SHARE_OWNER_HINT}"
    )
