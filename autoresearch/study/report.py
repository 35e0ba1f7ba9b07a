"""The study report: what was tried, what was kept and why, and how much the best config helps.

Built from the journal alone (so `autoresearch report` works on a copied journal file), as a
list of blocks rendered to Markdown here (HTML: `autoresearch.ui.report`). The
leaderboard and every decision use the dev split; the test split appears once, in the final
comparison of the best config with the baseline, as the keep rule requires.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from autoresearch.evaluation.stats import (
    Estimate,
    detectable_gain,
    floored_run_spread,
    paired_difference,
    paired_exact_test,
    run_level_test,
    run_mean,
    runs_and_questions_mean,
)
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.progress import describe, where
from autoresearch.study.confirmation import (
    against_warmup,
    config_runs,
    dev_arms,
    held_out_gain,
    test_arms,
    test_verdicts,
    warmup_of,
)
from autoresearch.study.decision_text import decision_text
from autoresearch.study.decisions import ErrorBudget, KeepRule, paired_items
from autoresearch.study.journal import Journal
from autoresearch.study.space import config_diff
from autoresearch.study.spec import WARMUP_ID

SPARKS = "▁▂▃▄▅▆▇█"
FINISHED = ("done", "kept", "discarded")


@dataclass
class Block:
    kind: Literal["h1", "h2", "p", "table", "code", "curves", "list"]
    text: str = ""
    headers: list[str] | None = None
    rows: list[list[str]] | None = None
    items: list[str] | None = None
    series: list[tuple[str, list[float]]] | None = None


def _acc(row: dict[str, Any] | None, split: str = "dev") -> str:
    if not row or row.get(f"{split}_accuracy") is None:
        return "-"
    return (f"{row[f'{split}_accuracy']:.3f} [{row[f'{split}_low']:.3f}, "
            f"{row[f'{split}_high']:.3f}]")


def _diff(est: Estimate | None) -> str:
    if est is None or est.n == 0:
        return "-"
    return f"{est.value:+.3f} [{est.low:+.3f}, {est.high:+.3f}]"


def _paired(a: dict[str, Any] | None, b: dict[str, Any] | None, split: str) -> Estimate | None:
    if not a or not b or not a.get(split) or not b.get(split):
        return None
    x, y = paired_items(a[split]["verdicts"], b[split]["verdicts"])
    return paired_difference(x, y) if x else None


def _runs_cell(runs: list) -> str:
    """A config's accuracy over its runs, with a confidence interval for its mean accuracy
    over runs and questions alike (its expected accuracy on questions of the same kind; not a
    prediction of what one more run would score)."""
    est = runs_and_questions_mean(runs)
    what = f"mean of {len(runs)} runs" if len(runs) > 1 else "1 run"
    return f"{est.value:.3f} [{est.low:.3f}, {est.high:.3f}] ({what})"


def _scored_runs(trials: list[dict[str, Any]], config_key: str, split: str) -> list:
    """`split` verdicts of a base-like config's finished runs (baseline, seed bank, re-runs):
    the runs a sentence or row with runs as the unit is over."""
    def scored(t: dict[str, Any]) -> bool:
        return t["status"] in FINISHED and bool((t.get(split) or {}).get("verdicts"))

    return [t[split]["verdicts"] for t in config_runs(
        trials, config_key, ("baseline", "bank", "confirm"), scored)]


def _dev_rows(trials: list[dict[str, Any]], best: dict[str, Any],
              baseline: dict[str, Any] | None, same: bool,
              first_look: Estimate | None) -> list[list[str]]:
    """Dev with runs as the unit: each config's runs that no look selected (the best config's
    confirmation re-runs, the base config's runs), then the look that selected the best, which
    is biased upward and labelled so."""
    kept, base = dev_arms(trials, best["id"])
    if not base:
        return [["dev", _acc(baseline), _acc(best), "-" if same else _diff(first_look)]]
    if same:
        return [["dev (runs)", _runs_cell(base), _runs_cell(base), "-"]]
    rows = []
    if kept:
        runs = run_level_test(kept, base)
        gain, over = ((runs.interval(), "over runs") if runs.df > 0 else
                      (paired_exact_test(kept, base).difference, "over tasks"))
        rows.append(["dev (runs no look selected)", _runs_cell(base), _runs_cell(kept),
                     f"{_diff(gain)} {over}"])
    rows.append(["dev, the look that selected it (biased up)", _acc(baseline), _acc(best),
                 _diff(first_look)])
    return rows


def _keep_rule(spec: dict[str, Any]) -> KeepRule:
    b = spec.get("budget") or {}
    return KeepRule(ErrorBudget.for_study(b.get("alpha", 0.05), b.get("confirm_seeds", 0),
                                          b.get("max_confirm_trials", 0)))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _wins(d: dict[str, Any]) -> str:
    if d.get("wins") is None:
        return "-"
    # Over several seeds the wins and losses are per-task outcomes averaged over seeds.
    def count(x: float) -> str:
        return f"{x:.2f}".rstrip("0").rstrip(".")

    return f"{count(d['wins'])}/{count(d['losses'])}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _changes(row: dict[str, Any]) -> str:
    changes = row.get("changes") or {}
    return ", ".join(f"{k}={_fmt(v)}" for k, v in changes.items()) or "(base config)"


def _mean_acc(runs: list) -> str:
    scores = [sum(r.values()) / len(r) for r in runs if r]
    if not scores:
        return "-"
    return (f"{statistics.mean(scores):.3f} (mean of {len(scores)} runs)" if len(scores) > 1
            else f"{scores[0]:.3f} (1 run)")


def _held_out_row(trials: list[dict[str, Any]], best: dict[str, Any],
                  baseline: dict[str, Any] | None, same: bool, split: str) -> list[str] | None:
    """The Result row of a split read once in the final check (test, transfer), with runs as
    the unit where each arm has several; None where the split was not read."""
    arms = test_verdicts(trials, best["id"], split)
    if arms:
        gain, over_runs = held_out_gain(*arms)
        if over_runs is not None:
            return [f"{split} (runs)", _mean_acc(arms[1]), _mean_acc(arms[0]),
                    _diff(gain) + " over runs"]
        return [f"{split} (runs read)", _mean_acc(arms[1]), _mean_acc(arms[0]),
                _diff(gain) + " over tasks"]
    unread = _fresh_runs_not_read(trials)
    if unread and not same:
        return [split, "-", "-", f"not read: fresh run(s) {', '.join(unread)} did not finish "
                "(see the journal; `autoresearch resume` runs the check again)"]
    runs = _scored_runs(trials, best["config_key"], split)
    if same and len(runs) > 1:
        return [f"{split} (runs)", _runs_cell(runs), _runs_cell(runs), "-"]
    if split != "test" and not (best.get(split) or (baseline or {}).get(split)):
        return None
    return [split, _acc(baseline, split), _acc(best, split),
            "-" if same else _diff(_paired(best, baseline, split))]


def _fresh_runs_not_read(trials: list[dict[str, Any]]) -> list[str]:
    """The final check's fresh runs that crashed or stopped, when an arm was left unread by
    them: a test row must say why it is empty rather than show a dash."""
    return [t["id"] for t in trials
            if t["role"] == "fresh" and t["status"] in ("crashed", "stopped")]


def with_transfer(trials: list[dict[str, Any]], events: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Trials with the transfer split's verdicts (journaled as events by the final check) under
    `transfer`, as `test` holds the test split's, so both are reported the same way."""
    read = {e["trial_id"]: e["data"] for e in events
            if e["kind"] == "transfer" and (e["data"] or {}).get("verdicts")}
    return [{**t, "transfer": read[t["id"]]} if t["id"] in read else t for t in trials]


