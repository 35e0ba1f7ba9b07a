"""Proposers: the offline one (Optuna), and the LLM researcher through the real `openai` and
`google-genai` SDKs against scripted endpoints: valid answers, invalid answers repaired,
timeouts, and the fallback, all journaled the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.study.journal import Journal
from autoresearch.study.proposers import Context, LLMResearcher, OptunaProposer, make_proposer
from autoresearch.study.proposers.backends import OpenAIBackend
from autoresearch.study.runner import run_study
from autoresearch.study.space import SearchSpace, config_key
from autoresearch.study.spec import ProposerSpec, Study
from tests.autoresearch.fake_llm import SLOW, FakeGemini, Script, openai_transport
from tests.autoresearch.study_helpers import SyntheticExecutor

SPACE = {"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
         "rl.group_size": {"low": 2, "high": 16},
         "rl.advantage": {"choices": ["mean", "zscore"]},
         "reward.weights.rows": {"low": 0.0, "high": 0.5}}
SECRET = "sk-test-do-not-journal"


def _space() -> SearchSpace:
    return Study(search_space=SPACE).space()


def _row(number: int, changes: dict[str, Any], status: str = "discarded",
         dev: float | None = 0.3) -> dict[str, Any]:
    config = _space().base.with_changes(changes)
    return {"id": f"t{number:04d}", "number": number, "role": "explore", "status": status,
            "changes": changes, "config_key": config_key(config), "dev_accuracy": dev,
            "dev_low": 0.1, "dev_high": 0.5, "dev_n": 64, "rationale": "why not",
            "decision": None, "error": None}


def _answer(*trials: tuple[str, dict[str, Any]]) -> str:
    return json.dumps({"trials": [{"hypothesis": h, "changes": c} for h, c in trials]})


GOOD = _answer(("A larger learning rate speeds up RL on this small adapter.",
                {"rl.adam.learning_rate": 3e-4, "rl.advantage": "zscore"}))
OUT_OF_BOUNDS = _answer(("Very large learning rate.", {"rl.adam.learning_rate": 0.5}))


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GEMINI_API_KEY", SECRET)


# ------------------------------------------------------------------ offline
def test_optuna_proposals_stay_in_bounds_are_new_and_depend_only_on_the_journal():
    space = _space()
    history = [_row(1, {}, "kept", 0.25), _row(2, {"rl.adam.learning_rate": 2e-4}),
               _row(3, {"rl.group_size": 4}, "crashed", None), _row(4, {}, "running", None)]
    history[0]["role"] = "baseline"
    context = Context(space, history)
    for sampler in ("tpe", "random"):
        first = OptunaProposer(sampler, seed=7, startup_trials=2).propose(context, 5)
        again = OptunaProposer(sampler, seed=7, startup_trials=2).propose(context, 5)
        other = OptunaProposer(sampler, seed=8, startup_trials=2).propose(context, 5)
        assert first.outcome == "sampled" and len(first.proposals) == 5
        assert [p.changes for p in first.proposals] == [p.changes for p in again.proposals]
        assert [p.changes for p in first.proposals] != [p.changes for p in other.proposals]
        keys = {config_key(space.base.with_changes(p.changes)) for p in first.proposals}
        assert len(keys) == 5 and not keys & {h["config_key"] for h in history}
        for p in first.proposals:
            assert space.validate(p.changes)[0] == p.changes and p.rationale
            assert set(p.changes) <= set(SPACE)


def test_the_offline_proposer_stops_when_the_space_is_exhausted():
    study = Study(search_space={"rl.advantage": {"choices": ["mean", "zscore"]}})
    context = Context(study.space(), [_row(1, {})])
    batch = OptunaProposer("tpe", seed=0).propose(context, 3)
    assert [p.changes for p in batch.proposals] == [{"rl.advantage": "zscore"}]


# ------------------------------------------------------------ OpenAI-style
def _openai(script: Script, timeout: float = 5.0) -> LLMResearcher:
    client = httpx.Client(transport=openai_transport(script))
    backend = OpenAIBackend("qwen3-8b", base_url="http://vllm.local/v1", timeout_s=timeout,
                            http_client=client)
    return LLMResearcher(backend, OptunaProposer("tpe", seed=0), max_attempts=3)


def test_openai_compatible_researcher_returns_validated_trials_with_hypotheses(keys):
    script = Script([GOOD])
    batch = _openai(script).propose(Context(_space(), [_row(1, {})]), 1)
    assert batch.outcome == "valid" and batch.attempts == 1 and batch.proposer == "openai:qwen3-8b"
    assert batch.proposals[0].changes == {"rl.adam.learning_rate": 3e-4, "rl.advantage": "zscore"}
    assert batch.proposals[0].rationale.startswith("A larger learning rate")
    request = script.requests[0]
    assert request["model"] == "qwen3-8b"
    schema = request["response_format"]["json_schema"]["schema"]
    changes = schema["properties"]["trials"]["items"]["properties"]["changes"]
    assert changes["properties"]["rl.adam.learning_rate"]["maximum"] == 1e-3
    assert "t0001" in request["messages"][1]["content"]  # the researcher reads the journal
    assert script.headers[0]["authorization"] == f"Bearer {SECRET}"


def test_an_invalid_answer_is_sent_back_for_repair(keys):
    script = Script([OUT_OF_BOUNDS, "not json at all", GOOD])
    batch = _openai(script).propose(Context(_space(), []), 1)
    assert batch.outcome == "repaired" and batch.attempts == 3
    assert "outside" in batch.errors[0] and "not JSON" in batch.errors[1]
    repair = script.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": OUT_OF_BOUNDS}
    assert "rl.adam.learning_rate" in repair[-1]["content"]


def test_repeated_configurations_and_unknown_fields_are_rejected(keys):
    repeat = _answer(("Again.", {"rl.adam.learning_rate": 2e-4}))
    unknown = _answer(("Bigger model.", {"base_model": "gemma-3-27b"}))
    script = Script([repeat, unknown, GOOD])
    batch = _openai(script).propose(
        Context(_space(), [_row(1, {"rl.adam.learning_rate": 2e-4})]), 1)
    assert batch.outcome == "repaired"
    assert "already tried" in batch.errors[0] and "not in the search space" in batch.errors[1]


def test_timeouts_are_retried_then_the_offline_proposer_takes_over(keys):
    script = Script([SLOW, SLOW, SLOW])
    batch = _openai(script, timeout=0.5).propose(Context(_space(), []), 2)
    assert batch.outcome == "fallback" and len(script.requests) == 3
    assert all("Timeout" in e for e in batch.errors)
    assert batch.proposer.startswith("optuna-tpe (fallback from openai:qwen3-8b)")
    assert len(batch.proposals) == 2


def test_a_missing_key_falls_back_without_sending_anything(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    script = Script([GOOD])
    client = httpx.Client(transport=openai_transport(script))
    researcher = LLMResearcher(OpenAIBackend("gpt-5", http_client=client),
                               OptunaProposer("random", seed=0), max_attempts=2)
    batch = researcher.propose(Context(_space(), []), 1)
    assert batch.outcome == "fallback" and script.requests == []
    assert "OPENAI_API_KEY" in batch.errors[0]


# ------------------------------------------------------------------- Gemini
@pytest.fixture
def gemini() -> Any:
    servers: list[FakeGemini] = []

    def start(answers: list[Any]) -> FakeGemini:
        servers.append(FakeGemini(Script(answers)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_gemini_researcher_uses_structured_output_and_the_key_from_the_environment(keys, gemini):
    fake = gemini([GOOD])
    spec = ProposerSpec(kind="gemini", model="gemini-2.5-flash", base_url=fake.url, timeout_s=5)
    batch = make_proposer(spec).propose(Context(_space(), []), 1)
    assert batch.outcome == "valid" and batch.proposer == "gemini:gemini-2.5-flash"
    request = fake.script.requests[0]
    assert request["_path"].endswith("/models/gemini-2.5-flash:generateContent")
    config = request["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert "trials" in config["responseJsonSchema"]["properties"]
    assert "researcher" in request["systemInstruction"]["parts"][0]["text"]
    assert fake.script.headers[0]["x-goog-api-key"] == SECRET


def test_gemini_invalid_answer_is_repaired(keys, gemini):
    fake = gemini(['{"trials": [{"changes": {}}]}', GOOD])
    spec = ProposerSpec(kind="gemini", base_url=fake.url, timeout_s=5)
    batch = make_proposer(spec).propose(Context(_space(), []), 1)
    assert batch.outcome == "repaired" and "missing hypothesis" in batch.errors[0]
    assert [c["role"] for c in fake.script.requests[1]["contents"]] == ["user", "model", "user"]


def test_gemini_timeouts_are_bounded_and_fall_back(keys, gemini):
    fake = gemini([SLOW, SLOW])
    spec = ProposerSpec(kind="gemini", base_url=fake.url, timeout_s=0.5, max_attempts=2,
                        fallback="random")
    # The fake never answers: the proposer returns only because its own timeout fires.
    batch = make_proposer(spec).propose(Context(_space(), []), 1)
    assert batch.outcome == "fallback" and batch.proposer.startswith("random (fallback")
    assert len(batch.errors) == 2 and len(batch.proposals) == 1


def test_a_study_journals_llm_proposals_and_their_outcome_but_never_the_key(keys, gemini,
                                                                            tmp_path: Path):
    fake = gemini([GOOD, OUT_OF_BOUNDS, "{}", "[]"])  # then timeouts: the fallback proposes
    study = Study(name="llm", search_space=SPACE, budget={"max_trials": 3, "confirm_seeds": 0},
                  proposer={"kind": "gemini", "base_url": fake.url, "timeout_s": 0.5})
    run_study(study, tmp_path, executor=SyntheticExecutor(lambda c: 0.4))
    journal = Journal(tmp_path, read_only=True)
    proposals = journal.proposals()
    assert [p["outcome"] for p in proposals] == ["declared", "valid", "fallback"]
    assert proposals[2]["attempts"] == 3 and len(proposals[2]["errors"]) == 3
    trials = journal.trials()
    assert trials[1]["proposer"] == "gemini:gemini-2.5-flash"
    assert trials[1]["rationale"].startswith("A larger learning rate")
    assert trials[2]["proposer"].startswith("optuna-tpe (fallback from gemini")
    assert TrialConfig.model_validate(trials[1]["config"]).rl.adam.learning_rate == 3e-4
    assert SECRET.encode() not in journal.path.read_bytes()


def _dev(accuracy: float, failures: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    samples = [{"task": f"dev-{i:03d}", "tier": "hard", "question": "How many orders? " * 50,
                "completion": sql, "sql": sql, "correct": False, "outcome": outcome,
                "error": error} for i, (sql, outcome, error) in enumerate(failures)]
    samples.append({"task": "dev-999", "tier": "easy", "question": "q", "completion": "ok",
                    "sql": "SELECT 1", "correct": True, "outcome": "ok", "error": None})
    return {"accuracy": {"value": accuracy, "low": 0.1, "high": 0.5, "n": 64},
            "per_tier": {"easy": {"value": 0.61, "low": 0.4, "high": 0.8, "n": 20},
                         "hard": {"value": 0.07, "low": 0.0, "high": 0.2, "n": 44}},
            "components": {"executes": 0.72, "result": accuracy, "format": 0.98},
            "samples": samples}


def test_the_researcher_sees_tiers_reward_components_and_failures_of_best_and_latest(keys):
    best = {**_row(1, {}, status="kept", dev=0.31),
            "dev": _dev(0.31, [("SELECT * FROM ordrs", "unknown_table",
                                "Catalog Error: Table with name ordrs does not exist! " * 40)])}
    latest = {**_row(2, {"rl.group_size": 12}, dev=0.22),
              "dev": _dev(0.22, [(f"SELECT count(*) FROM orders WHERE id > {i}", "wrong_result",
                                  None) for i in range(8)])}
    script = Script([GOOD])
    _openai(script).propose(Context(_space(), [best, latest], best), 1)
    prompt = script.requests[0]["messages"][1]["content"]
    details = prompt[prompt.index("Dev evaluation details"):]
    assert "t0001" in details and "t0002" in details
    assert "per tier: easy 0.61 (n=20), hard 0.07 (n=44)" in details
    assert "reward components (mean): executes 0.72, format 0.98" in details
    assert "unknown_table" in details and "Table with name ordrs does not exist" in details
    assert "FROM orders WHERE id > 2" in details and "id > 3" not in details  # 3 per trial
    assert "dev-999" not in details  # only failures
    assert len(details) < 3000  # bounded, whatever the errors and questions hold
