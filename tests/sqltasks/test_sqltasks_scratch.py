"""The scratch database builds a task's database in a schema of its own and leaves nothing
behind, and building prompts beside the engine keeps the heap memory the engine keeps warm."""

import os
import time

import duckdb
import pytest

from server.engine.host_memory import keep_freed_memory, resident_bytes
from sqltasks import load_corpus, scratch
from sqltasks.prompt import _database_samples

SETUP = ("CREATE TABLE shops (id INTEGER PRIMARY KEY, name VARCHAR);\n"
         "INSERT INTO shops VALUES (1, 'a');")


def _schemas() -> set[str]:
    with scratch.built("SELECT 1") as cursor:
        current = cursor.execute("SELECT current_schema()").fetchone()[0]
        names = {row[0] for row in cursor.execute(
            "SELECT schema_name FROM duckdb_schemas() WHERE NOT internal").fetchall()}
    return names - {current}


def test_each_build_has_its_own_schema_and_drops_it():
    before = _schemas()
    with scratch.built(SETUP) as outer, scratch.built(SETUP.replace("'a'", "'b'")) as inner:
        assert outer.execute("SELECT name FROM shops").fetchall() == [("a",)]
        assert inner.execute("SELECT name FROM shops").fetchall() == [("b",)]
    assert _schemas() == before


def test_a_failing_setup_raises_and_leaves_no_schema():
    before = _schemas()
    with pytest.raises(duckdb.Error), scratch.built("CREATE TABLE t (x INTEGER); SELECT nope"):
        pass
    assert _schemas() == before
    with scratch.built(SETUP) as cursor:  # the scratch database still serves
        assert cursor.execute("SELECT count(*) FROM shops").fetchone() == (1,)


def test_building_sample_rows_leaves_freed_heap_memory_in_place(monkeypatch):
    """DuckDB trims the whole C heap when a database starts or closes and when a worker thread
    of it idles after a query: a prompt's sample rows built that way, in a process that hosts the
    engine, hand back the memory the engine keeps between steps and the next step faults it in
    again. Built in the one scratch database they must not: a freed 256 MiB block stays resident
    while eight databases not seen before are built, and for the half second after (DuckDB's
    worker flush delay)."""
    from server.scheduling import scheduler

    # Engines of servers other tests left running in this process give their kept memory back
    # after 30 s idle, by design; here only DuckDB's doing is measured.
    monkeypatch.setattr(scheduler, "release_freed_memory", lambda: False)
    monkeypatch.setattr(scheduler, "release_above_budget", lambda: False)
    assert keep_freed_memory()
    setups = list(dict.fromkeys(t.setup_sql for t in load_corpus("train", 0, corpus="multitable")))
    _database_samples.__wrapped__(setups[0], 2)  # the scratch database exists from here on
    time.sleep(1.0)  # any worker flush pending from earlier tests has happened
    block = bytearray(256 << 20)
    del block
    resident = resident_bytes()
    for setup in setups[1:9]:
        assert _database_samples.__wrapped__(setup, 2)
    time.sleep(1.5)
    assert resident - resident_bytes() < 64 << 20


def test_a_forked_child_builds_in_a_database_of_its_own():
    with scratch.built(SETUP):
        pass
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a build works, in a database that is not the parent's
        try:
            with scratch.built(SETUP) as cursor:
                ok = cursor.execute("SELECT count(*) FROM shops").fetchone() == (1,)
            os.write(writer, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(writer)
    assert os.read(reader, 1) == b"1"
    os.waitpid(pid, 0)
    with scratch.built(SETUP) as cursor:  # and the parent's still serves
        assert cursor.execute("SELECT count(*) FROM shops").fetchone() == (1,)
