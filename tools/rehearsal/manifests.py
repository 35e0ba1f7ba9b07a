"""The rendered manifests, read as a kubelet would: images, commands, environment, volumes.

Everything here is pure: given the objects `kustomize build` renders, it says which processes a
pod runs, with which arguments and environment, which volumes it mounts where and read-only or
not, and which ports it listens on. `cluster.py` turns that into local processes.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
GKE = REPO / "deploy" / "gke"
DOCKER = REPO / "deploy" / "docker"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
IMAGE_DOCKERFILES = {
    "server-cpu": "Dockerfile.server-cpu",
    "server-cuda": "Dockerfile.server-cuda",
    "vllm-sampler": "Dockerfile.vllm-sampler",
    "runner": "Dockerfile.runner",
}
"""Built images by the last component of their repository path, and the file that builds them."""


def tool(name: str) -> str | None:
    """An executable next to this interpreter (the project venv) or on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def kustomize_command() -> list[str] | None:
    if standalone := tool("kustomize"):
        return [standalone, "build"]
    if kubectl := tool("kubectl"):
        return [kubectl, "kustomize"]
    return None


def render(overlay: str | Path) -> list[dict[str, Any]]:
    """`kustomize build` of an overlay (a name under deploy/gke/overlays, or a path)."""
    command = kustomize_command()
    if command is None:
        raise RuntimeError("neither kustomize nor kubectl (which embeds kustomize) is installed")
    path = Path(overlay) if Path(overlay).is_dir() else GKE / "overlays" / str(overlay)
    result = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"kustomize build {path} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


# ------------------------------------------------------------------ images
@dataclass(frozen=True)
class Image:
    """What a Dockerfile's final stage gives every container of that image."""

    entrypoint: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    home: str = "/nonexistent"


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in lines if line and not line.startswith("#")]


def read_image(dockerfile: Path) -> Image:
    """ENTRYPOINT, ENV and WORKDIR of the last stage (PATH is left to this machine)."""
    stages: list[list[tuple[str, str]]] = [[]]
    for instruction in _instructions(dockerfile.read_text()):
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    entrypoint: tuple[str, ...] = ()
    env: dict[str, str] = {}
    workdir = "/"
    for keyword, rest in stages[-1]:
        if keyword == "ENTRYPOINT":
            entrypoint = tuple(json.loads(rest))
        elif keyword == "WORKDIR":
            workdir = rest.strip()
        elif keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                if key != "PATH":
                    env[key] = value
    return Image(entrypoint, env, workdir)


def image_of(reference: str) -> Image | None:
    """The image a container names (after kustomize's `images:` rewrite), if this repo
    builds it."""
    name = reference.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    dockerfile = IMAGE_DOCKERFILES.get(name.removeprefix("autoresearch-"))
    return read_image(DOCKER / dockerfile) if dockerfile else None


# ------------------------------------------------------------------ workloads
@dataclass
class Mount:
    volume: str
    path: str
    read_only: bool
    sub_path: str = ""


@dataclass(frozen=True)
class Security:
    """Who a container runs as and what it may do: its pod's and its own securityContext."""

    user: int | None
    group: int | None
    fs_group: int | None
    """Given to the volumes whose driver applies it (emptyDir, a ReadWriteOnce disk), and to
    the container as a supplementary group."""
    supplemental: tuple[int, ...] = ()
    add_capabilities: tuple[str, ...] = ()
    no_new_privileges: bool = False


def security_of(pod: dict[str, Any], container: dict[str, Any]) -> Security:
    """A container's Security: its own runAsUser/runAsGroup over the pod's."""
    pod_context = pod.get("securityContext") or {}
    own = container.get("securityContext") or {}
    user = own.get("runAsUser", pod_context.get("runAsUser"))
    group = own.get("runAsGroup", pod_context.get("runAsGroup"))
    fs_group = pod_context.get("fsGroup")
    supplemental = tuple(pod_context.get("supplementalGroups") or ())
    return Security(user, group, fs_group,
                    (*supplemental, *([fs_group] if fs_group is not None else [])),
                    tuple((own.get("capabilities") or {}).get("add") or ()),
                    own.get("allowPrivilegeEscalation") is False)


@dataclass
class ContainerSpec:
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: list[dict[str, Any]]
    mounts: list[Mount]
    ports: dict[str, int]
    probes: dict[str, dict[str, Any]]
    security: Security


