"""The `autoresearch` command line.

    autoresearch run study.yaml [--out DIR]     run a study unattended, then write its report
    autoresearch status DIR                     trials, statuses and scores from the journal
    autoresearch resume DIR                     continue a stopped study where it stopped
    autoresearch report DIR [--format html]     leaderboard, best config, curves, lessons
    autoresearch trial --config trial.yaml [--server-url URL] [--out DIR]
    autoresearch eval --database shop.duckdb --questions q.jsonl [--trial DIR] [--split dev]

Without a server URL (the study's `server_url`, `--server-url` or `TINKER_BASE_URL`) trials run
on the embedded training server in this process. API keys come from the environment
(`TINKER_API_KEY`, `GEMINI_API_KEY`, `OPENAI_API_KEY`), never from a config file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from autoresearch.rl.config import TrialConfig
from autoresearch.study.expected_time import Machine, expected_time_lines


@contextlib.contextmanager
def server_url(url: str | None, data_dir: Path, model: str | None = None) -> Iterator[str]:
    """The given server, or an embedded one (serving `model`, default the packaged one) for
    the duration of the block."""
    url = url or os.environ.get("TINKER_BASE_URL")
    if url:
        yield url
        return
    from server.entrypoints.runtime import ServerConfig, ServerThread

    with ServerThread(ServerConfig(model=model, port=0, data_dir=data_dir)) as server:
        yield server.url


def _api_key() -> str:
    return os.environ.get("TINKER_API_KEY") or "tml-local"


def cmd_trial(args: argparse.Namespace) -> int:
    from autoresearch.rl.progress import TrialProgress
    from autoresearch.rl.trial import run_trial

    config = TrialConfig.from_file(args.config)
    out = Path(args.out or Path("runs") / f"{config.name}-{config.fingerprint()}")
    progress = TrialProgress(config, config.name)
    try:
        with server_url(args.server_url, out / "server-data") as url:
            result = run_trial(config, out, url, _api_key(), progress)
    finally:
        progress.close()
    summary = {
        "directory": str(result.directory),
        "dev_accuracy": (result.dev or {}).get("accuracy"),
        "test_accuracy": (result.test or {}).get("accuracy"),
        "steps": result.steps,
        "tokens": result.tokens,
        "wall_seconds": result.wall_seconds,
        "checkpoint": result.checkpoint,
    }
    print(json.dumps(summary, indent=2))
    from autoresearch.study.executors.base import result_line

    print(result_line(result), flush=True)  # what a study's Kubernetes executor reads
    return 0


def _eval_config(args: argparse.Namespace) -> tuple[TrialConfig, str | None, Path | None]:
    """The config that says what to score and how, the checkpoint, and where an embedded
    server finds it: from `--trial` (its config, final checkpoint and server data), or
    `--config`, then the command line's overrides."""
    from autoresearch.rl.record import CONFIG_FILE, TrialRecord

    checkpoint, data_dir = args.checkpoint, args.data_dir
    if args.trial is not None:
        config = TrialConfig.from_file(args.trial / CONFIG_FILE)
        final = TrialRecord(args.trial).final()
        if final is None and checkpoint is None:
            raise SystemExit(f"{args.trial} has not finished: give --checkpoint")
        checkpoint = checkpoint or final["checkpoint"]
        if data_dir is None:
            data_dir = next((d / "server-data" for d in (args.trial, args.trial.parent.parent)
                             if (d / "server-data").is_dir()), None)
    elif args.config is not None:
        config = TrialConfig.from_file(args.config)
    else:
        config = TrialConfig()
    data = config.model_dump(mode="json")
    chosen = [bool(args.questions or args.database), bool(args.spider), bool(args.bird),
              bool(args.corpus)]
    if sum(chosen) > 1:
        raise SystemExit("choose one of --database/--questions, --spider, --bird, --corpus")
    if args.questions or args.database:
        if not (args.questions and args.database):
            raise SystemExit("a database source needs --database (one or more) and --questions")
        data["tasks"] = {"source": "database", "path": str(args.questions),
                         "databases": [str(d) for d in args.database]}
    elif args.spider or args.bird:
        data["tasks"] = {"source": "spider" if args.spider else "bird",
                         "path": str(args.spider or args.bird), "dev_fraction": 0.1,
                         "test_fraction": 0.0}
    elif args.corpus:
        data["tasks"], data["corpus"] = None, args.corpus
    if data.get("tasks"):
        for option, field in (("dialect", "dialect"), ("split_seed", "split_seed")):
            if getattr(args, option) is not None:
                data["tasks"][field] = getattr(args, option)
    for option, dotted in (("vote", "eval.vote"), ("max_tokens", "eval.max_tokens"),
                           ("sample_rows", "prompt.sample_rows"),
                           ("max_schema_chars", "prompt.max_schema_chars"),
                           ("prompt_style", "prompt_style"), ("tokenizer", "tokenizer"),
                           ("base_model", "base_model")):
        value = getattr(args, option)
        if value is not None:
            section, _, leaf = dotted.rpartition(".")
            (data[section] if section else data)[leaf] = value
    if args.snap:
        data["eval"]["snap_names"] = data["eval"]["snap_values"] = True
    return TrialConfig.model_validate(data), checkpoint, data_dir


