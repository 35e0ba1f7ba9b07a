"""A user's own data end to end, as they would type it: a two-step trial trains on their
database's train split, and `autoresearch eval` scores the trial, the base model and a
checkpoint on DuckDB, SQLite and Spider-layout sources, printing and writing what it found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoresearch.cli import main
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.study.trial_cache import trial_key
from tests.sqltasks.source_fixtures import (
    BOOKSHOP_QUESTIONS,
    BOOKSHOP_SQL,
    bookshop_duckdb,
    bookshop_sqlite,
    spider_layout,
)

pytestmark = pytest.mark.timeout(600)
CONFIGS = Path(__file__).resolve().parents[2] / "autoresearch" / "configs"


def _trial_yaml(path: Path, model_dir: Path, tasks: dict) -> Path:
    config = {
        "name": "own-data", "base_model": str(model_dir), "tokenizer": str(model_dir),
        "lora_rank": 4, "seed": 1, "tasks": tasks,
        "sft": {"steps": 1, "batch_size": 2, "adam": {"learning_rate": 1e-3}},
        "rl": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 8,
               "drop_constant_groups": False},
        "eval": {"every": 0, "dev_tasks": 3, "test_tasks": 3, "max_tokens": 8},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_trial_trains_on_the_users_database_and_eval_scores_it(
        sql_model_dir, sql_server, tmp_path, capsys):
    shop = bookshop_duckdb(tmp_path / "shop.duckdb")
    tasks = {"source": "database", "path": str(BOOKSHOP_QUESTIONS), "databases": [str(shop)]}
    config = _trial_yaml(tmp_path / "trial.yaml", sql_model_dir, tasks)
    out = tmp_path / "trial"
    assert main(["trial", "--config", str(config), "--server-url", sql_server.url,
                 "--out", str(out)]) == 0
    record = TrialRecord(out)
    final = record.final()
    user_ids = {json.loads(line)["id"] for line in BOOKSHOP_QUESTIONS.read_text().splitlines()}
    assert set(final["dev"]["verdicts"]) <= user_ids and set(final["test"]["verdicts"]) <= user_ids
    loaded = [e for e in record.of_type("event") if "tasks from" in e["message"]]
    assert loaded and "36 of 36 questions kept" in loaded[0]["message"]
    capsys.readouterr()

    answer_path = tmp_path / "eval.json"
    assert main(["eval", "--trial", str(out), "--split", "test", "--server-url", sql_server.url,
                 "--out", str(answer_path)]) == 0
    printed = capsys.readouterr().out
    answer = json.loads(answer_path.read_text())
    assert answer["model"] == final["checkpoint"] and answer["split"] == "test"
    assert answer["accuracy"]["n"] == 7 == len(answer["samples"])  # the whole test split
    assert "accuracy" in printed and "95% CI" in printed and "executing" in printed
    assert "36 of 36 questions kept" in printed
    assert set(answer["per_tier"]) and 0 <= answer["execute_rate"] <= 1


def test_eval_scores_the_base_model_on_sqlite_and_spider_sources(
        sql_model_dir, sql_server, tmp_path, capsys):
    lite = bookshop_sqlite(tmp_path / "shop.sqlite")
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        '{"question": "How many books?", "sql": "SELECT count(*) FROM books"}\n'
        '{"question": "Broken", "sql": "SELECT nope FROM books"}\n'
        '{"question": "Titles", "sql": "SELECT title FROM books WHERE genre = \'poetry\'"}\n')
    common = ["--server-url", sql_server.url, "--base-model", str(sql_model_dir),
              "--tokenizer", str(sql_model_dir), "--max-tokens", "8"]
    out = tmp_path / "lite.json"
    assert main(["eval", "--database", str(lite), "--questions", str(questions),
                 "--split", "all", "--vote", "2", "--snap", "--out", str(out), *common]) == 0
    printed = capsys.readouterr().out
    answer = json.loads(out.read_text())
    assert answer["accuracy"]["n"] == 2
    assert answer["loaded"]["dropped"] == {"gold fails in SQLite": 1}
    assert answer["decoding"]["mode"] == "vote" and answer["decoding"]["snap_names"]
    assert "2 of 3 questions kept; dropped 1 (1 gold fails in SQLite)" in printed

    spider = spider_layout(tmp_path / "spider")
    out = tmp_path / "spider.json"
    assert main(["eval", "--spider", str(spider), "--split", "test", "--out", str(out),
                 *common]) == 0
    answer = json.loads(out.read_text())
    assert answer["accuracy"]["n"] == 2 and "spider" in answer["tasks_from"]


def test_the_shipped_configs_for_own_data_validate_and_key_caches_by_the_data(tmp_path):
    for name in ("own_database_study.yaml", "spider_study.yaml", "transfer_study.yaml"):
        text = (CONFIGS / name).read_text()
        assert "tasks:" in text, name
    from autoresearch.study.spec import Study

    study = Study.from_file(CONFIGS / "own_database_study.yaml")
    assert study.base_trial.tasks is not None
    assert study.base_trial.tasks.path.endswith("questions.jsonl")
    copy = tmp_path / "q.jsonl"
    copy.write_text(BOOKSHOP_QUESTIONS.read_text())
    config = TrialConfig.model_validate({"tasks": {
        "path": str(copy), "databases": [str(BOOKSHOP_SQL)]}})
    before = trial_key(config, "scope")
    assert trial_key(TrialConfig(), "scope") != before
    copy.write_text(copy.read_text().replace("Norway", "Chile"))
    assert trial_key(config, "scope") != before  # other data: the cached trial is not reused
    with pytest.raises(ValueError, match="names its database files"):
        TrialConfig.model_validate({"tasks": {"path": "q.jsonl"}})


def test_a_study_on_the_users_database_decides_on_dev_and_reads_test_once(
        sql_model_dir, tmp_path):
    from autoresearch.study.journal import Journal
    from autoresearch.study.runner import run_study
    from autoresearch.study.spec import Study
    from tests.autoresearch.study_helpers import tiny_trial

    declared = yaml.safe_load((CONFIGS / "own_database_study.yaml").read_text())
    tasks = {**declared["base_trial"]["tasks"], "path": str(BOOKSHOP_QUESTIONS),
             "databases": [str(bookshop_duckdb(tmp_path / "shop.duckdb"))]}
    study = Study.model_validate({
        **declared, "embedded_model": str(sql_model_dir), "reward_workers": 1,
        "base_trial": {**tiny_trial(sql_model_dir), "tasks": tasks},
        "warmup": {"sft": {"steps": 1, "batch_size": 2}, "checkpoint_every": 1,
                   "cache_dir": str(tmp_path / "warmups")},
        "budget": {"max_trials": 2, "confirm_seeds": 0},
        "executor": {"kind": "local", "max_parallel_trials": 2}})
    outcome = run_study(study, tmp_path / "study")
    ids = {json.loads(line)["id"] for line in BOOKSHOP_QUESTIONS.read_text().splitlines()}
    trials = [TrialRecord(d).final() for d in (outcome.directory / "trials").iterdir()]
    assert trials and all(set(f["dev"]["verdicts"]) <= ids and not f["test"] for f in trials)
    checks = [TrialRecord(d).final() for d in (outcome.directory / "final-test").iterdir()]
    assert checks and all(set(f["test"]["verdicts"]) <= ids for f in checks)
    dev_ids, test_ids = set(trials[0]["dev"]["verdicts"]), set(checks[0]["test"]["verdicts"])
    assert not dev_ids & test_ids
    journal = Journal(outcome.directory, read_only=True)
    reads = [e for e in journal.events() if e["kind"] == "test"]
    assert reads and all("test split read once" in e["message"] for e in reads)
    read_for = [e["message"].split(" for ")[1].split(":")[0] for e in reads]
    assert len(read_for) == len(set(read_for))  # each config's runs read test once
