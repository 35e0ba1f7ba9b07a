"""The embedded model's one-time conversion is safe when two processes start at once.

Both processes find no cache; the conversion (stubbed here with a slow one that records who
ran it, since the real one takes minutes) must run once, the second process waiting on the
lock and then using what the first wrote.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.server.server_helpers import REPO_ROOT

RACER = """
import sys, time
from pathlib import Path
import server.engine.model_loading as loading

def slow_convert(target):
    (target.parent / ("converted-by-" + sys.argv[2])).write_text("")
    time.sleep(1.5)
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text("{}")
    return target

loading.convert_embedded_gguf = slow_convert
print("START", flush=True)
while not (Path(sys.argv[1]) / "go").exists():  # both racers released together
    time.sleep(0.01)
path, converted = loading.ensure_embedded_cache(Path(sys.argv[1]))
print(path, converted)
"""


def test_two_processes_convert_the_embedded_model_once(tmp_path: Path):
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), name], cwd=REPO_ROOT,
                         stdout=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    for racer in racers:
        assert racer.stdout.readline().strip() == "START"
    (tmp_path / "go").write_text("")
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    assert all(r.returncode == 0 for r in racers), outputs
    assert len(list(tmp_path.glob("converted-by-*"))) == 1
    results = [line.split() for out in outputs for line in out.splitlines()
               if not line.startswith("START")]
    assert sorted(flag for _, flag in results) == ["False", "True"]
    assert len({path for path, _ in results}) == 1
    assert (Path(results[0][0]) / "config.json").exists()
