"""The study loop: propose, dispatch in parallel, record everything, decide with care.

    study -> proposer -> queued trials (journaled, id and directory fixed) -> executor
          -> results and step metrics (journaled) -> keep rule (dev only) -> best -> report

One thread (the caller's) owns the loop: it asks the proposer for as many trials as there are
free slots, journals them as `queued`, hands them to worker threads (one per concurrent trial)
and, whenever one finishes, journals its result and applies the keep rule. Decisions are taken
in the order trials finish, after the baseline (the declared base config, always the first
trial); while a contender is being re-run with extra seeds, later decisions wait for it.

Crash safety: the journal is written before anything acts on it. A study killed at any point
resumes from its journal: queued trials are dispatched, running ones re-attached (Kubernetes) or
resumed from their last checkpoint (local), finished but undecided ones decided; a trial is
never started twice because its directory (and Job name) is fixed when it is queued. A study
interrupted in this process (Ctrl-C, SIGTERM) says so first: the study becomes `interrupted`,
its unfinished trials `stopped` at their last step, and a resume takes them up again.

Progress: every trial's phase, step of total, last metrics and time left are kept on its row
(`progress`, at most every few seconds) and handed to an optional `progress` callback, so a
terminal and `autoresearch status` show the same thing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.progress import ProgressCallback, ProgressTracker, describe
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import TrialResult
from autoresearch.study.confirmation import ACTIVE, EVIDENCE_ROLES, bank_run_sd
from autoresearch.study.control import (
    ControlledExecutor,
    ControlledProposer,
    StudyControl,
    TrialStopped,
)
from autoresearch.study.decisions import ErrorBudget, detectable_before_start, keep_rule_for
from autoresearch.study.environment import api_key, environment_text, fingerprint
from autoresearch.study.executors.base import Executor, TrialJob
from autoresearch.study.executors.local import LocalExecutor
from autoresearch.study.final_check import read_test_once
from autoresearch.study.journal import Journal
from autoresearch.study.keeping import DecisionsImpossible, KeepRuleJournal
from autoresearch.study.proposers import Context, ProposalBatch, Proposer, make_proposer
from autoresearch.study.pruning import StudyPruning, TrialPruned, intermediate_step
from autoresearch.study.space import config_diff, config_key
from autoresearch.study.spec import PRIMARY_WARMUP, Study
from autoresearch.study.tracing import Tracer
from autoresearch.study.warmup import (
    WarmupFailed,
    WarmupStage,
    remote_checkpoint_exists,
)

log = logging.getLogger(__name__)

_IN_PROCESS: dict[Path, threading.Lock] = {}
_IN_PROCESS_GUARD = threading.Lock()


def _run_exclusively(executor: Executor, job: TrialJob, sink: Any) -> TrialResult:
    """Run a trial holding its directory's lock: a study interrupted in this process may have
    left the trial running in a thread; a resumed study waits for it, then finds it finished."""
    with _IN_PROCESS_GUARD:
        lock = _IN_PROCESS.setdefault(job.directory, threading.Lock())
    with lock:
        return executor.run(job, sink)


def _ignore(entry: dict[str, Any]) -> None:
    """A step sink for jobs whose steps nobody follows (the final test check)."""


STEP_FLUSH_SECONDS = 2.0


@dataclass
class StudyOutcome:
    directory: Path
    journal: Path
    best: dict[str, Any] | None
    baseline: dict[str, Any] | None
    report: Path | None




def _total_steps(row: dict[str, Any]) -> int:
    """Steps a trial spends: all it planned, or, when pruned, the ones it ran."""
    config = row["config"]
    if row["status"] == "pruned" and row.get("steps") is not None:
        return int(row["steps"])
    return int(config["sft"]["steps"]) + int(config["rl"]["steps"])


class StudyRunner:
    def __init__(self, study: Study, output_dir: str | Path | None = None,
                 executor: Executor | None = None, proposer: Proposer | None = None,
                 progress: ProgressCallback | None = None):
        self.study = study
        self.dir = Path(output_dir or study.directory())
        self.space = study.space()
        self.rule = keep_rule_for(study.budget)
        self.journal = Journal(self.dir)
        self.keeping = KeepRuleJournal(study, self.journal, self.rule, lambda: self.space.base,
                                       self._trial_row)
        self.control = StudyControl(self.dir)
        proposer = proposer or make_proposer(study.proposer, study.seed)
        if not isinstance(proposer, ControlledProposer):
            proposer = ControlledProposer(proposer, self.control)
        self.proposer = proposer
        self.tracer = Tracer(study.tracing.project)
        self._propose = self.tracer.op("propose", self._propose_traced)
        self._trace_trial = self.tracer.op("trial", _trial_summary)
        self._executor = executor
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._flushed: dict[str, float] = {}
        self._buffer_lock = threading.Lock()
        self._said: set[str] = set()
        self._exploring = True
        self._server_data: Path | None = None
        base = study.trial_base()
        self._rounds = study.executor.schedule == "rounds"
        self.pruning = StudyPruning(study.pruning, base.eval.every_tasks or base.eval.dev_tasks,
                                    base.rl.steps, rounds=self._rounds)
        self._progress = progress or (lambda trial_id, state: None)
        self._trackers: dict[str, ProgressTracker] = {}
        self._interrupted = False

    # ---------------------------------------------------------------- run
    def run(self) -> StudyOutcome:
        from autoresearch.study.report import write_report

        self._init_journal()
        self._replay_pruning()
        try:
            with self._executor_for_study() as given:
                self._journal_environment(given)
                executor = self._controlled(given)
                try:
                    self._warm_up(executor)
                    trials = self._controlled(self._with_trial_cache(given))
                    evidence = trials if self._replays_evidence() else executor
                    self._loop(trials, evidence)
                    if self.keeping.queue_test_runs():
                        self._loop(trials, evidence)  # the fresh runs the test check reads
                    read_test_once(self.study, self.journal, self.dir,
                                   lambda job: _run_exclusively(evidence, job, _ignore),
                                   self._say_once)
                except KeyboardInterrupt:
                    self._interrupt()  # before the server goes down under the trials
                    raise
        except KeyboardInterrupt:
            self._interrupt()
            raise
        except (WarmupFailed, DecisionsImpossible) as exc:
            log.error("%s", exc)
            self.journal.event("study", f"study failed: {exc}")
            self.journal.set_study(state="failed")
            return self.outcome(write_report(self.dir))
        self.journal.set_study(state="finished")
        self.journal.event("study", "study finished")
        report = write_report(self.dir)
        return self.outcome(report)

    def _journal_environment(self, executor: Executor) -> None:
        """Record what the numbers depend on besides the declaration (`environment`)."""
        url = getattr(executor, "server_url", None) or self.study.resolved_server_url()
        facts = fingerprint(url, api_key())
        self.journal.event("environment", environment_text(facts), **facts)

    def _warm_up(self, executor: Executor) -> None:
        """Run (or reuse) the declared warm-up; every trial then starts from its checkpoint."""
        if self.study.warmup is None:
            return
        owner, exists = self._checkpoint_access()
        checkpoints: dict[str, str] = {}
        for name in self.study.warmup_names():
            stage = WarmupStage(self.study, self.journal, self.dir, self._server_data, owner,
                                exists, name)
            self._trackers[stage.trial_id] = ProgressTracker(stage.config)
            checkpoints[name] = stage.ensure(executor, self._step_sink(stage.trial_id, "warmup"))
        self.space = self.study.space(checkpoints[PRIMARY_WARMUP], checkpoints)

    def _controlled(self, executor: Executor) -> Executor:
        """`executor`, obeying the study's pause and stop requests at every step."""
        if isinstance(executor, ControlledExecutor):
            return executor
        return ControlledExecutor(executor, self.control)

    def _checkpoint_access(self) -> tuple[str | None, Any]:
        """(owner of the embedded server's runs, or None; whether a named server still holds
        a checkpoint, or None): what installing or trusting a cached checkpoint needs."""
        if self._server_data is not None:
            from server.api.auth import owner_of

            return owner_of(api_key()), None
        if (url := self.study.resolved_server_url()) is not None:
            def exists(path: str) -> bool:
                return remote_checkpoint_exists(url, api_key(), path)

            return None, exists
        return None, None

    def _with_trial_cache(self, executor: Executor) -> Executor:
        """The executor trials run on: `executor`, or, where the study declares a trial cache,
        one that replays trials an earlier study already ran."""
        spec = self.study.trial_cache
        if spec is None:
            return executor
        from autoresearch.study.cache_scope import numbers_scope
        from autoresearch.study.trial_cache import CachingExecutor, TrialCache, cache_root
        from autoresearch.study.warmup import server_scope

        owner, exists = self._checkpoint_access()
        scope = numbers_scope(server_scope(self.study), self.study.resolved_server_url(),
                              api_key())
        cache = TrialCache(cache_root(spec.dir), scope)
        return CachingExecutor(executor, cache, self._server_data, owner, exists)

    def _replays_evidence(self) -> bool:
        """Whether seed-bank and confirmation runs may be replayed from the trial cache (only
        where the study declares it): otherwise they always train fresh."""
        return self.study.trial_cache is not None and self.study.trial_cache.replay_evidence

    def _replay_pruning(self) -> None:
        if self.pruning.enabled:
            self._measured_run_sd(quiet=True)
            self.pruning.replay(self.journal.trials(), self._intermediate_evals())

    def _measured_run_sd(self, quiet: bool = False) -> None:
        """Once the seed bank has finished, its run-to-run SD replaces the spec's prior in the
        pruning margin (journaled once, when it first applies)."""
        measured = bank_run_sd(self.journal.trials()) if self.pruning.enabled else None
        if measured is None or measured[0] == self.pruning.run_sd:
            return
        prior = self.pruning.run_sd
        self.pruning.set_run_sd(measured[0])
        if not quiet:
            self.journal.event(
                "pruning margin", f"the noise margin now includes the seed bank's run-to-run SD "
                f"{measured[0]:.3f} ({measured[1]} df) in place of the prior {prior:.3f}")

    def _intermediate_evals(self) -> dict[str, list[tuple[int, float]]]:
        """Every trial's dev scores during training, `(RL step, accuracy)`, from the journal."""
        evals: dict[str, list[tuple[int, float]]] = {}
        for row in self.journal.query("SELECT trial_id, stage, split, accuracy, summary "
                                      "FROM evals ORDER BY time"):
            step = intermediate_step({**(row["summary"] or {}), "stage": row["stage"],
                                      "split": row["split"]})
            if step is not None and row["accuracy"] is not None:
                evals.setdefault(row["trial_id"], []).append((step, row["accuracy"]))
        return evals

    def outcome(self, report: Path | None = None) -> StudyOutcome:
        best_id = self.journal.study()["best_trial"]
        baseline = [t for t in self.journal.trials() if t["role"] == "baseline"]
        return StudyOutcome(self.dir, self.journal.path,
                            self.journal.trial(best_id) if best_id else None,
                            baseline[0] if baseline else None, report)

    def _error_budget(self) -> None:
        """Journal the error budget once; after a re-declaration, keep to what is left of the
        first one (alpha already spent on decided confirmations is not spent again)."""
        budgets = [e["data"] or {} for e in self.journal.events() if e["kind"] == "error budget"]
        declared = self.rule.budget
        if budgets:
            latest = budgets[-1]
            as_declared = (latest.get("declared_alpha", latest.get("alpha")),
                           latest.get("declared_confirmations", latest.get("confirmations")))
            if as_declared == (declared.alpha, declared.confirmations):
                earlier = ErrorBudget.journaled(latest)
                if earlier is not None:  # the budget in force when it was declared still holds
                    self._use_budget(earlier)
                return
            done = [d for d in self.journal.decisions() if d["rule"] == "confirmation"]
            budget = declared.redeclared(float(budgets[0].get("alpha", declared.alpha)),
                                         sum(float(d["alpha"] or 0.0) for d in done), len(done))
        else:
            budget = declared
        self._use_budget(budget)
        self.journal.event("error budget", budget.describe(), alpha=budget.alpha,
                           confirmations=budget.confirmations,
                           per_confirmation=budget.per_confirmation, spent=budget.spent,
                           used=budget.used, declared_alpha=declared.alpha,
                           declared_confirmations=declared.confirmations)

    def _use_budget(self, budget: ErrorBudget) -> None:
        self.rule = dataclasses.replace(self.rule, budget=budget)
        self.keeping.rule = self.rule

    def _init_journal(self) -> None:
        spec = self.study.model_dump(mode="json")
        last_activity = self.journal.last_activity()  # before this run writes anything
        row = self.journal.init_study(self.study.name, spec)
        if row["spec"] != spec:
            self.journal.set_study(spec=spec)
            self.journal.event("study", "the declaration changed on resume; the new one applies")
        self._error_budget()
        if not any(e["kind"] == "power" for e in self.journal.events()):
            b, base = self.study.budget, self.study.trial_base()
            said = detectable_before_start(base.eval.dev_tasks, self.study.pruning.run_sd,
                                           b.seed_bank, b.confirm_seeds, self.rule.budget)
            self.journal.event("power", said)
            log.info(said)
        resumed = self.journal.trials()
        if resumed:
            # The time the study was down does not count against its wall-clock budget.
            down = max(0.0, time.time() - last_activity) if last_activity else 0.0
            self.journal.event("study", f"resuming with {len(resumed)} trials in the journal "
                               f"after {down:.0f} s down", down_seconds=round(down, 3))
        for row in resumed:
            progress = row.get("progress") or {}
            if row["status"] == "stopped" and progress.get("interrupted"):
                self.journal.update_trial(row["id"], status="queued", error=None)
                self.journal.event("trial", "the study was interrupted here: resuming it from "
                                   f"its last checkpoint ({describe(progress)})", row["id"])

    def _interrupt(self) -> None:
        """Journal an interruption: the study `interrupted`, unfinished trials `stopped` at their
        last step (a resume queues them again). Each write is short; running once is enough."""
        if self._interrupted:
            return
        self._interrupted = True
        for row in self.journal.trials():
            if row["status"] not in ACTIVE:
                continue
            self._flush_steps(row["id"])
            tracker = self._trackers.get(row["id"])
            last = tracker.end("stopped", interrupted=True) if tracker else {
                **(row.get("progress") or {}), "phase": "stopped", "interrupted": True}
            where = describe(last) if tracker else "before it started"
            self.journal.update_trial(row["id"], status="stopped", finished=time.time(),
                                      progress=last, error=f"interrupted: {where}")
            self._progress(row["id"], last)
        self.journal.set_study(state="interrupted")
        self.journal.event("study", "study interrupted; `autoresearch resume` continues it")

    @contextlib.contextmanager
    def _executor_for_study(self) -> Iterator[Executor]:
        if self._executor is not None:
            yield self._executor
            return
        spec = self.study.executor
        if spec.kind == "kubernetes":
            from autoresearch.study.executors.kubernetes import KubernetesExecutor

            executor = KubernetesExecutor(self.study.name, spec, self.study.resolved_server_url())
            yield executor
            executor.close()  # not when interrupted: uncollected Jobs must survive a resume
            return
        from rewards import RewardPool

        with contextlib.ExitStack() as stack:
            url = self.study.resolved_server_url()
            if url is None:
                from server.entrypoints.runtime import ServerConfig, ServerThread

                self._server_data = (self.dir / "server-data").resolve()
                server = ServerThread(ServerConfig(model=self.study.embedded_model, port=0,
                                                   data_dir=self._server_data, api_keys=""))
                url = stack.enter_context(server).url
            pool = stack.enter_context(RewardPool(workers=self.study.reward_workers))
            yield LocalExecutor(url, api_key(), pool)

    def _loop(self, executor: Executor, evidence: Executor) -> None:
        """Run trials until the budget is spent: exploration on `executor`, seed-bank and
        confirmation runs on `evidence` (the same, or one that never replays a cached run)."""
        def executor_for(row: dict[str, Any]) -> Executor:
            return evidence if row["role"] in EVIDENCE_ROLES else executor

        parallel = self.study.executor.max_parallel_trials
        pending: dict[Future, str] = {}
        threads = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="trial")
        finished = False
        def start_queued() -> None:
            for row in self.journal.trials():
                if row["status"] not in ACTIVE:
                    continue
                if len(pending) >= parallel:
                    break
                if row["id"] not in pending.values():
                    pending[self._dispatch(row, executor_for(row), threads)] = row["id"]

        try:
            while True:
                self.keeping.decide()
                if self._rounds and self.pruning.enabled:
                    self.pruning.start_round(self.journal.trials(), self._intermediate_evals())
                start_queued()
                free = parallel - len(pending)
                if free > 0:
                    new = self._new_trials(free)
                    for row in new:
                        pending[self._dispatch(row, executor_for(row), threads)] = row["id"]
                    if any(row["role"] == "baseline" for row in new):
                        # Queues the seed bank, the baseline's company: in the baseline's own
                        # round where slots are left, else in the next.
                        self.keeping.decide()
                        start_queued()
                if not pending:
                    break
                # Rounds: the next decisions wait for the whole round, so they never depend
                # on which trial ended first.
                done, _ = wait(list(pending),
                               return_when=ALL_COMPLETED if self._rounds else FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: pending[f]):  # in trial order
                    self._collect(pending.pop(future), future)
            finished = True
        finally:
            # Interrupted: return at once; running trials are resumed from the journal later.
            threads.shutdown(wait=finished, cancel_futures=True)

    # ---------------------------------------------------------- proposing
    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message)
            self.journal.event("budget", message)

    def _budget_left(self, trials: list[dict[str, Any]]) -> int:
        """How many more exploration trials the budget allows now."""
        b = self.study.budget
        explored = [t for t in trials if t["role"] in ("baseline", "explore")]
        left = b.max_trials - len(explored)
        if left <= 0:
            self._say_once("trials", f"trial budget spent: {b.max_trials} trials proposed")
            return 0
        if b.max_tokens is not None:
            used = sum(t["tokens"] or 0 for t in trials)
            if used >= b.max_tokens:
                self._say_once("tokens", f"token budget spent: {used} of {b.max_tokens} tokens")
                return 0
        if b.max_wall_seconds is not None:
            # The warm-up is a one-off cost (a rerun takes it from the cache): not the search's.
            warmup = sum(t["wall_seconds"] or 0 for t in trials if t["role"] == "warmup")
            # Nor is the time the study was down between an interruption and its resume.
            down = sum((e["data"] or {}).get("down_seconds", 0) for e in self.journal.events()
                       if e["kind"] == "study")
            elapsed = time.time() - self.journal.study()["created"] - warmup - down
            if elapsed >= b.max_wall_seconds:
                self._say_once("wall", f"wall-clock budget spent: {elapsed:.0f}s of "
                               f"{b.max_wall_seconds:.0f}s")
                return 0
        return left

    def _steps_fit(self, trials: list[dict[str, Any]], planned: list[TrialConfig],
                   config: TrialConfig) -> bool:
        b = self.study.budget
        if b.max_steps is None:
            return True
        used = sum(_total_steps(t) for t in trials if t["role"] in ("baseline", "explore"))
        used += sum(c.sft.steps + c.rl.steps for c in planned)
        if used + config.sft.steps + config.rl.steps > b.max_steps:
            self._say_once("steps", f"step budget spent: {used} of {b.max_steps} steps planned")
            return False
        return True

    def context(self) -> Context:
        trials = self.journal.trials()
        best_id = self.journal.study()["best_trial"]
        best = next((t for t in trials if t["id"] == best_id), None)
        return Context(self.space, trials, best, self._curves(), self.study.goal)

    def _curves(self) -> dict[str, str]:
        rows = self.journal.query(
            "SELECT trial_id, phase, reward_mean, loss FROM steps ORDER BY trial_id, time")
        by_trial: dict[str, dict[str, list[float]]] = {}
        for r in rows:
            series = by_trial.setdefault(r["trial_id"], {"sft": [], "rl": []})
            value = r["reward_mean"] if r["phase"] == "rl" else r["loss"]
            if value is not None:
                series.setdefault(r["phase"], []).append(value)
        out = {}
        for trial_id, series in by_trial.items():
            parts = []
            if series.get("sft"):
                s = series["sft"]
                parts.append(f"SFT loss {s[0]:.3f} -> {s[-1]:.3f} over {len(s)} steps")
            if series.get("rl"):
                s = series["rl"]
                parts.append(f"RL mean reward {s[0]:.3f} -> {s[-1]:.3f} (max {max(s):.3f}) "
                             f"over {len(s)} steps")
            out[trial_id] = "; ".join(parts)
        return out

    def _propose_traced(self, context: Context, n: int) -> ProposalBatch:
        return self.proposer.propose(context, n)

    def _new_trials(self, free: int) -> list[dict[str, Any]]:
        trials = self.journal.trials()
        n = min(free, self._budget_left(trials)) if self._exploring else 0
        if n <= 0:
            return []
        rows: list[dict[str, Any]] = []
        number = self.journal.next_number()
        best_id = self.journal.study()["best_trial"]
        best = next((t for t in trials if t["id"] == best_id), None)
        best_config = TrialConfig.model_validate(best["config"]) if best else self.space.base
        if not any(t["role"] == "baseline" for t in trials):
            base = self.space.base
            if self._steps_fit(trials, [], base):
                row = self._trial_row(number, "baseline", base, {}, "baseline",
                                      "The declared base config: the reference every change is "
                                      "judged against.", best_config, best_id)
                self.journal.add_proposal(
                    {"time": time.time(), "proposer": "baseline", "requested": 1,
                     "outcome": "declared", "attempts": 0, "errors": [], "seconds": 0.0}, [row])
                rows.append(row)
                number += 1
                n -= 1
        if n <= 0:
            return rows
        started = time.monotonic()
        context = self.context()
        try:
            batch = self._propose(context, n)
        except Exception as exc:  # noqa: BLE001 - a broken proposer ends exploration, not the study
            log.exception("proposer failed")
            self.journal.event("proposer", f"proposer failed: {type(exc).__name__}: {exc}")
            self._exploring = False
            return rows
        # The baseline queued just above has not run, so the journal's trials do not count its
        # steps yet: they are planned like the proposals'.
        planned: list[TrialConfig] = [self.space.base] if rows else []
        new_rows = []
        for proposal in batch.proposals:
            try:
                _, config = self.space.validate(proposal.changes)
            except ValueError as exc:
                self.journal.event("proposer", f"proposal rejected, outside the search space: "
                                   f"{exc}", changes=proposal.changes)
                continue
            if not self._steps_fit(trials, planned, config):
                break
            planned.append(config)
            new_rows.append(self._trial_row(number, "explore", config, proposal.changes,
                                            batch.proposer, proposal.rationale, best_config,
                                            best_id))
            number += 1
        self.journal.add_proposal(
            {"time": time.time(), "proposer": batch.proposer, "requested": n,
             "outcome": batch.outcome, "attempts": batch.attempts, "errors": batch.errors,
             "response": batch.response, "seconds": round(time.monotonic() - started, 3)},
            new_rows)
        if not batch.proposals:
            self._exploring = False
            self._say_once("exhausted", "the proposer has no new configuration to propose")
        for row in new_rows:
            log.info("queued %s (%s): %s", row["id"], batch.proposer, row["rationale"])
        return rows + new_rows

    def _trial_row(self, number: int, role: str, config: TrialConfig, changes: dict[str, Any],
                   proposer: str, rationale: str, best_config: TrialConfig,
                   best_id: str | None, replicate_of: str | None = None) -> dict[str, Any]:
        trial_id = f"t{number:04d}"
        config = dev_only(config).with_changes({"name": f"{self.study.name}-{trial_id}"})
        best_config = dev_only(best_config)
        return {
            "id": trial_id, "number": number, "role": role, "status": "queued",
            "proposer": proposer, "rationale": rationale, "changes": changes,
            "config": config.model_dump(mode="json"), "fingerprint": config.fingerprint(),
            "config_key": config_key(config), "seed": config.seed, "replicate_of": replicate_of,
            "best_at_proposal": best_id, "diff_vs_best": config_diff(config, best_config),
            "directory": f"trials/{trial_id}", "created": time.time(), "attempts": 0,
        }

    # --------------------------------------------------------- dispatching
    def _dispatch(self, row: dict[str, Any], executor: Executor,
                  threads: ThreadPoolExecutor) -> Future:
        now = time.time()
        if row["status"] == "running":
            self.journal.event("trial", "re-attaching to the trial (resumed study)", row["id"])
        job = TrialJob(row["id"], TrialConfig.model_validate(row["config"]),
                       (self.dir / row["directory"]).resolve())
        tracker = self._trackers[row["id"]] = ProgressTracker(job.config)
        prior = row.get("progress") or {}
        if prior.get("step"):  # a resumed trial starts from where it was, not from step 0
            tracker.state.update({k: prior.get(k) for k in (
                "step", "reward", "accuracy", "loss", "dev_accuracy") if prior.get(k) is not None})
        self.journal.update_trial(row["id"], status="running", started=row.get("started") or now,
                                  attempts=(row.get("attempts") or 0) + 1,
                                  progress=dict(tracker.state))
        self._progress(row["id"], dict(tracker.state))
        log.info("running %s", row["id"])
        return threads.submit(_run_exclusively, executor, job,
                              self._step_sink(row["id"], row["role"]))

    def _step_sink(self, trial_id: str, role: str):
        def sink(entry: dict[str, Any]) -> None:
            # After an interruption a trial's thread may still report (its evaluation was
            # under way): its steps are kept, but its progress stays what `_interrupt` wrote.
            tracker = None if self._interrupted else self._trackers.get(trial_id)
            before = tracker.state["phase"] if tracker else None
            state = tracker.update(entry) if tracker else None
            with self._buffer_lock:
                if entry.get("type", "step") == "step":
                    self._buffers.setdefault(trial_id, []).append(entry)
                due = time.monotonic() - self._flushed.get(trial_id, 0.0) >= STEP_FLUSH_SECONDS
            if due or (state is not None and state["phase"] != before):
                self._flush_steps(trial_id)
            if state is not None:
                self._progress(trial_id, state)
            if entry.get("type") == "eval":
                self._intermediate(trial_id, role, entry)  # may stop the trial (pruned)

        return sink

    def _intermediate(self, trial_id: str, role: str, entry: dict[str, Any]) -> None:
        """A dev score during training: report it to the pruner; stop the trial if pruned."""
        step = intermediate_step(entry)
        value = entry.get("accuracy")
        if isinstance(value, dict):
            value = value.get("value")
        if step is None or value is None:
            return
        accuracy = entry["accuracy"] if isinstance(entry["accuracy"], dict) else {
            "value": value, "n": entry.get("n")}
        self.journal.put_evals(trial_id, [{**entry, "accuracy": accuracy,
                                           "time": entry.get("time") or time.time()}],
                               replace=False)
        numbers = self.pruning.report(trial_id, role, step, float(value))
        if numbers is not None:
            raise TrialPruned(
                f"pruned at RL step {step}: dev subset {numbers['value']:.3f} vs best "
                f"{numbers['best']:.3f} at that step, behind by more than the noise margin "
                f"{numbers['margin']:.3f} (n={numbers['n']}; {numbers['rule']})", step)

    def _flush_steps(self, trial_id: str) -> None:
        with self._buffer_lock:
            entries = self._buffers.pop(trial_id, [])
            self._flushed[trial_id] = time.monotonic()
        tracker = None if self._interrupted else self._trackers.get(trial_id)
        if entries or tracker is not None:
            self.journal.put_steps(trial_id, entries,
                                   progress=dict(tracker.state) if tracker else None)

    def _collect(self, trial_id: str, future: Future) -> None:
        row = self.journal.trial(trial_id)
        directory = self.dir / row["directory"]
        with self._buffer_lock:
            streamed = self._buffers.pop(trial_id, [])
        steps = evals = None
        if (directory / "record.jsonl").exists():  # the record is authoritative
            record = TrialRecord(directory)
            steps, evals = record.of_type("step"), record.of_type("eval")
        elif streamed:
            self.journal.put_steps(trial_id, streamed)
        tracker = self._trackers.get(trial_id) or ProgressTracker(
            TrialConfig.model_validate(row["config"]))
        try:
            result: TrialResult = future.result()
        except TrialPruned as exc:
            ran = int(row["config"]["sft"]["steps"]) + exc.step  # pruned after RL step k
            tokens = sum(int(e.get("tokens") or 0) for e in steps or streamed)
            last = tracker.end("pruned")
            self._progress(trial_id, last)
            self.journal.finish_trial(trial_id, steps, evals, status="pruned",
                                      finished=time.time(), error=str(exc), steps=ran,
                                      tokens=tokens, progress=last)
            self.journal.event("pruning", str(exc), trial_id, step=exc.step)
            self.pruning.finish(trial_id, None, pruned=True)
            log.info("trial %s %s", trial_id, exc)
            return
        except TrialStopped as exc:
            # A trial stopped by the study's interruption keeps the mark `_interrupt` gave it,
            # however late its thread reports back, so a resume queues it again.
            last = tracker.end("stopped", **({"interrupted": True} if self._interrupted else {}))
            self._progress(trial_id, last)
            self.journal.finish_trial(trial_id, steps, evals, status="stopped",
                                      finished=time.time(), error=str(exc), progress=last)
            self.journal.event("trial", f"stopped on request: {exc}", trial_id)
            log.info("trial %s stopped on request", trial_id)
            return
        except Exception as exc:  # noqa: BLE001 - a crashed trial is a result, not the end
            error = "".join(traceback.format_exception(exc))[-4000:]
            last = tracker.end("crashed")
            self._progress(trial_id, last)
            self.journal.finish_trial(trial_id, steps, evals, status="crashed",
                                      finished=time.time(), error=error, progress=last)
            self.journal.event("trial", f"crashed: {type(exc).__name__}: {exc}", trial_id)
            self.pruning.finish(trial_id, None)
            log.warning("trial %s crashed: %s", trial_id, exc)
            return
        dev, test = result.dev or {}, result.test or {}
        acc, tacc = dev.get("accuracy") or {}, test.get("accuracy") or {}
        last = tracker.end("done", step=tracker.state["total"], eta_seconds=0.0,
                           dev_accuracy=acc.get("value"))
        self._progress(trial_id, last)
        self.journal.finish_trial(
            trial_id, steps, evals, status="done", finished=time.time(),
            dev_accuracy=acc.get("value"), dev_low=acc.get("low"), dev_high=acc.get("high"),
            dev_n=acc.get("n"), test_accuracy=tacc.get("value"), test_low=tacc.get("low"),
            test_high=tacc.get("high"), test_n=tacc.get("n"), dev=result.dev, test=result.test,
            steps=result.steps, tokens=result.tokens, wall_seconds=result.wall_seconds,
            checkpoint=result.checkpoint, progress=last)
        self.pruning.finish(trial_id, acc.get("value"))
        self._measured_run_sd()
        log.info("trial %s done: dev accuracy %s", trial_id, acc.get("value"))
        self._trace_trial(trial_id, row["config"], row["rationale"], acc, result.steps,
                          result.tokens, result.wall_seconds)

