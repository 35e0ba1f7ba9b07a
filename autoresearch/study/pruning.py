"""Multi-fidelity search: losing trials stop early, through Optuna's pruners.

Trials score the study's fixed dev subset every `pruning.every` RL steps (the `rl-<k>` evals of
their records). Each score is reported to an in-process Optuna study, one Optuna trial per study
trial, at step k (RL steps done), and the pruner (successive halving, ASHA-style, or Hyperband)
says whether the trial would be promoted. Intermediate scores on a few dozen tasks are noisy, so
a pruner's "stop" is obeyed only when the trial is also behind the best score any other trial
reached at the same step by more than `margin_z` standard errors of a difference of two
accuracies on that subset (`NoiseMarginPruner`); otherwise the search would prune its best
candidates by chance. Each run also has luck of its own, shared by all its tasks: the standard
error includes the run-to-run variance of both runs, from `pruning.run_sd` until the study's
seed bank has measured its own (`StudyPruning.set_run_sd`).

Only explored candidates are ever pruned. The baseline and the keep rule's confirmation re-runs
report their scores (they are what candidates are compared with) but always run to the end: a
decision needs whole runs. A pruned trial is journaled as `pruned`, with the step it reached,
and is never a candidate for keeping; its unspent steps stay in the study's step budget.

The Optuna study lives in memory only: a resumed study rebuilds it from the journal's evals,
in the order the trials finished.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import optuna
from optuna.pruners import BasePruner, HyperbandPruner, SuccessiveHalvingPruner
from optuna.trial import FrozenTrial, TrialState

from autoresearch.study.executors.base import TrialStopped
from autoresearch.study.spec import PruningSpec

optuna.logging.set_verbosity(optuna.logging.WARNING)

PRUNABLE_ROLES = ("explore",)
REPORTING_ROLES = ("baseline", "explore", "confirm")


class TrialPruned(TrialStopped):
    """The study's pruner stopped the trial: it was behind beyond noise at an equal step."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class NoiseMarginPruner(BasePruner):
    """Prunes only when `inner` would and the trial trails the best score at the same step by
    more than `margin_z` standard errors of the difference: binomial (accuracies on `n` tasks,
    smoothed so a score of 0 still has a width) plus each run's own luck (`run_sd`, the SD of
    a run's accuracy between seeds)."""

    def __init__(self, inner: BasePruner, n: int, margin_z: float, run_sd: float = 0.0):
        self.inner = inner
        self.n = n
        self.margin_z = margin_z
        self.run_sd = run_sd
        self.last: dict[int, dict[str, float]] = {}
        """Per Optuna trial number: the numbers of its latest pruning decision."""

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        if not self.inner.prune(study, trial):
            return False
        value = trial.intermediate_values[step]
        others = [t.intermediate_values[step] for t in study.get_trials(deepcopy=False)
                  if t.number != trial.number and step in t.intermediate_values]
        if not others:
            return False
        best = max(others)
        margin = self.margin_z * _se_difference(best, value, self.n, self.run_sd)
        self.last[trial.number] = {"step": step, "value": value, "best": best,
                                   "margin": margin, "n": self.n, "run_sd": self.run_sd}
        return best - value > margin


def _se_difference(p: float, q: float, n: int, run_sd: float = 0.0) -> float:
    def var(x: float) -> float:
        s = (x * n + 1) / (n + 2)  # add-one smoothing: 0/24 is not a certainty
        return s * (1 - s) / n

    return math.sqrt(var(p) + var(q) + 2 * run_sd**2)


def make_pruner(spec: PruningSpec, n: int, max_resource: int,
                run_sd: float | None = None) -> BasePruner | None:
    if spec.kind == "none":
        return None
    if spec.kind == "successive_halving":
        inner: BasePruner = SuccessiveHalvingPruner(min_resource=spec.min_resource,
                                                    reduction_factor=spec.reduction_factor)
    else:
        inner = HyperbandPruner(min_resource=spec.min_resource, max_resource=max_resource,
                                reduction_factor=spec.reduction_factor)
    return NoiseMarginPruner(inner, n, spec.margin_z,
                             spec.run_sd if run_sd is None else run_sd)


