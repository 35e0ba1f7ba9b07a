"""The journal: concurrent writers are safe, and other processes can read it between writes."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from autoresearch.study.journal import Journal

READER = """
import sys, time, duckdb
path, seen = sys.argv[1], 0
deadline = time.time() + 60
while time.time() < deadline:
    try:
        db = duckdb.connect(path, read_only=True)
    except duckdb.IOException:
        time.sleep(0.01)
        continue
    n = db.execute("SELECT count(*) FROM steps").fetchone()[0]
    db.close()
    seen += 1
    if n >= int(sys.argv[2]):
        break
    time.sleep(0.05)
print(seen, n)
"""


def test_threads_write_safely_while_another_process_reads(tmp_path: Path):
    journal = Journal(tmp_path)
    threads, per_thread, writers = [], 5, 3
    reader = subprocess.Popen([sys.executable, "-c", READER, str(journal.path),
                               str(per_thread * writers)], stdout=subprocess.PIPE, text=True)

    def write(trial: int) -> None:
        for step in range(per_thread):
            journal.put_steps(f"t{trial}", [{"type": "step", "phase": "rl", "step": step,
                                             "reward_mean": step / 10}])

    for trial in range(writers):
        threads.append(threading.Thread(target=write, args=(trial,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    out, _ = reader.communicate(timeout=90)
    reads, last = map(int, out.split())
    assert reads >= 1 and last == per_thread * writers  # the reader got in between writes
    rows = journal.query("SELECT trial_id, count(*) AS n FROM steps GROUP BY trial_id")
    assert sorted((r["trial_id"], r["n"]) for r in rows) == [(f"t{i}", 5) for i in range(3)]


def test_a_step_written_twice_is_kept_once_and_the_record_replaces_the_stream(tmp_path: Path):
    journal = Journal(tmp_path)
    journal.put_steps("t1", [{"phase": "rl", "step": 0, "reward_mean": 0.1},
                             {"phase": "rl", "step": 1, "reward_mean": 0.2}])
    journal.put_steps("t1", [{"phase": "rl", "step": 1, "reward_mean": 0.3}])  # redone
    assert [s["reward_mean"] for s in journal.steps("t1")] == [0.1, 0.3]
    journal.finish_trial("t1", step_entries=[{"phase": "rl", "step": 0, "reward_mean": 0.5}])
    assert [s["reward_mean"] for s in journal.steps("t1")] == [0.5]


def test_compare_finds_a_changed_number_and_ignores_the_clock(tmp_path):
    from autoresearch.study.compare import comparable, compare

    assert comparable('{"loss": 1.5, "time": 3.0, "seconds": 2}') == {"loss": 1.5}
    assert comparable("started from tinker://sess-1f2e:train:0/weights/final") == (
        "started from tinker://<session>:train:0/weights/final")
    assert comparable("tinker://sess-1f2e:train:1/weights/x") != comparable(
        "tinker://sess-1f2e:train:0/weights/x")  # the run and the name still count
    for name, loss, when in (("a", 0.5, 1.0), ("b", 0.5, 2.0), ("c", 0.25, 3.0)):
        journal = Journal(tmp_path / name)
        journal.init_study("s", {"name": "s"})
        journal.put_steps("t0001", [{"phase": "rl", "step": 0, "time": when, "loss": loss,
                                     "grad_norm": 1.0}])
    assert compare(tmp_path / "a", tmp_path / "b") == []  # only the clock differs
    differences = compare(tmp_path / "a", tmp_path / "c")
    assert {(d.table, d.field) for d in differences} == {("steps", "loss"), ("steps", "metrics")}