def _score(args: argparse.Namespace, split: str, limit: int | None) -> tuple[dict, str]:
    """What `eval` and `holdout` both do: the config and checkpoint the command line names,
    scored on `split` through the given server or an embedded one; with what was named (the
    checkpoint, else the config's base model)."""
    from autoresearch.rl.checkpoint_eval import EvalRequest, score

    config, checkpoint, data_dir = _eval_config(args)
    served = args.trial is None and args.config is None and args.base_model is None
    request = EvalRequest(config, split, checkpoint, limit, served)
    model = args.model or (config.base_model if Path(config.base_model).is_dir() else None)
    with server_url(args.server_url, data_dir or Path("runs") / "server-data", model) as url:
        return score(request, url, _api_key()), checkpoint or config.base_model


def cmd_eval(args: argparse.Namespace) -> int:
    from autoresearch.rl.checkpoint_eval import report_lines, write_answer

    answer, named = _score(args, args.split, args.limit)
    label = named.rstrip("/").replace("tinker://", "")
    out = args.out or Path("runs") / "eval" / f"{label.replace('/', '_')}-{args.split}.json"
    print("\n".join(report_lines(answer, args.worst)))
    print(f"written: {write_answer(answer, out)}")
    return 0


def cmd_holdout(args: argparse.Namespace) -> int:
    """Score the frozen held-out split once and append the read to its ledger, after the
    ledger's rules allow it: an intact chain, committed code, the recipe's budget not spent."""
    from autoresearch.rl import holdout_ledger
    from autoresearch.rl.checkpoint_eval import report_lines
    from autoresearch.rl.record import CONFIG_FILE

    ledger = holdout_ledger.ledger_path()
    source = args.trial / CONFIG_FILE if args.trial is not None else args.config
    config = TrialConfig.from_file(source) if source is not None else TrialConfig()
    if args.base_model is not None:
        config = config.with_changes({"base_model": args.base_model})
    recipe = holdout_ledger.recipe_key(config, None if source else args.checkpoint)
    try:
        before = len(holdout_ledger.reads(ledger))
        code = holdout_ledger.committed_code()
        left = holdout_ledger.check_budget(recipe, ledger)
    except holdout_ledger.LedgerRefused as refused:
        raise SystemExit(f"held-out read refused: {refused}") from None
    print(f"the held-out split has been read {before} time(s) before (ledger {ledger}); "
          f"recipe {recipe} has {left} of {holdout_ledger.READS_PER_RECIPE} reads left")
    answer, _ = _score(args, "holdout", None)
    print("\n".join(report_lines(answer, 0)))
    line = holdout_ledger.entry(answer, ["autoresearch", *args.argv], args.note, recipe, code)
    count = holdout_ledger.append(line, ledger)
    print(f"appended to {ledger}: read {count}")
    return 0