def _against_warmup_blocks(trials: list[dict[str, Any]],
                           best: dict[str, Any] | None) -> list[Block]:
    """Every scored trial against the warm-up checkpoint it forked from: did RL help at all?"""
    if not any(t["role"] == "warmup" for t in trials):
        return []
    rows, worse, better = [], [], []
    for t in trials:
        if t["role"] not in ("baseline", "explore"):
            continue
        warmup = warmup_of(t, trials)
        gain = against_warmup(t, warmup)
        if gain is None or warmup is None:
            continue
        word = ("behind on its run" if gain.high < 0 else
                "ahead on its run" if gain.low > 0 else "no difference over tasks")
        (worse if gain.high < 0 else better if gain.low > 0 else []).append(t["id"])
        rows.append([t["id"], t["status"], _acc(t), warmup["id"], _diff(gain), word])
    if not rows:
        return []
    summary = (f"One run each, over tasks: RL's run scored below the warm-up it started from "
               f"in {len(worse)} of {len(rows)} trials ({', '.join(worse)}). " if worse else "")
    if better:
        summary += f"RL's run scored above the warm-up in {', '.join(better)}. "
    summary = _base_runs_against_warmup(trials) + summary
    if best is not None and best["id"] in worse:
        summary += ("The best config's run scored below stopping after the warm-up; whether "
                    "its config does is for runs as the unit (above) to say.")
    elif best is not None and best["id"] not in better:
        summary += "The best config's run did not score above the warm-up over tasks."
    return [Block("h2", "Against the warm-up"), Block("p", (
        "Below, each trial's dev score minus that of the warm-up checkpoint it started from, "
        "paired per task, 95% CI: one run each, so a row leaves that run's luck out. "
        + summary).strip()),
        Block("table", headers=["trial", "status", "dev accuracy", "started from", "vs warm-up",
                                "reading"], rows=rows)]


