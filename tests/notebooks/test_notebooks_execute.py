"""Every notebook runs top to bottom, headless, in its small-budget mode on a tiny model."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import duckdb
import nbformat
import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.ui.notebooks import has_outputs, is_report
from rewards.sandbox import Outcome
from rewards.score import CRASHED, GOLD_ERROR, NO_SQL
from sqltasks import load_corpus
from tests.notebooks.conftest import outputs, run_notebook, widget_states

pytestmark = pytest.mark.timeout(600)

OUTCOMES = {*(o.value for o in Outcome), NO_SQL, GOLD_ERROR, CRASHED}
"""What a score's `outcome` may say (`rewards.score.ScoreResult.outcome`)."""
ROW = re.compile(r'<tr class="ar-row[^"]*" data-trial="(t\d+)">.*?class="ar-badge (\w+)"', re.S)


def leaderboard_rows(nb: Any) -> list[tuple[str, str]]:
    """(trial, status) rows of the dashboard's leaderboard, as saved in the widget state."""
    tables = [s["state"]["value"] for s in widget_states(nb) if s["model_name"] == "HTMLModel"
              and 'class="ar-leaderboard"' in s["state"].get("value", "")]
    assert len(tables) == 1, "one dashboard, one leaderboard"
    return ROW.findall(tables[0])


def html_rows(table: str) -> dict[str, list[str]]:
    """A DataFrame's HTML: index label -> cell texts."""
    return {label: re.findall(r"<td>([^<]*)</td>", cells)
            for label, cells in re.findall(r"<tr>\s*<th>([^<]+)</th>(.*?)</tr>", table, re.S)}


def html_columns(table: str) -> dict[str, list[str]]:
    """A DataFrame's HTML: column name -> its cells' texts (unescaped), top to bottom."""
    head = re.search(r"<thead>(.*?)</thead>", table, re.S).group(1)
    names = [html.unescape(n) for n in re.findall(r"<th>([^<]*)</th>", head)][1:]  # index
    rows = [[html.unescape(c) for c in cells] for cells in html_rows(table).values()]
    return {name: [row[i] for row in rows] for i, name in enumerate(names)}


def test_rewards_notebook_scores_hand_written_predictions():
    nb = run_notebook("05_rewards.ipynb", small=True)
    default, compared = (html_rows(t) for t in outputs(nb, "text/html"))
    # format, parses, executes, result, columns, rows, overlap, length, schema (computed only
    # when weighted), total, correct, outcome
    gold = default["gold, fenced"]
    assert [float(v) for v in gold[:-2]] == [1.0] * 8 + [0.0, 1.1]
    assert gold[-2:] == ["True", "ok"]
    assert default["wrong filter"][3] == "0.0" and default["wrong filter"][-1] == "ok"
    assert default["unsafe"][-3:] == ["0.0", "False", "refused"]
    assert default["no SQL"][-1] == "no_sql"
    assert compared["wrong filter"] == ["0.1", "0.4"]  # partial credit pays near misses
    assert compared["unsafe"] == ["0.0", "0.0"]  # unsafe SQL earns nothing, whatever the weights
    assert "{'perm (default)': True, 'strict': False}" in "\n".join(outputs(nb))
    assert outputs(nb, "image/png"), "the components chart is drawn"


def test_quickstart_runs_one_trial_on_the_embedded_server_and_plots_it(tiny_model: Path,
                                                                      tmp_path: Path):
    nb = run_notebook("01_quickstart.ipynb", model=str(tiny_model), tokenizer=str(tiny_model),
                      small=True, workdir=str(tmp_path))
    assert re.search(r"dev accuracy \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] after 3 steps",
                     "\n".join(outputs(nb)))
    bars = [s["state"] for s in widget_states(nb) if s["model_name"] == "IntProgressModel"
            and s["state"].get("description") == "quickstart"]
    assert bars and bars[0]["value"] == bars[0]["max"] == 3  # the monitor saw every step
    assert outputs(nb, "image/png"), "the trial's curves are plotted"
    inspector = [s["state"]["value"] for s in widget_states(nb)
                 if "ar-sample" in str(s["state"].get("value", ""))]
    assert inspector and "gold" in inspector[0] and "component" in inspector[0]
    trials = list((tmp_path / "trials").iterdir())
    assert len(trials) == 1 and (trials[0] / "record.jsonl").exists()