class StudyPruning:
    """The study's pruning state: which Optuna trial stands for which study trial."""

    def __init__(self, spec: PruningSpec, n: int, max_resource: int, rounds: bool = False,
                 run_sd: float | None = None):
        self.spec = spec
        self._n, self._max_resource = n, max_resource
        self.run_sd = spec.run_sd if run_sd is None else run_sd
        """The run-to-run SD in the noise margin: the spec's prior, then the seed bank's."""
        self.pruner = make_pruner(spec, n, max_resource, self.run_sd)
        self._lock = threading.Lock()
        self._trials: dict[str, optuna.Trial] = {}
        self._steps: dict[str, set[int]] = {}
        self._study = (optuna.create_study(direction="maximize", pruner=self.pruner)
                       if self.pruner is not None else None)
        self.rounds = rounds
        """Trials run in rounds (`executor.schedule: rounds`): a trial is compared only with
        the trials that ended before its round began, never with its round's others, so its
        fate does not depend on which of them reported first."""
        self._base: tuple[list[dict[str, Any]], dict[str, list[tuple[int, float]]]] = ([], {})
        self._private: dict[str, StudyPruning] = {}

    def start_round(self, trials: list[dict[str, Any]],
                    evals: dict[str, list[tuple[int, float]]]) -> None:
        """Rounds: what the next round's trials are compared with (the trials ended so far)."""
        with self._lock:
            self._base = ([t for t in trials if t["finished"]], evals)
            self._private.clear()

    def _own(self, trial_id: str) -> StudyPruning:
        """Rounds: this trial's own pruning state, the round's base replayed in trial order."""
        own = self._private.get(trial_id)
        if own is None:
            own = self._private[trial_id] = StudyPruning(self.spec, self._n, self._max_resource,
                                                         run_sd=self.run_sd)
            trials, evals = self._base
            own.replay(sorted(trials, key=lambda t: t["number"]), evals, in_order=True)
        return own

    def set_run_sd(self, run_sd: float) -> None:
        """Use this run-to-run SD (the seed bank's) in every later pruning decision."""
        with self._lock:
            self.run_sd = run_sd
            for state in (self, *self._private.values()):
                state.run_sd = run_sd
                if isinstance(state.pruner, NoiseMarginPruner):
                    state.pruner.run_sd = run_sd

    @property
    def enabled(self) -> bool:
        return self._study is not None

    def report(self, trial_id: str, role: str, step: int, value: float) -> dict[str, Any] | None:
        """Record a score at `step`; the decision's numbers when the trial must stop."""
        if self._study is None or role not in REPORTING_ROLES:
            return None
        if self.rounds:
            with self._lock:
                own = self._own(trial_id)
            return own.report(trial_id, role, step, value)
        with self._lock:
            prune = self._record(trial_id, step, value)
            assert isinstance(self.pruner, NoiseMarginPruner)
            numbers = self.pruner.last.get(self._trials[trial_id].number)
            if prune and role in PRUNABLE_ROLES and numbers is not None:
                return {**numbers, "rule": f"{self.spec.kind} (reduction factor "
                        f"{self.spec.reduction_factor}, min {self.spec.min_resource} steps) "
                        f"and behind by more than {self.spec.margin_z:g} SE, run-to-run SD "
                        f"{numbers['run_sd']:.3f} included"}
            return None

    def _record(self, trial_id: str, step: int, value: float) -> bool:
        assert self._study is not None
        trial = self._trials.get(trial_id)
        if trial is None:
            trial = self._trials[trial_id] = self._study.ask()
            self._steps[trial_id] = set()
        if step in self._steps[trial_id]:
            return False  # a resumed trial re-reports a step it already reported
        self._steps[trial_id].add(step)
        trial.report(value, step)
        return trial.should_prune()  # asked of every trial: it records the pruner's rungs

    def finish(self, trial_id: str, value: float | None, pruned: bool = False) -> None:
        if self._study is None:
            return
        with self._lock:
            trial = self._trials.get(trial_id)
            if trial is None:
                return
            if pruned:
                self._study.tell(trial, state=TrialState.PRUNED)
            elif value is None:
                self._study.tell(trial, state=TrialState.FAIL)
            else:
                self._study.tell(trial, value)

    def replay(self, trials: list[dict[str, Any]], evals: dict[str, list[tuple[int, float]]],
               in_order: bool = False) -> None:
        """Rebuild from the journal (a resumed study): finished trials in the order they
        finished (`in_order`: in the order given), then the ones still running (their earlier
        steps). Replay never prunes."""
        if self._study is None:
            return
        rows = [t for t in trials if t["role"] in REPORTING_ROLES and evals.get(t["id"])]
        done = [t for t in rows if t["finished"]]
        if not in_order:
            done.sort(key=lambda t: t["finished"])
        for row in done + [t for t in rows if not t["finished"]]:
            with self._lock:
                for step, value in sorted(evals[row["id"]]):
                    self._record(row["id"], step, value)
            if row["finished"]:
                self.finish(row["id"], row["dev_accuracy"], pruned=row["status"] == "pruned")


def intermediate_step(entry: dict[str, Any]) -> int | None:
    """The RL step of an evaluation during training (`rl-<k>` on dev), else None."""
    stage = str(entry.get("stage") or "")
    if entry.get("split") != "dev" or not stage.startswith("rl-"):
        return None
    return int(entry.get("step") or stage.removeprefix("rl-"))