def _base_runs_against_warmup(trials: list[dict[str, Any]], split: str = "dev") -> str:
    """The base config's runs (baseline, seed bank, re-runs) against the warm-up they forked
    from, with runs as the unit: the sentence to quote about whether RL beat the warm-up."""
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    if baseline is None:
        return ""
    return _runs_against_warmup(trials, baseline, _scored_runs(trials, baseline["config_key"],
                                                               split), "the base config", split)


def _arms_against_warmup(trials: list[dict[str, Any]], best: dict[str, Any], split: str) -> str:
    """On test or transfer: each config whose runs the final check read, against the warm-up.
    After a keep these are the fresh runs of both arms; with nothing kept, the base config's."""
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    if baseline is None or best["id"] == baseline["id"]:
        return _base_runs_against_warmup(trials, split)
    said = []
    for arm, who in zip(test_arms(trials, best["id"]),
                        (f"the best config ({best['id']})", "the base config"), strict=True):
        read = [t[split]["verdicts"] for t in arm if (t.get(split) or {}).get("verdicts")]
        said.append(_runs_against_warmup(trials, baseline, read, who, split)
                    or f"No run of {who} was read on {split}, so it is not set against the "
                       "warm-up. ")
    return "".join(said)


def _runs_against_warmup(trials: list[dict[str, Any]], forked: dict[str, Any],
                         verdicts: list[dict[str, bool]], who: str, split: str) -> str:
    """One config's runs on `split` against the warm-up `forked` started from: a mean over runs
    minus the warm-up's one read, the interval unclipped so that the difference is honest; one
    run is paired with the warm-up per task (its Wilson interval less a fixed warm-up score
    would treat the warm-up's answers on these tasks as exact, and claim a gain that the same
    pairing against the base config calls noise)."""
    warmup = warmup_of(forked, trials)
    start = ((warmup or {}).get(split) or {}).get("verdicts")
    if not start:
        return ""
    runs = [r for r in ({k: ok for k, ok in one.items() if k in start} for one in verdicts) if r]
    if not runs:
        return ""
    tasks = sorted(set.intersection(*(set(r) for r in runs)))
    base = sum(bool(start[k]) for k in tasks) / len(tasks)
    est = run_mean([{k: r[k] for k in tasks} for r in runs], clip=False)
    if len(runs) > 1:
        gain = Estimate(est.value - base, est.low - base, est.high - base, est.n)
        over = f"a 95% t-interval over its {len(runs)} runs, each run's luck included"
    else:  # one run: paired per task with the warm-up, whose answers vary with the tasks too
        gain = paired_difference([float(runs[0][k]) for k in tasks],
                                 [float(start[k]) for k in tasks])
        over = (f"one run, paired per task over {len(tasks)} tasks: its luck is not included, "
                "so this cannot speak for the config")
    word = ("beat" if gain.low > 0 else "fell below" if gain.high < 0 else
            "did not differ beyond noise from")
    return (f"With runs as the unit, {who}'s RL {word} the warm-up ({warmup['id']}): "
            f"mean {split} accuracy {est.value:.3f} over {len(runs)} run(s) against {base:.3f}, "
            f"a difference of {_diff(gain)} ({over}). ")