class _ProgressLogHandler(logging.Handler):
    """Study log lines printed through the progress display, so they never tear its bars."""

    def __init__(self, display) -> None:
        super().__init__()
        self.display = display
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.display.write(self.format(record))


def _study_logging(display) -> None:
    handler = _ProgressLogHandler(display)
    for name in ("autoresearch.study.runner", "autoresearch.study.executors.kubernetes",
                 "autoresearch.study.warmup"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


def _quiet_after_stop(signum, frame) -> None:  # noqa: ARG001
    """The first Ctrl-C or SIGTERM stops the study; what follows is its consequence, not news:
    a second signal is ignored and threads that trip over the shutdown stay silent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.excepthook = lambda args: None
    logging.disable(logging.CRITICAL)
    raise KeyboardInterrupt


def _interrupted_line(directory: Path) -> str:
    """One line: where the unfinished trials stopped and how to go on."""
    from autoresearch.rl.progress import where
    from autoresearch.ui.snapshot import read_snapshot

    snapshot = read_snapshot(directory)
    stopped = [] if snapshot is None else [
        f"{t['id']} stopped in {where(t.get('progress'))}" for t in snapshot.trials
        if t["status"] == "stopped" and (t.get("progress") or {}).get("interrupted")]
    detail = f": {'; '.join(stopped)}" if stopped else ""
    return f"study interrupted{detail}; continue it with `autoresearch resume {directory}`"


def _run_unattended(start, directory: Path) -> int:
    """Run a study with a progress line per trial; on SIGTERM or Ctrl-C stop at once with one
    line (the journal marks the study interrupted and allows a resume)."""
    from autoresearch.rl.progress import StudyProgress

    display = StudyProgress()
    signal.signal(signal.SIGTERM, _quiet_after_stop)
    signal.signal(signal.SIGINT, _quiet_after_stop)
    _study_logging(display)
    try:
        outcome = start(display)
    except KeyboardInterrupt:
        display.close()
        try:
            line = _interrupted_line(directory)
        except Exception:  # noqa: BLE001 - the line must come out whatever the journal says
            line = f"study interrupted; continue it with `autoresearch resume {directory}`"
        print(line, file=sys.stderr, flush=True)
        # Trial threads may be mid-request: leave without waiting for them. Everything done so
        # far is in the journal and the trial records.
        os._exit(130)
    display.close()
    print(f"journal: {outcome.journal}")
    if outcome.report is not None:
        print(f"report: {outcome.report}\n")
        print(outcome.report.read_text())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from autoresearch.study.runner import run_study
    from autoresearch.study.spec import Study

    study = Study.from_file(args.study)
    directory = Path(args.out or study.directory())
    _clear_control(directory)
    embedded = study.server_url is None and not os.environ.get("TINKER_BASE_URL")
    for line in expected_time_lines(study.expected_time, _this_machine() if embedded else None):
        print(line, flush=True)
    return _run_unattended(lambda display: run_study(study, args.out, progress=display),
                           directory)


def _this_machine() -> Machine:
    """What an embedded server would run on here, as its engine would choose."""
    import torch

    from server.engine.hardware import choose_dtype
    from server.engine.model_loading import pick_device

    device = pick_device(None)
    choice = choose_dtype(device)
    return Machine(device.type, str(choice.dtype).removeprefix("torch."),
                   torch.get_num_threads(), choice.reason)


def cmd_resume(args: argparse.Namespace) -> int:
    from autoresearch.study.runner import resume_study

    _clear_control(args.directory)
    return _run_unattended(lambda display: resume_study(args.directory, progress=display),
                           Path(args.directory))


def _clear_control(directory: Path) -> None:
    """A study started by hand runs unhindered by an earlier `pause` or `stop`."""
    from autoresearch.study.control import StudyControl

    if Path(directory).exists():
        StudyControl(directory).reset()


def cmd_control(args: argparse.Namespace) -> int:
    """Steer a study that runs elsewhere (another shell, a notebook, a Job) via its control file."""
    from autoresearch.study.control import StudyControl

    control = StudyControl(args.directory)
    if args.command == "pause":
        control.pause()
        print("paused: running trials wait at their next step; nothing new starts")
    elif args.command == "continue":
        control.resume()
        print("continuing")
    elif args.trial:
        control.stop_trial(args.trial)
        print(f"{args.trial} stops at its next step (recorded as stopped; the study goes on)")
    else:
        control.stop()
        print("stopping: no new trials; running ones end at their next step, then the report")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from autoresearch.study.report import status

    print(status(args.directory))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autoresearch.study.journal import Journal
    from autoresearch.study.report import build, to_markdown
    from autoresearch.ui.report import report_page

    journal = Journal(args.directory, read_only=True)
    blocks = build(journal)
    text = report_page(blocks) if args.format == "html" else to_markdown(blocks)
    if args.out is None and args.print:
        print(text)
        return 0
    path = Path(args.out) if args.out else journal.path.parent / f"report.{args.format}"
    path.write_text(text, encoding="utf-8")
    print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from autoresearch.study.compare import compare

    differences = compare(args.first, args.second)
    for difference in differences[: args.limit]:
        print(difference)
    if len(differences) > args.limit:
        print(f"... and {len(differences) - args.limit} more")
    print(f"{len(differences)} difference(s) between {args.first} and {args.second} "
          "(timestamps and durations left out)")
    return 1 if differences else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoresearch", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    trial = sub.add_parser("trial", help="run (or resume) one trial from a config file")
    trial.add_argument("--config", required=True, type=Path)
    trial.add_argument("--server-url", default=None)
    trial.add_argument(
        "--out", default=None, type=Path, help="trial directory (an existing one is resumed)"
    )
    trial.set_defaults(func=cmd_trial)

    scoring = sub.add_parser(
        "eval", help="score a checkpoint (or the base model) on a task source and split",
        description="Score a trial's final checkpoint, any tinker:// checkpoint, or the base "
                    "model on your database and questions, Spider or BIRD, or a generated "
                    "corpus: accuracy with its 95% interval, per tier, the executing rate and "
                    "the worst failures; the full result is written as JSON.")
    what = scoring.add_argument_group("what to score")
    what.add_argument("--trial", type=Path, default=None,
                      help="a trial directory: its config and final checkpoint")
    what.add_argument("--checkpoint", default=None, help="a tinker:// checkpoint path")
    what.add_argument("--config", type=Path, default=None, help="a trial config YAML")
    tasks = scoring.add_argument_group("tasks (default: the config's)")
    tasks.add_argument("--database", type=Path, action="append", default=[],
                       help="a DuckDB, SQLite or .sql file (repeat for several)")
    tasks.add_argument("--questions", type=Path, default=None,
                       help="JSONL or CSV: question, sql, [db, tier, split, evidence]")
    tasks.add_argument("--spider", type=Path, default=None, help="Spider's root directory")
    tasks.add_argument("--bird", type=Path, default=None, help="BIRD's root directory")
    tasks.add_argument("--corpus", choices=["twotable", "multitable"], default=None)
    tasks.add_argument("--split", default="dev",
                       choices=["train", "dev", "test", "all", "transfer"])
    tasks.add_argument("--dialect", choices=["auto", "duckdb", "sqlite"], default=None)
    tasks.add_argument("--split-seed", type=int, default=None)
    tasks.add_argument("--limit", type=int, default=None, help="a seeded sample of N tasks")
    how = scoring.add_argument_group("decoding and prompt (default: the config's)")
    how.add_argument("--vote", type=int, default=None, help="sampled candidates beside greedy")
    how.add_argument("--snap", action="store_true", help="snap unknown names and values")
    how.add_argument("--max-tokens", type=int, default=None)
    how.add_argument("--sample-rows", type=int, default=None)
    how.add_argument("--max-schema-chars", type=int, default=None)
    how.add_argument("--prompt-style", choices=["base", "chat"], default=None)
    how.add_argument("--tokenizer", default=None)
    how.add_argument("--base-model", default=None)
    where = scoring.add_argument_group("server and output")
    where.add_argument("--server-url", default=None)
    where.add_argument("--model", default=None,
                       help="the embedded server's model (default: the packaged Gemma)")
    where.add_argument("--data-dir", type=Path, default=None,
                       help="the embedded server's data directory (where checkpoints are)")
    where.add_argument("--out", type=Path, default=None, help="the JSON file to write")
    where.add_argument("--worst", type=int, default=5, help="failures printed")
    scoring.set_defaults(func=cmd_eval)

    held = sub.add_parser(
        "holdout", help="score the frozen held-out split once, appending the read to its ledger",
        description="The one command that reads the frozen held-out split (hand-written "
                    "questions on two databases, each in two copies, fixed by a content hash): "
                    "it scores a trial's final checkpoint, any tinker:// checkpoint or the base "
                    "model, prints the result and appends it to the split's ledger. Tune on dev "
                    "and transfer, never on this.")
    held.add_argument("--trial", type=Path, default=None,
                      help="a trial directory: its config and final checkpoint")
    held.add_argument("--checkpoint", default=None, help="a tinker:// checkpoint path")
    held.add_argument("--config", type=Path, default=None, help="a trial config YAML")
    for flag in ("--vote", "--max-tokens", "--sample-rows", "--max-schema-chars"):
        held.add_argument(flag, type=int, default=None)
    held.add_argument("--snap", action="store_true", help="snap unknown names and values")
    held.add_argument("--prompt-style", choices=["base", "chat"], default=None)
    for flag in ("--tokenizer", "--base-model", "--server-url", "--model"):
        held.add_argument(flag, default=None)
    held.add_argument("--data-dir", type=Path, default=None)
    held.add_argument("--note", default=None, help="why this read (kept in the ledger)")
    # No task source to choose: the split is the frozen one (`_eval_config` reads these).
    held.set_defaults(func=cmd_holdout, database=[], questions=None, spider=None, bird=None,
                      corpus=None, dialect=None, split_seed=None)

    run = sub.add_parser("run", help="run a study unattended (resumes it if its journal exists)")
    run.add_argument("study", type=Path, help="study YAML")
    run.add_argument("--out", default=None, type=Path,
                     help="study directory (default: the study's output_dir)")
    run.set_defaults(func=cmd_run)
    resume = sub.add_parser("resume", help="continue a stopped study")
    resume.add_argument("directory", type=Path)
    resume.set_defaults(func=cmd_resume)
    for name, text in (("pause", "pause a running study at its trials' next step"),
                       ("continue", "let a paused study go on"),
                       ("stop", "stop a running study (or, with --trial, one of its trials)")):
        steer = sub.add_parser(name, help=text)
        steer.add_argument("directory", type=Path)
        if name == "stop":
            steer.add_argument("--trial", default=None, help="a trial id, e.g. t0003")
        steer.set_defaults(func=cmd_control)
    status = sub.add_parser("status", help="a study's trials and scores")
    status.add_argument("directory", type=Path)
    status.set_defaults(func=cmd_status)
    report = sub.add_parser("report", help="write a study's report (markdown or HTML)")
    report.add_argument("directory", type=Path)
    report.add_argument("--format", choices=["md", "html"], default="md")
    report.add_argument("--out", default=None, type=Path)
    report.add_argument("--print", action="store_true", help="print instead of writing a file")
    report.set_defaults(func=cmd_report)
    diff = sub.add_parser("compare", help="two studies' journals number for number (exit 1 if "
                                          "they differ): did a re-run reproduce the study?")
    diff.add_argument("first", type=Path)
    diff.add_argument("second", type=Path)
    diff.add_argument("--limit", type=int, default=40, help="differences printed at most")
    diff.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    # The SDK logs every long-poll that ends in "try again" (normal while a batch runs).
    logging.getLogger("tinker").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not (getattr(args, "server_url", None) or os.environ.get("TINKER_BASE_URL")):
        # An embedded server may run in this process: its host-memory policy has to come
        # before any thread allocates, or the engine's thread may map and unmap every large
        # block (`server.engine.host_memory`).
        import server.entrypoints  # noqa: F401
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