@pytest.fixture(scope="module")
def study_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("notebook-runs")
    nb = run_notebook("02_autoresearch.ipynb", model=str(tiny_model),
                      tokenizer=str(tiny_model), small=True, workdir=str(workdir),
                      study_name="nb-study")
    return {"nb": nb, "dir": workdir / "studies" / "nb-study"}


def test_autoresearch_dashboard_state_holds_every_trial_of_the_journal(study_run):
    with duckdb.connect(str(study_run["dir"] / "journal.duckdb"), read_only=True) as db:
        journal = dict(db.execute("SELECT id, status FROM trials").fetchall())
        best = db.execute("SELECT best_trial FROM study").fetchone()[0]
    rows = leaderboard_rows(study_run["nb"])
    assert len(journal) == 3  # the small budget: the baseline and two proposals
    assert dict(rows) == journal
    assert set(journal.values()) <= {"kept", "discarded"}
    assert rows[0][0] == best or journal[rows[0][0]] == "discarded"  # ranked by dev accuracy
    states = widget_states(study_run["nb"])
    bars = [s["state"] for s in states if s["model_name"] == "IntProgressModel"
            and s["state"].get("description") == "trials"]
    assert bars[0]["value"] == bars[0]["max"] == 3
    values = [str(s["state"].get("value", "")) for s in states if s["model_name"] == "HTMLModel"]
    assert any("<svg" in v and "currentColor" in v for v in values), "theme-following curves"
    assert any("resident runs" in v for v in values), "server health"
    assert any("ar-study-report" in v and "Leaderboard (dev split)" in v for v in values)


def test_autoresearch_notebook_writes_the_report_back_and_renders_a_report_notebook(study_run):
    html = "\n".join(outputs(study_run["nb"], "text/html"))
    assert "Best config" in html and "best_config = TrialConfig.model_validate(" in html
    assert any("TrialConfig(name='nb-study-" in t for t in outputs(study_run["nb"]))
    report = nbformat.read(str(study_run["dir"] / "report.ipynb"), as_version=4)
    assert is_report(report) and has_outputs(report)
    assert "Leaderboard (dev split)" in "\n".join(outputs(report, "text/html"))
    assert outputs(report, "image/png")


def test_analysis_notebook_compares_trials_and_samples_the_best_checkpoint(study_run,
                                                                          tiny_model: Path):
    nb = run_notebook("03_analysis.ipynb", model=str(tiny_model), tokenizer=str(tiny_model),
                      small=True, study_dir=str(study_run["dir"]))
    text = "\n".join(outputs(nb))
    assert "vs baseline" in text and "pairs" in text
    assert outputs(nb, "image/png")
    with duckdb.connect(str(study_run["dir"] / "journal.duckdb"), read_only=True) as db:
        best, = db.execute("SELECT best_trial FROM study").fetchone()
        checkpoint, config = db.execute("SELECT checkpoint, config FROM trials WHERE id = ?",
                                        [best]).fetchone()
    sampling = next(c for c in nb.cells if "create_sampling_client(model_path=checkpoint)"
                    in c.source)
    assert [o["data"]["text/plain"] for o in sampling.outputs
            if o["output_type"] == "execute_result"] == [repr(checkpoint)], \
        "it samples the best trial's checkpoint"
    scoring = next(c for c in nb.cells if "sample_completions(" in c.source)
    table = "".join(o["data"]["text/html"] for o in scoring.outputs
                    if o["output_type"] == "execute_result")
    rows = html_columns(table)
    tasks = load_corpus("test", TrialConfig.model_validate_json(config).corpus_seed)[:4]
    assert len(rows["question"]) == len(tasks) == 4
    for shown, task in zip(rows["question"], tasks, strict=True):
        assert task.question.startswith(shown.removesuffix("...")), (shown, task.question)
    assert all(outcome in OUTCOMES for outcome in rows["outcome"])
    assert all(reward.replace(".", "", 1).isdigit() for reward in rows["reward"])