def _seed_bank_blocks(trials: list[dict[str, Any]], budget: dict[str, Any]) -> list[Block]:
    """The base config's runs on several seeds: how much one run's dev score moves by luck,
    and the smallest gain a confirmation can find against it."""
    bank = [t for t in trials if t["role"] in ("baseline", "bank")
            and t.get("dev_accuracy") is not None]
    if len([t for t in trials if t["role"] == "bank"]) == 0:
        return []
    scores = [float(t["dev_accuracy"]) for t in bank]
    sd = statistics.stdev(scores) if len(scores) > 1 else None
    spread = (f"run-to-run SD {sd:.3f} ({len(scores) - 1} df)" if sd is not None
              else "no spread yet (fewer than two finished runs)")
    runs = ", ".join(f"{t['id']} seed {t['seed']}: {float(t['dev_accuracy']):.3f}" for t in bank)
    power = ""
    if sd is not None:
        rule = KeepRule(ErrorBudget.for_study(budget["alpha"], budget["confirm_seeds"],
                                              budget["max_confirm_trials"]))
        tasks = len((bank[0].get("dev") or {}).get("verdicts") or {})
        tested = floored_run_spread(sd, statistics.fmean(scores), tasks) if tasks else sd
        gain = detectable_gain(tested, len(scores) - 1, budget["confirm_seeds"],
                               rule.budget.per_confirmation)
        if gain is not None:
            power = (f" With {budget['confirm_seeds']} re-run(s) a side at alpha "
                     f"{rule.budget.per_confirmation:.4g}, a confirmation, once reached, finds "
                     f"a true dev gain of about {gain:.3f} with 80% power (the spread the test "
                     f"uses, {tested:.3f}: this one, never below a run's answer noise; from the "
                     "bank alone, the re-runs add degrees of freedom); smaller gains are mostly "
                     "missed, and the study's chance of keeping one is lower still (its first "
                     "looks must pick it out).")
    return [Block("h2", "Run-to-run noise (seed bank)"), Block("p", (
        f"The base config on {len(bank)} seeds scored {runs} on dev: {spread}. A first look "
        "compares a candidate with the mean of these runs, not with one of them. A "
        "confirmation keeps a change only if it is ahead both per task and per run, with runs "
        "as the unit: this spread pooled with the re-runs' own where the candidate's runs "
        "spread no more than these, else each config's own spread (Welch)." + power))]


