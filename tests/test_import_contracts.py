"""The import contracts in pyproject.toml hold: layers import only downward, no sibling modules
import each other in a circle, `server` never imports `autoresearch`, and `rewards`/`sqltasks`
import neither."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "datasets"),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([lint, "--no-cache"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
