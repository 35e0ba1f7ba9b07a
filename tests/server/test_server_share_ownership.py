"""A data directory the server's user cannot write: every role stops at once with an error that
names the directory's owner and the deployment step that fixes it, not a traceback from the
first `mkdir`. As root the server runs as uid 10001 on a directory owned by root (what a fresh
Filestore share gives the pods); as another user, on a directory it may not write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from server.storage.ownership import SHARE_OWNER_HINT, StorageOwnershipError, ensure_writable_dir
from tools.rehearsal.cluster import (
    can_isolate,
    can_run_as_users,
    image_files,
    mount_namespace,
    run_as,
)
from tools.rehearsal.manifests import Security

REPO = Path(__file__).resolve().parents[2]


def _as_another_user(share: Path, tmp: Path) -> list[str]:
    """The prefix that runs a command as a user who cannot write `share`: as root, uid 10001
    with this checkout's interpreter reachable (as the rehearsal runs pods); otherwise this
    user, with the share made read-only to it."""
    if os.geteuid() == 0:
        if not can_run_as_users() or not can_isolate():
            pytest.fail("running as root needs setpriv and unshare (util-linux) to act as the "
                        "pods' user")
        share.chmod(0o755)
        staging = tmp.parent / "staging"
        return [*mount_namespace([tmp, share], [], staging=staging, reveal=image_files()),
                *run_as(Security(10001, 10001, None))]
    share.chmod(0o555)
    return []


@pytest.mark.parametrize("role", [[], ["trainer", "--redis-url=redis://127.0.0.1:1/0"]])
def test_a_role_on_a_share_it_cannot_write_exits_naming_the_owner_and_the_step(
        role: list[str]) -> None:
    # Outside pytest's temporary root, which other users cannot traverse.
    work = Path(tempfile.mkdtemp(prefix="share-", dir="/var/tmp" if os.path.isdir(
        "/var/tmp") else None))
    share, tmp = work / "share", work / "tmp"
    share.mkdir()
    tmp.mkdir()
    work.chmod(0o755)
    tmp.chmod(0o777)
    try:
        prefix = _as_another_user(share, tmp)
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "server", *role, "--model", str(work / "none"),
             f"--data-dir={share}/checkpoints"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)})
    finally:
        share.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"cannot create {share}/checkpoints/runs" in result.stderr
    assert f"{share} is not writable" in result.stderr
    assert "deploy/gke/share-owner/apply.sh" in result.stderr


def test_a_writable_directory_is_made_and_an_unwritable_one_names_its_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = ensure_writable_dir(tmp_path / "a" / "b")
    assert made.is_dir()
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    with pytest.raises(StorageOwnershipError) as caught:
        ensure_writable_dir(made)
    info = made.stat()
    assert f"{made} exists but is not writable" in str(caught.value)
    assert f"uid {info.st_uid}, gid {info.st_gid}, mode drwx" in str(caught.value)
    assert SHARE_OWNER_HINT in str(caught.value)