def test_remote_notebook_runs_a_study_against_the_server_in_the_environment(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tests.server.server_helpers import start_server

    server = start_server(tiny_model, tmp_path / "server-data", api_keys="tml-remote-key")
    try:
        monkeypatch.setenv("TINKER_BASE_URL", server.url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-remote-key")
        nb = run_notebook("04_remote.ipynb", small=True, tokenizer=str(tiny_model),
                          workdir=str(tmp_path), study_name="remote-nb")
    finally:
        server.stop()
    assert f"server {server.url} serves" in "\n".join(outputs(nb))
    rows = leaderboard_rows(nb)
    assert len(rows) == 2 and {status for _, status in rows} <= {"kept", "discarded"}
    assert not (tmp_path / "studies" / "remote-nb" / "server-data").exists()  # no embedded one


def test_the_quickstart_executed_twice_gives_the_same_numbers(tiny_model: Path, tmp_path: Path):
    """A shared notebook reproduces: the same seeds give the same bits on a re-run (the server
    is batch-invariant), in the trial's record and in every number the notebook prints."""
    from autoresearch.rl.record import TrialRecord
    from autoresearch.study.compare import comparable

    texts, records = [], []
    for run in ("first", "second"):
        workdir = tmp_path / run
        nb = run_notebook("01_quickstart.ipynb", model=str(tiny_model), tokenizer=str(tiny_model),
                          small=True, workdir=str(workdir))
        # printed numbers, less the clock's and the process's (durations, rates, times of day,
        # the server's port, objects' addresses)
        text = re.sub(r"\d+(\.\d+)? ?(s|seconds|tok/s|it/s|ms)\b|\d\d:\d\d(:\d\d)?|"
                      r"127\.0\.0\.1:\d+| at 0x[0-9a-f]+", "<clock>", "\n".join(outputs(nb)))
        texts.append(re.sub(re.escape(str(workdir)), "<dir>", text))
        [trial] = list((workdir / "trials").iterdir())
        record = TrialRecord(trial)
        records.append([comparable(e) for e in record.of_type("step") + record.of_type("eval")])
    assert records[0] and records[0] == records[1]
    assert texts[0] == texts[1]


def test_your_database_notebook_scores_trains_and_writes_the_study(tiny_model: Path,
                                                                   tmp_path: Path):
    from autoresearch.study.spec import Study
    from tests.sqltasks.source_fixtures import BOOKSHOP_QUESTIONS, bookshop_duckdb

    database = bookshop_duckdb(tmp_path / "shop.duckdb")
    nb = run_notebook("06_your_database.ipynb", model=str(tiny_model), tokenizer=str(tiny_model),
                      small=True, workdir=str(tmp_path / "runs"), database=str(database),
                      questions=str(BOOKSHOP_QUESTIONS))
    text = "\n".join(outputs(nb))
    assert "36 of 36 questions kept" in text and "{'train': 22, 'dev': 7, 'test': 7}" in text
    assert re.search(r"base model: dev \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] executing", text)
    assert re.search(r"after the trial: dev \d\.\d{3} \[", text)
    study_file = tmp_path / "runs" / "my_database_study.yaml"
    assert f"python -m autoresearch run {study_file}" in text
    study = Study.from_file(study_file)
    assert study.base_trial.tasks.databases == [str(database)]
    assert len(list((tmp_path / "runs" / "trials").iterdir())) == 1
