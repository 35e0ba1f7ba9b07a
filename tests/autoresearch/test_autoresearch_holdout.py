"""`autoresearch holdout`: the one command that scores the frozen split, every read appended to
its ledger with the split's hash, the code's version and the result."""

from __future__ import annotations

import json

import pytest

from autoresearch.cli import main
from sqltasks.holdout.split import content_hash

pytestmark = pytest.mark.timeout(600)


def test_each_read_of_the_held_out_split_is_appended_to_its_ledger(
        sql_model_dir, sql_server, tmp_path, capsys):
    ledger = tmp_path / "ledger.jsonl"
    common = ["holdout", "--server-url", sql_server.url, "--base-model", str(sql_model_dir),
              "--tokenizer", str(sql_model_dir), "--max-tokens", "8", "--ledger", str(ledger)]
    assert main([*common, "--note", "first look"]) == 0
    printed = capsys.readouterr().out
    assert "read 0 time(s) before" in printed and "frozen held-out split" in printed
    assert "appended to" in printed and "read 1" in printed
    assert main(common) == 0
    assert "read 1 time(s) before" in capsys.readouterr().out
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["split_hash"] == content_hash() and first["note"] == "first look"
    assert first["accuracy"]["n"] == 30 and 0.0 <= first["accuracy"]["value"] <= 1.0
    assert first["command"][:2] == ["autoresearch", "holdout"]
    assert first["model"] == str(sql_model_dir) and "execute_rate" in first