def build(journal: Journal) -> list[Block]:
    study = journal.study()
    spec = study["spec"]
    trials = with_transfer(journal.trials(), journal.events())
    explored = [t for t in trials if t["role"] in ("baseline", "explore")]
    confirms = [t for t in trials if t["role"] == "confirm"]
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    best = next((t for t in trials if t["id"] == study["best_trial"]), None)
    blocks = [Block("h1", f"Study {study['name']}")]

    budget = spec["budget"]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    blocks.append(Block("p", (
        f"Goal: maximise {spec['goal'].replace('_', ' ')}. Proposer: {spec['proposer']['kind']}; "
        f"executor: {spec['executor']['kind']} with {spec['executor']['max_parallel_trials']} "
        f"trial(s) in parallel; state: {study['state']}. "
        f"Trials: {len(explored)} of {budget['max_trials']} explored, {len(confirms)} of "
        f"{budget['max_confirm_trials']} confirmation re-runs ("
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "). "
        f"Cost: {sum(t['steps'] or 0 for t in trials)} steps, "
        f"{sum(t['tokens'] or 0 for t in trials)} tokens, "
        f"{sum(t['wall_seconds'] or 0 for t in trials):.0f} trial-seconds.")))

    blocks += [Block("p", e["message"]) for e in journal.events() if e["kind"] == "power"][:1]
    blocks += _warmup_blocks(journal, trials)
    blocks += _against_warmup_blocks(trials, best)
    blocks += _seed_bank_blocks(trials, budget)

    blocks.append(Block("h2", "Result"))
    unfinished_study = study["state"] != "finished"
    if unfinished_study:
        open_trials = [t["id"] for t in trials if t["status"] not in FINISHED + ("crashed",)]
        blocks.append(Block("p", (
            f"This study is unfinished (state: {study['state']}); what follows is the state so "
            "far, not its conclusion. "
            + (f"Trials without a verdict because they did not finish: {', '.join(open_trials)}. "
               if open_trials else "")
            + f"`autoresearch resume {journal.path.parent}` continues it.")))
    if best is None:
        blocks.append(Block("p", "No trial finished: there is no best config yet."))
    else:
        dev_gain = _paired(best, baseline, "dev")
        same = baseline is not None and best["id"] == baseline["id"]
        arms = test_verdicts(trials, best["id"])
        runs_test = None
        if arms:
            test_gain, runs_test = held_out_gain(*arms)
        else:
            test_gain = _paired(best, baseline, "test")
        held_out_rows = [_held_out_row(trials, best, baseline, same, split)
                         for split in ("test", "transfer")]
        if unfinished_study:
            headline = (f"Best so far: {best['id']} ({_changes(best)}); no verdict on the study "
                        "until it finishes.")
        else:
            headline = ("No proposed change beat the baseline beyond noise: the base config "
                        "stays the best." if same else
                        f"Best config: {best['id']} ({_changes(best)}).")
        blocks.append(Block("p", headline))
        rows = [*_dev_rows(trials, best, baseline, same, dev_gain),
                *(row for row in held_out_rows if row is not None)]
        blocks.append(Block("table", headers=[
            "split", f"base config (baseline {baseline['id'] if baseline else '-'})",
            f"best config ({best['id']})", "best - base (95% CI)"], rows=rows))
        if any(row[0].endswith(")") and "runs" in row[0] for row in rows):
            blocks.append(Block("p", "A config's accuracy over several runs has a 95% "
                                "confidence interval for its mean, with runs and questions both "
                                "sampled (the config's expected accuracy on questions of the "
                                "same kind; one more run would scatter more widely than this); "
                                "its difference from the base config is paired on the same "
                                "questions, over runs."))
        if not same and test_gain is not None and not unfinished_study:
            verdict = ("improves" if test_gain.low > 0 else "hurts" if test_gain.high < 0
                       else "does not measurably change")
            fresh = any(t["role"] == "fresh" for t in trials)
            source = ("fresh runs made for this check, whose luck no dev decision selected"
                      if fresh else "its confirmation re-runs, not the look that selected it, "
                      "though their luck is what kept it")
            if runs_test is not None:
                half = (test_gain.high - test_gain.low) / 2
                blocks.append(Block("p", (
                    f"On the held-out test split, read once for {len(arms[0])} independent "
                    f"runs of the best config ({source}) and {len(arms[1])} of the base "
                    f"config, the best config "
                    f"{verdict} execution accuracy relative to the baseline "
                    f"({_diff(test_gain)}, a 95% interval over runs, so it holds each run's "
                    f"luck as well as the draws of its answers; "
                    f"{runs_test.describe_spread()}). This check cannot tell "
                    f"apart changes smaller than about {half:.3f}.")))
            else:
                read = (f", read once for {len(arms[0])} run(s) of the best config ({source}) "
                        f"and {len(arms[1])} of the base config and " if arms else ", ")
                blocks.append(Block("p", f"On the held-out test split{read}paired over "
                                    f"{test_gain.n} tasks, the best config {verdict} "
                                    f"execution accuracy relative to the baseline "
                                    f"({_diff(test_gain)}). With one run on a side the "
                                    "interval holds the draws of the answers but not the "
                                    "luck of the runs: it is narrower than the truth."))
        on_test = _arms_against_warmup(trials, best, "test")
        if on_test and not unfinished_study:
            blocks.append(Block("p", "On the test split, read once with the warm-up beside "
                                "them: " + on_test.strip()))
        on_transfer = _arms_against_warmup(trials, best, "transfer")
        if on_transfer and not unfinished_study:
            blocks.append(Block("p", "On the transfer split (hand-written questions on "
                                "databases no corpus has), read in the same check: "
                                + on_transfer.strip()))
        spec_cfg = TrialConfig.model_validate(spec["base_trial"])
        # trials of a study read dev only; shown as a standalone trial would run it
        shown = {"eval.test_tasks": spec_cfg.eval.test_tasks,
                 "eval.transfer_tasks": spec_cfg.eval.transfer_tasks,
                 "eval.baseline": spec_cfg.eval.baseline}
        best_cfg = TrialConfig.model_validate(best["config"]).with_changes(shown)
        # Compared with the baseline as it ran, so what the runner adds to every trial (the
        # warm-up checkpoint, the pruning evaluations) is not mistaken for a change.
        base_cfg = (TrialConfig.model_validate(baseline["config"]).with_changes(shown)
                    if baseline and baseline.get("config") else spec_cfg)
        diff = config_diff(best_cfg, base_cfg)
        blocks.append(Block("h2", "Best config"))
        if diff:
            blocks.append(Block("table", headers=["field", "base", "best"], rows=[
                [path, _fmt(d["from"]), _fmt(d["to"])] for path, d in diff.items()]))
        blocks.append(Block("code", best_cfg.to_yaml()))
        if best.get("checkpoint"):
            blocks.append(Block("p", f"Checkpoint: {best['checkpoint']}"))

    blocks.append(Block("h2", "Leaderboard (dev split)"))
    ranked = sorted(explored, key=lambda t: (t["dev_accuracy"] is None,
                                             -(t["dev_accuracy"] or 0), t["number"]))
    rows = []
    for rank, t in enumerate(ranked, 1):
        gain = _paired(t, baseline, "dev") if baseline and t is not baseline else None
        status = t["status"]
        if status not in FINISHED and t.get("progress"):
            status += f" ({where(t['progress'])})"
        rows.append([str(rank), t["id"], status, _acc(t), _diff(gain),
                     str(t["steps"] or "-"), str(t["tokens"] or "-"),
                     f"{t['wall_seconds']:.0f}" if t["wall_seconds"] else "-", t["proposer"],
                     _changes(t)])
    blocks.append(Block("table", headers=["#", "trial", "status", "dev accuracy [95% CI]",
                                          "vs baseline run (tasks)", "steps", "tokens",
                                          "wall s", "proposer", "changes"], rows=rows))
    blocks.append(Block("p", "Each row is one run. Its difference from the baseline's run is "
                        "paired over dev tasks: it holds the draws of the answers, not the luck "
                        "of the runs, so it cannot speak for a config; the Result's rows over "
                        "runs do."))

    series = []
    all_steps: dict[str, list[dict[str, Any]]] = {}
    for s in journal.query("SELECT trial_id, phase, reward_mean, loss FROM steps "
                           "ORDER BY trial_id, phase = 'rl', step"):
        all_steps.setdefault(s["trial_id"], []).append(s)
    for t in trials:
        steps = all_steps.get(t["id"], [])
        rl = [s["reward_mean"] for s in steps
              if s["phase"] == "rl" and s["reward_mean"] is not None]
        sft = [s["loss"] for s in steps if s["phase"] == "sft" and s["loss"] is not None]
        if sft:
            series.append((f"{t['id']} SFT loss", sft))
        if rl:
            series.append((f"{t['id']} RL mean reward", rl))
    if series:
        blocks.append(Block("h2", "Curves"))
        blocks.append(Block("curves", series=series))
    blocks += _signal_blocks(journal, trials)
    blocks += _dev_curve_blocks(journal, trials)
    transfer = [e for e in journal.events() if e["kind"] == "transfer"]
    if transfer:
        blocks.append(Block("h2", "Transfer (databases no corpus has)"))
        blocks.append(Block("p", "Read once, in the final check beside test, for the same "
                            "runs: " + "; ".join(e["message"].removeprefix(
                                "transfer split read once for ") for e in transfer) + "."))
    pruned = [e for e in journal.events() if e["kind"] == "pruning"]
    if pruned:
        blocks.append(Block("h2", "Pruning"))
        blocks.append(Block("p", "Trials score a fixed dev subset during training; a candidate "
                            "stops early only when the pruner ranks it out and it trails the "
                            "best score at the same step by more than the noise margin. "
                            "Pruned trials are never kept; their unspent steps stay in the "
                            "budget."))
        blocks.append(Block("table", headers=["trial", "step", "why"], rows=[
            [e["trial_id"], str((e["data"] or {}).get("step", "-")), e["message"]]
            for e in pruned]))

    decisions = journal.decisions()
    rule = _keep_rule(spec)
    budgets = [e for e in journal.events() if e["kind"] == "error budget"]
    redeclared = ErrorBudget.journaled(budgets[-1]["data"] or {}) if budgets else None
    if redeclared is not None:  # re-declared mid-study
        rule = replace(rule, budget=redeclared)
    blocks.append(Block("h2", "Decisions"))
    blocks.append(Block("p", "Keep rule: " + rule.describe()))
    if decisions:
        blocks.append(Block("table", headers=[
            "candidate", "against", "rule", "difference [95% CI]", "tasks", "seeds",
            "wins/losses", "one-sided p", "alpha", "what the rule concluded"], rows=[
            [d["candidate"], d["incumbent"] or "-", d["rule"],
             _diff(Estimate(d["difference"], d["low"], d["high"], d["n"] or 0))
             if d["difference"] is not None else "-", str(d["n"] or "-"),
             str(d["seeds"] or "-"), _wins(d), _num(d.get("p_value")), _num(d.get("alpha")),
             d.get("conclusion") or decision_text(d)] for d in decisions]))

    blocks.append(Block("h2", "What the agent learned"))
    lessons = []
    for t in explored:
        if t["role"] == "baseline":
            continue
        d = t.get("decision") or {}
        hypothesis = (t["rationale"] or "").strip()
        if t["status"] == "kept":
            lessons.append(f"Confirmed ({t['id']}, {_changes(t)}; {decision_text(d)}): "
                           f"{hypothesis}")
        elif t["status"] == "discarded":
            lessons.append(f"Not supported ({t['id']}, {_changes(t)}; {decision_text(d)}): "
                           f"{hypothesis}")
        elif t["status"] == "crashed":
            last = (t["error"] or "").strip().splitlines()[-1:] or ["unknown error"]
            lessons.append(f"Crashed ({t['id']}, {_changes(t)}): {last[0]}")
        elif t["status"] == "pruned":
            lessons.append(f"Pruned early ({t['id']}, {_changes(t)}): {t['error'] or ''}")
        elif t["status"] == "stopped" and (t.get("progress") or {}).get("interrupted"):
            lessons.append(f"No verdict: interrupted before it finished ({t['id']}, "
                           f"{_changes(t)}; {where(t['progress'])})")
        elif t["status"] == "stopped":
            lessons.append(f"No verdict: stopped on request before it finished ({t['id']}, "
                           f"{_changes(t)})")
        elif t["status"] in ("queued", "running", "done"):
            lessons.append(f"No verdict yet ({t['id']}, {_changes(t)}: {t['status']})")
    blocks.append(Block("list", items=lessons or ["Nothing yet: no candidate was decided."]))
    proposals = journal.proposals()
    outcomes: dict[str, int] = {}
    for p in proposals:
        outcomes[p["outcome"]] = outcomes.get(p["outcome"], 0) + 1
    if outcomes:
        blocks.append(Block("p", "Proposals: " + ", ".join(
            f"{n} {o}" for o, n in sorted(outcomes.items())) + "."))
    environments = list(dict.fromkeys(e["message"] for e in journal.events()
                                      if e["kind"] == "environment"))
    if environments:
        blocks.append(Block("h2", "Environment"))
        blocks.append(Block("p", (
            "The same seeds give the same numbers only in the same environment: another CPU "
            "or instruction set, thread count, dtype or package version changes the kernels' "
            "order of summation and with it the low bits. "
            + ("This study ran in one environment." if len(environments) == 1 else
               f"This study ran in {len(environments)} environments (it was resumed "
               "elsewhere): its numbers mix them."))))
        blocks.append(Block("list", items=environments))
    return blocks


