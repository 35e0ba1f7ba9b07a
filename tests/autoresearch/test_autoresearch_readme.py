"""The README's code blocks work as written, in a shell that ran the README's activation line.

The blocks are read from README.md at test time, so an edited README is tested as it stands:

- `make <target>` must be a target `make -n` accepts;
- `source <venv>/bin/activate` must name the environment `make setup` creates;
- `apt-get install` must name exactly the system packages the suite reports as missing;
- `python -m server ...` must parse; the first one is started (on a tiny model: the real one is
  the same code path at 100x the cost) and serves the rest of the test;
- `autoresearch ...` and `python -m ...` commands run in a scratch directory, in order, where
  every YAML file a command names holds a tiny version of the repository's file of that name
  (same study name and search space, a tiny model and budget) and the README's server address
  is the tiny server's;
- Python blocks run as doctest-like checks against the same server, with the model name mapped
  to the tiny model and trial configs shrunk to a couple of steps.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.autoresearch.study_helpers import tiny_trial
from tools.processes import ServiceProcess

pytestmark = pytest.mark.timeout(900)
REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_SERVER = "http://127.0.0.1:8000"
README_MODEL = "google/gemma-3-270m"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(lang: str) -> list[str]:
    return [code for kind, code in FENCE.findall(README.read_text()) if kind == lang]


def commands() -> list[list[str]]:
    """Every shell command of the README's bash blocks, comments dropped."""
    out = []
    for code in blocks("bash"):
        for line in code.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                out.append(argv)
    return out


def activated_env() -> dict[str, str]:
    """A fresh shell after `source .venv/bin/activate`: the test's environment first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TINKER_BASE_URL", "AUTORESEARCH_API_KEYS", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = sys.prefix
    return env


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def shrink_trial(model: Path, declared: dict[str, Any]) -> dict[str, Any]:
    """A declared trial with the tiny model and at most two steps per phase."""
    trial = deep_merge(tiny_trial(model), {k: v for k, v in declared.items()
                                           if k in ("name", "seed", "init_checkpoint")})
    for phase in ("sft", "rl"):
        steps = (declared.get(phase) or {}).get("steps")
        if steps is not None:
            trial[phase]["steps"] = min(int(steps), 2)
    return trial


def shrink_study(model: Path, declared: dict[str, Any]) -> dict[str, Any]:
    study = {**declared, "embedded_model": str(model), "reward_workers": 1,
             "base_trial": shrink_trial(model, declared.get("base_trial") or {}),
             "budget": {"max_trials": 2, "confirm_seeds": 0},
             "executor": {"kind": "local", "max_parallel_trials": 2}}
    if declared.get("warmup"):  # a short one, cached next to the study (not in the user's cache)
        study["warmup"] = {"sft": {"steps": 2, "batch_size": 2}, "checkpoint_every": 1,
                           "cache_dir": "warmups"}
    if (declared.get("pruning") or {}).get("kind", "none") != "none":
        study["pruning"] = {**declared["pruning"], "every": 1, "dev_tasks": 2, "min_resource": 1}
    return study


@pytest.fixture(scope="module")
def readme_server(sql_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The README's first `python -m server` command, started from the activated shell."""
    from server.entrypoints.args import build_parser
    from server.entrypoints.runtime import free_port

    server_commands = [argv for argv in commands() if argv[:3] == ["python", "-m", "server"]]
    assert server_commands, "the README shows how to start the server"
    for argv in server_commands:
        build_parser().parse_args(argv[3:])  # every option it shows exists
    root = tmp_path_factory.mktemp("readme-server")
    port = free_port()
    line = shlex.join(server_commands[0] + ["--model", str(sql_model_dir), "--port", str(port),
                                            "--data-dir", str(root / "data")])
    server = ServiceProcess(["bash", "-c", line], root / "server.log",
                            url=f"http://127.0.0.1:{port}", env=activated_env(), cwd=root)
    with server:
        server.wait_answers()
        yield server.url


def test_make_targets_and_set_up_lines_are_real():
    makefile = (REPO / "Makefile").read_text()
    venv = re.search(r"^VENV \?= (\S+)", makefile, re.MULTILINE).group(1)
    seen = set()
    for argv in commands():
        if argv[0] == "make":
            seen.add("make")
            done = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr}"
        elif argv[0] == "source":
            seen.add("source")
            assert argv[1] == f"{venv}/bin/activate", "activate the venv `make setup` creates"
            if sys.prefix != sys.base_prefix:
                assert (Path(sys.prefix) / "bin" / "activate").exists()
        elif "apt-get" in argv:
            seen.add("apt-get")
            from tests.conftest import APT_PACKAGES

            assert sorted(argv[argv.index("-y") + 1:]) == sorted(APT_PACKAGES)
    assert seen == {"make", "source", "apt-get"}


def test_python_blocks_run_against_the_server(readme_server: str, sql_model_dir: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import autoresearch.rl.config

    real = autoresearch.rl.config.TrialConfig

    def tiny_config(**fields: Any):
        return real.model_validate(shrink_trial(sql_model_dir, fields))

    monkeypatch.setattr(autoresearch.rl.config, "TrialConfig", tiny_config)
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    monkeypatch.chdir(tmp_path)
    python = blocks("python")
    assert python, "the README shows the Python API"
    for code in python:
        code = code.replace(README_SERVER, readme_server).replace(README_MODEL,
                                                                  str(sql_model_dir))
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # no deprecated calls in the README
            warnings.simplefilter("error", DeprecationWarning)
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102


def test_shell_commands_run_as_written(readme_server: str, sql_model_dir: Path, tmp_path: Path):
    env = activated_env()
    (tmp_path / "notebooks").symlink_to(REPO / "notebooks")
    (tmp_path / "datasets").symlink_to(REPO / "datasets")
    ran = []
    for argv in commands():
        if argv[0] != "autoresearch" and argv[:2] != ["python", "-m"]:
            continue
        if argv[:3] == ["python", "-m", "server"]:
            continue  # started by the fixture
        line = shlex.join(argv).replace(README_SERVER, readme_server)
        command_env = dict(env)
        if argv[0] == "autoresearch" and argv[1] in ("trial", "eval"):
            command_env["TINKER_BASE_URL"] = readme_server  # not the real model in-process
        if argv[:2] == ["autoresearch", "eval"]:
            line += f" --tokenizer {shlex.quote(str(sql_model_dir))} --max-tokens 8"
        for arg in argv:
            if arg.endswith((".yaml", ".yml")):
                declared = yaml.safe_load((REPO / arg).read_text()) if (REPO / arg).exists() \
                    else {"name": Path(arg).stem}
                tiny = (shrink_study(sql_model_dir, declared) if argv[1] in ("run",)
                        else shrink_trial(sql_model_dir, declared))
                (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / arg).write_text(yaml.safe_dump(tiny))
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=command_env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{line}\n{done.stderr[-3000:]}"
        ran.append(argv[:2])
    assert ["autoresearch", "run"] in ran and ["autoresearch", "status"] in ran
    assert ["autoresearch", "trial"] in ran and ["autoresearch", "report"] in ran
    assert ["autoresearch", "eval"] in ran


def test_the_readmes_setup_step_count_is_the_makefiles():
    makefile = (REPO / "Makefile").read_text()
    steps = re.search(r"^STEPS := (\d+)$", makefile, re.MULTILINE)
    assert steps, "the Makefile declares its number of set-up steps"
    shown = re.findall(r"\[\d+/(\d+)\]", README.read_text())
    assert shown and set(shown) == {steps.group(1)}, shown
