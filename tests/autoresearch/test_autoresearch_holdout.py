"""`autoresearch holdout`: the one command that scores the frozen split. Every read is appended
to a hash-chained ledger with the split's hash, the commit and the aggregate result; reads
from a dirty tree, past a recipe's budget or over an edited ledger are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch.cli import main
from autoresearch.rl import holdout_ledger
from autoresearch.rl.config import TrialConfig
from sqltasks.holdout.split import content_hash

pytestmark = pytest.mark.timeout(600)
COMMIT = "0" * 40


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch) -> Path:
    """A ledger of the test's own, read from a clean commit."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setattr(holdout_ledger, "ledger_path", lambda: path)
    monkeypatch.setattr(holdout_ledger, "code_version", lambda: COMMIT)
    return path


def test_each_read_is_chained_to_the_ledger_and_a_recipe_has_a_read_budget(
        sql_model_dir, sql_server, ledger: Path, capsys):
    common = ["holdout", "--server-url", sql_server.url, "--base-model", str(sql_model_dir),
              "--tokenizer", str(sql_model_dir), "--max-tokens", "8"]
    assert main([*common, "--note", "first look"]) == 0
    printed = capsys.readouterr().out
    assert "read 0 time(s) before" in printed and "frozen held-out split" in printed
    assert f"3 of {holdout_ledger.READS_PER_RECIPE} reads left" in printed
    assert "appended to" in printed and "read 1" in printed
    # a vote or another token limit is another way of reading the same recipe
    assert main([*common, "--vote", "2"]) == 0
    assert "read 1 time(s) before" in capsys.readouterr().out
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["split_hash"] == content_hash() and first["note"] == "first look"
    assert first["accuracy"]["n"] == 30 and 0.0 <= first["accuracy"]["value"] <= 1.0
    assert first["command"][:2] == ["autoresearch", "holdout"]
    assert first["model"] == str(sql_model_dir) and "execute_rate" in first
    assert first["code"] == COMMIT and first["recipe"] == lines[1]["recipe"]
    # aggregates only: nothing says which questions a model got right
    assert set(first) == {"time", "command", "split_hash", "code", "recipe", "model", "accuracy",
                          "execute_rate", "parse_rate", "per_tier", "decoding", "note", "prev"}
    assert "verdicts" not in ledger.read_text() and "holdout-library" not in ledger.read_text()
    assert main(common) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit, match="has had its 3 reads"):
        main(common)
    assert len(ledger.read_text().splitlines()) == 3


def test_a_read_from_uncommitted_code_is_refused_before_scoring(ledger: Path, monkeypatch):
    monkeypatch.setattr(holdout_ledger, "code_version", lambda: COMMIT + "+changes")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        main(["holdout", "--server-url", "http://127.0.0.1:9", "--base-model", "x"])
    monkeypatch.setattr(holdout_ledger, "code_version", lambda: None)
    with pytest.raises(SystemExit, match="only from a git checkout"):
        main(["holdout", "--server-url", "http://127.0.0.1:9", "--base-model", "x"])
    assert not ledger.exists()


def _read(note: str) -> dict:
    return {"note": note, "accuracy": {"value": 0.1}, "recipe": "r"}


def test_an_edited_dropped_or_hand_added_line_breaks_the_chain(tmp_path: Path):
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({"note": "written before the chain"}) + "\n")
    for note in ("a", "b", "c"):
        holdout_ledger.append(_read(note), path)
    assert [r["note"] for r in holdout_ledger.reads(path)] == [
        "written before the chain", "a", "b", "c"]
    good = path.read_text()
    lines = good.splitlines(keepends=True)

    path.write_text(good.replace('"value": 0.1', '"value": 0.9', 1))
    with pytest.raises(holdout_ledger.LedgerRefused, match="line 3 does not chain"):
        holdout_ledger.reads(path)
    path.write_text("".join(lines[:2] + lines[3:]))  # a read dropped
    with pytest.raises(holdout_ledger.LedgerRefused, match="does not chain"):
        holdout_ledger.reads(path)
    path.write_text(good + json.dumps(_read("by hand")) + "\n")
    with pytest.raises(holdout_ledger.LedgerRefused, match="added by hand"):
        holdout_ledger.append(_read("d"), path)
    path.write_text(good[:-5])
    with pytest.raises(holdout_ledger.LedgerRefused, match="partial line"):
        holdout_ledger.reads(path)


def test_the_recipe_is_the_training_config_less_its_seed_and_how_it_is_read():
    base = TrialConfig()
    same = base.with_changes({"seed": 7, "eval.vote": 8, "eval.snap_names": True})
    other = base.with_changes({"rl.group_size": 4})
    assert holdout_ledger.recipe_key(base) == holdout_ledger.recipe_key(same)
    assert holdout_ledger.recipe_key(base) != holdout_ledger.recipe_key(other)
    assert (holdout_ledger.recipe_key(base, "tinker://a/weights/x")
            != holdout_ledger.recipe_key(base, "tinker://b/weights/x"))


def test_the_shipped_ledger_is_intact():
    assert len(holdout_ledger.reads()) >= 5