def _warmup_blocks(journal: Journal, trials: list[dict[str, Any]]) -> list[Block]:
    """The warm-up's effect: dev accuracy of the starting weights and after the warm-up, on
    the same fixed dev tasks, with the paired difference."""
    warmups = [t for t in trials if t["role"] == "warmup"]
    if not warmups:
        return []
    blocks = [Block("h2", "Warm-up")]
    for row in warmups:
        blocks += _one_warmup_blocks(journal, row, several=len(warmups) > 1)
    return blocks


def _one_warmup_blocks(journal: Journal, row: dict[str, Any], several: bool) -> list[Block]:
    from autoresearch.study.warmup import warmup_effect

    blocks = [Block("p", row["rationale"] or "")]
    effect = warmup_effect(journal, row["id"])
    if row["status"] != "done":
        blocks.append(Block("p", f"The warm-up is {row['status']}: {row['error'] or ''}"))
    if effect is not None:
        before, after = effect
        x, y = paired_items(after["verdicts"], before["verdicts"])
        gain = paired_difference(x, y) if x else None
        acc = {k: Estimate(**v["accuracy"]) for k, v in (("before", before), ("after", after))}
        blocks.append(Block("table", headers=["dev split", "accuracy [95% CI]"], rows=[
            ["base (before the warm-up)", str(acc["before"])],
            ["after the warm-up", str(acc["after"])],
            ["after - before (paired, 95% CI)", _diff(gain)]]))
    if row.get("checkpoint"):
        who = ("Every trial that chooses it" if row["id"] != WARMUP_ID else
               "Every trial that chooses no other warm-up" if several else "Every trial")
        blocks.append(Block("p", f"{who} starts from {row['checkpoint']}."))
    return blocks


