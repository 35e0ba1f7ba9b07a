"""The study's one read of the test split (and the transfer split beside it): for the runs
`confirmation.test_reads` names, each evaluated from its checkpoint on the same test tasks, with
the plan journaled first so that a resumed study finishes that read and never starts another.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import TrialResult
from autoresearch.study.confirmation import test_reads
from autoresearch.study.executors.base import TrialJob
from autoresearch.study.journal import Journal
from autoresearch.study.spec import Study

RunJob = Callable[[TrialJob], TrialResult]
"""Runs one evaluation job to its end (the runner holds the trial directory's lock)."""


def read_test_once(study: Study, journal: Journal, directory: Path, run: RunJob,
                   say: Callable[[str, str], None]) -> None:
    """Read the test split once, for the kept config's fresh re-runs, the base config's runs
    and the warm-up they forked from (`confirmation.test_reads`: whether RL beat the warm-up is
    measured on test too, with runs as the unit);
    `say(key, message)` tells the user, once, why a resume reads nothing new."""
    tasks = study.base_trial.eval.test_tasks
    best_id = journal.study()["best_trial"]
    if not tasks or best_id is None:
        return
    planned = [e for e in journal.events() if e["kind"] == "test plan"]
    if planned:
        # The split was (being) read for these; a resume finishes that read and never starts
        # another, whatever the best is now.
        ids = (planned[0]["data"] or {}).get("trials", [])
        if best_id not in ids:
            say("test-once", f"the test split was already read for {ids}; it is not read "
                f"again for {best_id}")
        contenders = [journal.trial(i) for i in ids]
    else:
        trials = journal.trials()
        contenders = test_reads(trials, best_id)
        journal.event("test plan", "the test split is read once, for "
                      + ", ".join(c["id"] for c in contenders),
                      trials=[c["id"] for c in contenders])
    jobs = []
    for row in contenders:
        if row.get("test") or not row.get("checkpoint"):
            continue
        config = TrialConfig.model_validate(row["config"]).with_changes({
            "name": f"{row['config']['name']}-test", "init_checkpoint": row["checkpoint"],
            "sft.steps": 0, "rl.steps": 0, "eval.every": 0, "eval.dev_tasks": 0,
            "eval.test_tasks": tasks, "eval.baseline": False,
            "eval.transfer_tasks": study.base_trial.eval.transfer_tasks})
        jobs.append((row["id"], TrialJob(f"{row['id']}-test", config,
                                         (directory / "final-test" / row["id"]).resolve())))
    # The reads run side by side (the server decodes them in shared batches, each run's bits
    # its own) and are journaled in the plan's order, each on its own: one that fails is
    # reported and leaves the others' results standing; a resume reads only what is missing.
    width = max(1, min(len(jobs), study.executor.max_parallel_trials))
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="test-read") as pool:
        futures = [(trial_id, job, pool.submit(run, job)) for trial_id, job in jobs]
        for trial_id, job, future in futures:
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - a failed check is reported, not fatal
                journal.event("test", f"final test check of {trial_id} failed: "
                              f"{type(exc).__name__}: {exc}", trial_id)
                continue
            acc = (result.test or {}).get("accuracy") or {}
            journal.update_trial(
                trial_id, test=result.test, test_accuracy=acc.get("value"),
                test_low=acc.get("low"), test_high=acc.get("high"), test_n=acc.get("n"))
            journal.event("test", f"test split read once for {trial_id}: accuracy "
                          f"{acc.get('value')} on {acc.get('n')} tasks", trial_id)
            journal_transfer(journal, trial_id, job.directory)


def journal_transfer(journal: Journal, trial_id: str, directory: Path) -> None:
    """The transfer split, read in the same single check as test (databases no corpus has):
    journaled as a `transfer` event with its accuracy and executing rate."""
    final = TrialRecord(directory).final() or {}
    transfer = final.get("transfer")
    if not transfer:
        return
    acc = transfer["accuracy"]
    journal.event(
        "transfer", f"transfer split read once for {trial_id}: accuracy {acc['value']:.3f} "
        f"[{acc['low']:.3f}, {acc['high']:.3f}], executing {transfer['execute_rate']:.3f}, "
        f"on {acc['n']} tasks", trial_id, accuracy=acc,
        execute_rate=transfer["execute_rate"], verdicts=transfer["verdicts"])