@dataclass
class Workload:
    kind: str
    name: str
    replicas: int
    template: dict[str, Any]
    volume_claims: list[str] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return self.template.get("metadata", {}).get("labels", {})

    def selected_by(self, selector: dict[str, str]) -> bool:
        """Whether a label selector (a Service's, a budget's) selects this workload's pods."""
        return all(self.labels.get(k) == v for k, v in selector.items())

    @property
    def volumes(self) -> dict[str, dict[str, Any]]:
        return {v["name"]: v for v in self.template["spec"].get("volumes", [])}

    @property
    def restarts(self) -> bool:
        return self.template["spec"].get("restartPolicy", "Always") == "Always"

    def containers(self) -> list[ContainerSpec]:
        spec = self.template["spec"]
        out = []
        for c in spec["containers"]:
            out.append(ContainerSpec(
                name=c["name"], image=c.get("image", ""), command=list(c.get("command") or []),
                args=[str(a) for a in c.get("args") or []], env=list(c.get("env") or []),
                mounts=[Mount(m["name"], m["mountPath"], bool(m.get("readOnly")),
                              m.get("subPath", "")) for m in c.get("volumeMounts") or []],
                ports={p.get("name", str(p["containerPort"])): int(p["containerPort"])
                       for p in c.get("ports") or []},
                probes={kind: c[kind] for kind in ("startupProbe", "readinessProbe",
                                                   "livenessProbe") if kind in c},
                security=security_of(spec, c)))
        return out


def workloads(docs: list[dict[str, Any]]) -> dict[str, Workload]:
    found = {}
    for doc in docs:
        if doc.get("kind") not in WORKLOAD_KINDS:
            continue
        spec = doc["spec"]
        claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
        found[doc["metadata"]["name"]] = Workload(doc["kind"], doc["metadata"]["name"],
                                                  int(spec.get("replicas", 1) or 1),
                                                  spec["template"], claims)
    return found


def shared_claims(docs: list[dict[str, Any]]) -> set[str]:
    """Claims of ReadWriteMany volumes (Filestore here): their driver does not apply fsGroup,
    so a fresh one is owned by root whatever the pods' securityContext says."""
    return {d["metadata"]["name"] for d in docs if d.get("kind") == "PersistentVolumeClaim"
            and "ReadWriteMany" in (d["spec"].get("accessModes") or [])}


def config_maps(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: dict(d.get("data") or {})
            for d in docs if d.get("kind") == "ConfigMap"}


@dataclass(frozen=True)
class Service:
    name: str
    selector: dict[str, str]
    ports: dict[int, str | int]
    """Service port -> the pod's target port (a name or a number)."""


def services(docs: list[dict[str, Any]]) -> dict[str, Service]:
    return {d["metadata"]["name"]: Service(
        d["metadata"]["name"], dict(d["spec"].get("selector") or {}),
        {int(p["port"]): p.get("targetPort", p["port"]) for p in d["spec"].get("ports", [])})
        for d in docs if d.get("kind") == "Service"}


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: how many of the pods it selects an eviction must leave."""

    name: str
    selector: dict[str, str]
    min_available: int | None
    max_unavailable: int | None

    def allowed(self, healthy: int, expected: int) -> int:
        """Disruptions allowed now, as the eviction API computes them."""
        if self.min_available is not None:
            return healthy - self.min_available
        return healthy - (expected - (self.max_unavailable or 0))


def budgets(docs: list[dict[str, Any]]) -> list[Budget]:
    found = []
    for d in docs:
        if d.get("kind") != "PodDisruptionBudget":
            continue
        spec = d["spec"]
        for key in ("minAvailable", "maxUnavailable"):
            if isinstance(spec.get(key), str):
                raise ValueError(f"{d['metadata']['name']}: percentages are not rehearsed")
        found.append(Budget(d["metadata"]["name"], dict(spec["selector"]["matchLabels"]),
                            spec.get("minAvailable"), spec.get("maxUnavailable")))
    return found


# ------------------------------------------------------------------ environment
VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, others left as written."""
    return VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def resolve_env(entries: list[dict[str, Any]], maps: dict[str, dict[str, str]],
                secrets: dict[str, dict[str, str]], namespace: str,
                annotations: dict[str, str] | None = None) -> dict[str, str]:
    """A container's `env`, in order (later entries may use earlier ones)."""
    env: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
            continue
        source = entry.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = maps.get(ref["name"], {}).get(ref["key"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets.get(ref["name"], {}).get(ref["key"])
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            value = namespace if path == "metadata.namespace" else None
            if path.startswith("metadata.annotations["):
                value = (annotations or {}).get(path.split("'")[1])
        else:
            value = None
        if value is None:
            if (source.get("configMapKeyRef") or source.get("secretKeyRef") or {}).get(
                    "optional"):
                continue
            raise KeyError(f"env {name}: {source} has no value here")
        env[name] = value
    return env