def _signal_blocks(journal: Journal, trials: list[dict[str, Any]]) -> list[Block]:
    """What each trial's RL steps learned from: per step, the groups it trained on (rewards
    that differed) of those it drew, and its mean reward. A step that trains on no group
    changes nothing; one the draw cap ended short says so with a `*`."""
    by_trial: dict[str, list[dict[str, Any]]] = {}
    for s in journal.query("SELECT trial_id, step, reward_mean, metrics FROM steps "
                           "WHERE phase = 'rl' ORDER BY trial_id, step"):
        by_trial.setdefault(s["trial_id"], []).append(s)
    rows = []
    for t in trials:
        steps = by_trial.get(t["id"])
        if not steps:
            continue
        metrics = [s["metrics"] or {} for s in steps]  # the journal parses JSON columns
        used = [int(m.get("groups_used", 0)) for m in metrics]
        drawn = [int(m.get("groups_drawn", m.get("groups_used", 0)
                       + m.get("groups_dropped", 0))) for m in metrics]
        per_step = " ".join(f"{u}/{d}{'*' if m.get('draw_capped') else ''}"
                            for u, d, m in zip(used, drawn, metrics))
        rewards = " ".join(f"{s['reward_mean']:.2f}" for s in steps
                           if s["reward_mean"] is not None)
        samples = sum(int(m.get("samples_drawn", 0)) for m in metrics)
        rows.append([t["id"], per_step, f"{sum(used)} of {sum(drawn)}",
                     str(sum(1 for u in used if u == 0)), str(samples or "-"), rewards])
    if not rows:
        return []
    return [Block("h2", "Learning signal per RL step"),
            Block("p", "Groups trained on (their rewards differed) of groups drawn, per step "
                  "(`*`: the draw cap ended the step short); a step with none changes nothing."),
            Block("table", headers=["trial", "groups per step", "in all", "empty steps",
                                    "samples", "mean reward per step"], rows=rows)]


