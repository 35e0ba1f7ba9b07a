"""The Kubernetes executor against a fake API server, through the official client: one Job per
trial made from the shipped template, results read back, failures recorded, Jobs re-attached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.trial import TrialResult
from autoresearch.study.executors.base import result_line
from autoresearch.study.executors.kubernetes import KubernetesExecutor
from autoresearch.study.journal import Journal
from autoresearch.study.runner import resume_study, run_study
from autoresearch.study.spec import Study, WarmupSpec
from tests.autoresearch.study_helpers import draw, summary
from tools.rehearsal.kube_api import FakeKube

TEMPLATE = (Path(__file__).resolve().parents[2]
            / "deploy/gke/overlays/study-job/trial-job.yaml")
IMAGE = "registry.example/autoresearch/runner:1.2.3"
SERVER = "http://autoresearch-api:8000"


def pod_behaviour(job: dict[str, Any]) -> tuple[bool, str]:
    """What the trial pod does: read its config from the annotation, print the result line."""
    pod = job["spec"]["template"]
    config = TrialConfig.model_validate(
        yaml.safe_load(pod["metadata"]["annotations"]["autoresearch.dev/trial-config"]))
    if config.rl.adam.learning_rate > 5e-4:
        return False, "Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n"
    p = 0.3 + 500 * config.rl.adam.learning_rate
    result = TrialResult(Path("/results"), summary("dev", draw(config, "dev", p, 32)),
                         summary("test", draw(config, "test", p, 32)), 3, 1234, 5.0,
                         "tinker://run/weights/final")
    return True, f"trial: 100%|##########| 3/3\n{{}}\n{result_line(result)}\n"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeKube(pod_behaviour)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(fake.kubeconfig()))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("AUTORESEARCH_RUNNER_IMAGE", IMAGE)
    yield fake
    fake.close()


def _study(**budget: Any) -> Study:
    return Study(
        name="kube", server_url=SERVER,
        search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
        budget={"confirm_seeds": 0, **budget},
        executor={"kind": "kubernetes", "job_template": str(TEMPLATE), "max_parallel_trials": 2,
                  "poll_seconds": 0.05})


def test_each_trial_runs_once_as_a_job_made_from_the_shipped_template(fake, tmp_path: Path):
    out = tmp_path / "study"
    run_study(_study(max_trials=4), out)
    journal = Journal(out, read_only=True)
    trials = journal.trials()
    assert sorted(fake.created) == [f"kube-{t['id']}" for t in trials]  # one Job per trial
    # Finished Jobs are deleted once their results are journaled.
    assert sorted(fake.deleted) == sorted(fake.created) and not fake.jobs
    for trial in trials:
        if trial["status"] == "crashed":  # a failed Job: its log is the error
            assert "CUDA out of memory" in trial["error"]
        else:  # the result line of the pod's log
            assert trial["dev_n"] == 32 and trial["tokens"] == 1234 and trial["steps"] == 3
    assert any(t["status"] != "crashed" for t in trials)
    assert all(ns == "autoresearch" for ns, _ in fake.pods)  # the kubeconfig's namespace


def test_the_job_manifest_carries_config_image_server_and_output_directory(fake, tmp_path):
    executor = KubernetesExecutor("kube", _study().executor, SERVER)
    from autoresearch.study.executors.base import TrialJob

    config = TrialConfig().with_changes({"name": "kube-t0007", "rl.adam.learning_rate": 2e-4})
    body = executor.manifest(TrialJob("t0007", config, tmp_path / "trials/t0007"))
    template = yaml.safe_load(TEMPLATE.read_text())
    assert body["metadata"]["name"] == "kube-t0007"
    pod = body["spec"]["template"]
    for labels in (body["metadata"]["labels"], pod["metadata"]["labels"]):
        assert labels["autoresearch.dev/study"] == "kube"
        assert labels["autoresearch.dev/trial"] == "t0007"
    annotation = pod["metadata"]["annotations"]["autoresearch.dev/trial-config"]
    assert TrialConfig.model_validate(yaml.safe_load(annotation)) == config
    container = pod["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["args"][:2] == ["trial", "--config=/config/trial.yaml"]
    assert f"--server-url={SERVER}" in container["args"]
    assert f"--out={tmp_path / 'trials/t0007'}" in container["args"]
    assert sum(a.startswith("--server-url") for a in container["args"]) == 1
    # Everything else is the template's, untouched.
    assert pod["spec"]["securityContext"] == template["spec"]["template"]["spec"]["securityContext"]
    assert pod["spec"]["volumes"] == template["spec"]["template"]["spec"]["volumes"]
    assert body["spec"]["backoffLimit"] == template["spec"]["backoffLimit"]
    assert executor.namespace == "autoresearch"  # from the kubeconfig context


class CrashAfterCreate(KubernetesExecutor):
    """Dies (as the study process would) right after creating the Job of `victim`."""

    victim = "t0002"

    def _stream(self, job, on_step, seen):
        if job.id == self.victim:
            raise KeyboardInterrupt
        return super()._stream(job, on_step, seen)


def test_a_resumed_study_re_attaches_to_the_running_job_instead_of_starting_it_again(
        fake, tmp_path: Path):
    out = tmp_path / "study"
    study = _study(max_trials=3)
    fake.run_seconds = 0.5
    with pytest.raises(KeyboardInterrupt):
        run_study(study, out, executor=CrashAfterCreate("kube", study.executor, SERVER))
    assert "kube-t0002" in fake.created
    resume_study(out)
    assert fake.created.count("kube-t0002") == 1
    assert fake.create_attempts.count("kube-t0002") == 2  # the second create found it: attach
    trial = Journal(out, read_only=True).trial("t0002")
    assert trial["status"] in ("kept", "discarded") and trial["attempts"] == 2


def test_the_warmup_is_a_job_of_its_own_and_a_second_study_reuses_it(
        fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    asked: list[str] = []

    def exists(url: str, key: str, path: str) -> bool:
        asked.append(path)
        return True  # the server still holds it

    monkeypatch.setattr("autoresearch.study.runner.remote_checkpoint_exists", exists)

    def study(name: str) -> Study:
        return _study(max_trials=2).model_copy(update={
            "name": name, "warmup": WarmupSpec(sft={"steps": 3, "batch_size": 4},
                                               cache_dir=str(tmp_path / "cache"))})

    run_study(study("kube"), tmp_path / "a")
    assert fake.created[0] == "kube-warmup"  # first, and alone: trials need its checkpoint
    journal = Journal(tmp_path / "a", read_only=True)
    assert journal.trial("warmup")["checkpoint"] == "tinker://run/weights/final"
    for trial in journal.trials()[1:]:
        assert trial["config"]["init_checkpoint"] == "tinker://run/weights/final"

    run_study(study("kube2"), tmp_path / "b")
    assert "kube2-warmup" not in fake.created  # reused: the server still holds it
    assert asked == ["tinker://run/weights/final"]
    # trained again: nothing but its trials; the test check then reads the reused warm-up
    # beside them (an evaluation job, no training)
    assert sorted(c for c in fake.created if c.startswith("kube2-")) == [
        "kube2-t0001", "kube2-t0002", "kube2-warmup-test"]


def test_a_pruned_trial_s_job_is_deleted(fake, tmp_path: Path):
    from autoresearch.rl.record import TrialRecord
    from autoresearch.study.executors.base import TrialJob
    from autoresearch.study.pruning import TrialPruned

    fake.run_seconds = 5.0
    executor = KubernetesExecutor("kube", _study().executor, SERVER)
    directory = tmp_path / "trials/t0003"
    TrialRecord(directory).append("eval", stage="rl-2", split="dev", step=2,
                                  accuracy={"value": 0.0, "n": 24})

    def on_step(entry):
        if entry["type"] == "eval":
            raise TrialPruned("pruned at RL step 2", 2)

    with pytest.raises(TrialPruned):
        executor.run(TrialJob("t0003", TrialConfig(), directory), on_step)
    assert fake.deleted == ["kube-t0003"]