def dev_only(config: TrialConfig) -> TrialConfig:
    """A study's trials read the dev split only; test (and transfer) are read once, by the
    study."""
    return config.with_changes({"eval.test_tasks": 0, "eval.transfer_tasks": 0,
                                "eval.baseline": False})


def _trial_summary(trial_id: str, config: dict[str, Any], rationale: str,
                   dev_accuracy: dict[str, Any], steps: int, tokens: int,
                   wall_seconds: float) -> dict[str, Any]:
    """What tracing records of a finished trial (the dev score only, as decisions do)."""
    return {"trial": trial_id, "dev_accuracy": dev_accuracy, "steps": steps, "tokens": tokens,
            "wall_seconds": wall_seconds}


def run_study(study: Study, output_dir: str | Path | None = None,
              executor: Executor | None = None, proposer: Proposer | None = None,
              progress: ProgressCallback | None = None) -> StudyOutcome:
    """Run (or resume) a study to the end of its budget and write its report."""
    return StudyRunner(study, output_dir, executor, proposer, progress).run()


def load_study(directory: str | Path) -> Study:
    """The declaration a study journal was started with (its latest, after a resume)."""
    journal = Journal(directory, read_only=True)
    return Study.model_validate(journal.study()["spec"])


def resume_study(directory: str | Path, executor: Executor | None = None,
                 proposer: Proposer | None = None,
                 progress: ProgressCallback | None = None) -> StudyOutcome:
    return run_study(load_study(directory), directory, executor, proposer, progress)