def _dev_curve_blocks(journal: Journal, trials: list[dict[str, Any]]) -> list[Block]:
    """Each trial's dev accuracy along training: the subset scores pruning reads, then the
    final score on the whole dev set."""
    rows = journal.query("SELECT trial_id, stage, accuracy, n FROM evals "
                         "WHERE split = 'dev' ORDER BY time")
    by_trial: dict[str, list[str]] = {}
    for r in rows:
        by_trial.setdefault(r["trial_id"], []).append(
            f"{r['stage']}: {r['accuracy']:.3f} (n={r['n']})")
    lines = [[t["id"], t["status"], " -> ".join(by_trial[t["id"]])]
             for t in trials if t["id"] in by_trial]
    if not lines:
        return []
    return [Block("h2", "Dev accuracy along training"),
            Block("table", headers=["trial", "status", "dev accuracy by stage"], rows=lines)]


# ------------------------------------------------------------ rendering
def _spark(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(SPARKS[min(7, int((v - lo) / span * 7.999))] for v in values)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}")
        elif b.kind == "h2":
            out.append(f"## {b.text}")
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "code":
            out.append(f"```yaml\n{b.text.rstrip()}\n```")
        elif b.kind == "list":
            out.append("\n".join(f"- {item}" for item in b.items or []))
        elif b.kind == "table":
            lines = ["| " + " | ".join(b.headers or []) + " |",
                     "|" + "---|" * len(b.headers or [])]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows or []]
            out.append("\n".join(lines))
        elif b.kind == "curves":
            out.append("\n".join(f"- `{label}`: {_spark(vals)} ({vals[0]:.3f} -> {vals[-1]:.3f})"
                                 for label, vals in b.series or []))
    return "\n\n".join(out) + "\n"


def write_report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write the study's Markdown report (`report.md` beside the journal, unless `out`)."""
    journal = Journal(directory, read_only=True)
    target = Path(out) if out else journal.path.parent / "report.md"
    target.write_text(to_markdown(build(journal)), encoding="utf-8")
    return target


def status(directory: str | Path, now: float | None = None) -> str:
    """A short plain-text view of a study for `autoresearch status`: its state, every trial's
    status and score, and where each unfinished trial is (phase, step of total, last metrics,
    time left), all read from the journal, wherever the study runs."""
    import time

    now = time.time() if now is None else now
    journal = Journal(directory, read_only=True)
    study = journal.study()
    lines = [f"study {study['name']} ({study['state']}), best: {study['best_trial'] or '-'}"]
    for t in journal.trials():
        lines.append(f"  {t['id']} {t['role']:<8} {t['status']:<9} dev {_acc(t):<24} "
                     f"{_changes(t)[:70]}")
        if t["status"] not in FINISHED and t["status"] != "queued" and t.get("progress"):
            live = t["status"] == "running" and study["state"] == "running"
            lines.append(f"      {describe(t['progress'], now if live else None)}")
        decision = t.get("decision") or {}
        if t["status"] in ("kept", "discarded") and decision:
            lines.append(f"      {decision.get('conclusion') or decision_text(decision)}")
    spent = journal.query("SELECT count(*) AS n, sum(tokens) AS tokens, (SELECT count(*) FROM "
                          "steps) AS steps FROM trials")[0]
    lines.append(f"  {spent['n']} trials, {spent['steps']} steps journaled, "
                 f"{spent['tokens'] or 0} tokens in finished trials")
    if study["state"] == "interrupted":
        lines.append(f"  interrupted: `autoresearch resume {journal.path.parent}` continues it")
    return "\n".join(lines)
