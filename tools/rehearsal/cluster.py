"""A namespace on one machine: the rendered workloads as local processes, as a kubelet runs them.

Each pod gets its volumes as local directories (a claim shared by every pod that mounts it, an
emptyDir per pod that a container restart keeps and a pod replacement renews, secrets and
config maps as files), each container its image's entrypoint and environment, the manifest's
command, arguments and `env` with `$(VAR)` expanded, and every address rewritten to this machine:
a Service name to a local round-robin proxy over the pods it selects, a pod's own ports to free
local ones, a mount path to its directory. When this process is root, every container runs as
its securityContext's user and groups (`setpriv`), with only the capabilities it adds, and the
volumes are owned as the cluster's drivers leave them: an emptyDir writable by all, a
ReadWriteOnce disk given to the pod's fsGroup, a ReadWriteMany share (Filestore) owned by root
until something gives it away. Probes run as the kubelet would (HTTP, exec, TCP); a
container that exits is restarted where its pod's policy says so. What a GPU or the cloud does
(scheduling, node pools, load balancers, storage classes) is out of scope; `Substitutions`
lists what stands in for what.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tools.processes import wait_until
from tools.rehearsal.manifests import (
    REPO,
    Budget,
    ContainerSpec,
    Image,
    Security,
    Service,
    Workload,
    budgets,
    config_maps,
    expand,
    image_of,
    resolve_env,
    services,
    shared_claims,
    workloads,
)

NAMESPACE = "autoresearch"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Substitutions:
    """What stands in on this machine for what the cluster provides."""

    model_dir: Path
    """Replaces every value of the `autoresearch-model` ConfigMap (the base model)."""
    secrets: dict[str, dict[str, str]]
    """Secrets the deployment guide creates by hand, by name and key."""
    args: dict[str, list[str]] = field(default_factory=lambda: {
        "--device=cuda": ["--device=cpu"], "--dtype=bfloat16": ["--dtype=float32"]})
    """Whole arguments replaced: the GPU's flags by the CPU's."""
    commands: dict[str, list[str]] = field(default_factory=lambda: {
        "vllm": [sys.executable, "-m", "tools.vllm_standin"],
        "redis-server": [shutil.which("redis-server") or "redis-server"],
        "python": [sys.executable],
        "autoresearch": [str(Path(sys.executable).parent / "autoresearch")],
    })
    """Executables the images provide, as found here (vLLM: the project's stand-in)."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to every container (e.g. the local Kubernetes API's kubeconfig)."""
    files: dict[str, dict[str, str]] = field(default_factory=dict)
    """ConfigMap entries replaced, by ConfigMap name (prefix, as generators add a hash)."""
    nfs_claim: str = "autoresearch-data"
    """What an `nfs` volume reaches: the share bound to this claim (the Filestore instance)."""


def _die_with_parent() -> None:
    """In the child: SIGKILL when the rehearsal dies, so no pod outlives it (Linux)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def image_files() -> list[Path]:
    """What a container's image holds here: this checkout, its environment and the
    interpreter that environment was made from."""
    return sorted({Path(p).resolve() for p in (REPO, sys.prefix, sys.base_prefix)})


def image_paths() -> list[Path]:
    """The image's files under /tmp: they stay visible when the pod's own /tmp covers this
    machine's (a checkout or environment under /tmp)."""
    return [p for p in image_files() if p.is_relative_to("/tmp")]


def hidden_ancestors(paths: list[Path]) -> dict[Path, list[Path]]:
    """For each of `paths` that another user could not reach (an ancestor without search
    permission for others, such as a home directory of mode 700), that ancestor and the paths
    under it: the pods' user sees the image's files, as an image gives them."""
    hidden: dict[Path, list[Path]] = {}
    for path in paths:
        for ancestor in reversed(path.parents):
            if ancestor != Path("/") and not ancestor.stat().st_mode & 0o001:
                hidden.setdefault(ancestor, []).append(path)
                break
    return hidden


def mount_namespace(writable: list[Path], read_only: list[Path],
                    tmp: Path | None = None, staging: Path | None = None,
                    reveal: list[Path] | None = None) -> list[str]:
    """A command prefix that runs the rest in a new mount namespace where only `writable` can
    be written: each volume bound onto itself (read-only ones remounted so), the image's paths
    in `reveal` made reachable where an ancestor would hide them from another user (that
    ancestor covered by an empty read-only tmpfs holding only them), the pod's /tmp volume (if
    any) at /tmp itself (the image's paths under /tmp carried over), then the root read-only.
    `staging` (a directory outside /tmp) carries paths across the mounts that cover them."""
    steps = ["set -e"]
    for path in writable:
        steps.append(f"mount --bind '{path}' '{path}'")
    for i, (cover, kept) in enumerate(hidden_ancestors(reveal or []).items()):
        for j, path in enumerate(kept):
            steps += [f"mkdir -p '{staging}/hidden-{i}-{j}'",
                      f"mount --bind '{path}' '{staging}/hidden-{i}-{j}'"]
        steps.append(f"mount -t tmpfs -o mode=755 tmpfs '{cover}'")
        for j, path in enumerate(kept):
            steps += [f"mkdir -p '{path}'", f"mount --bind '{staging}/hidden-{i}-{j}' '{path}'"]
        steps.append(f"mount -o remount,ro '{cover}'")
    if tmp is not None:
        kept = image_paths() if staging is not None else []
        for i, path in enumerate(kept):
            steps += [f"mkdir -p '{staging}/{i}'", f"mount --bind '{path}' '{staging}/{i}'"]
        steps.append(f"mount --bind '{tmp}' /tmp")
        for i, path in enumerate(kept):
            steps += [f"mkdir -p '{path}'", f"mount --bind '{staging}/{i}' '{path}'",
                      f"mount -o remount,bind,ro '{path}'"]
    for path in read_only:
        steps += [f"mount --bind '{path}' '{path}'", f"mount -o remount,bind,ro '{path}'"]
    steps += ["mount --bind / /", "mount -o remount,bind,ro /", 'exec "$@"']
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            "; ".join(steps), "sh"]


def run_as(security: Security) -> list[str]:
    """A command prefix that runs the rest as `security` says: its uid and gid, its fsGroup
    and supplementary groups, only the capabilities it adds, no new privileges if so asked;
    killed with the rehearsal (a change of uid clears the parent-death signal)."""
    if security.user is None:
        return []
    group = security.group if security.group is not None else security.user
    groups = ",".join(str(g) for g in dict.fromkeys(security.supplemental))
    capabilities = "".join(f",+{c.lower()}" for c in security.add_capabilities)
    return ["setpriv", f"--reuid={security.user}", f"--regid={group}",
            f"--groups={groups}" if groups else "--clear-groups",
            f"--bounding-set=-all{capabilities}", "--inh-caps=-all", "--pdeathsig=KILL",
            *(["--no-new-privs"] if security.no_new_privileges else [])]


def can_run_as_users() -> bool:
    """Whether containers can run as their manifests' users here (root, with setpriv)."""
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def check_readable_by(user: int, staging: Path) -> None:
    """The checkout and its interpreter must be readable by the pods' user, as an image's
    files are; say so plainly instead of letting every pod crash."""
    tmp = staging / "probe-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o777)
    reveal = [*mount_namespace([tmp], [], staging=staging, reveal=image_files())] if (
        can_isolate()) else []
    probe = subprocess.run(
        [*reveal, *run_as(Security(user, user, None)), sys.executable, "-c",
         "import server, tinker, redis.asyncio"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TMPDIR": str(tmp),
             "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "datasets")])})
    shutil.rmtree(tmp, ignore_errors=True)
    if probe.returncode != 0:
        raise RuntimeError(
            f"uid {user} (the pods' user) cannot run this checkout's Python ({REPO}, "
            f"{sys.executable}): make them readable by all, as an image's files are.\n"
            + probe.stderr[-2000:])


def can_isolate() -> bool:
    """Whether this machine lets a process make a read-only mount namespace."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*mount_namespace([], []), "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


class Proxy:
    """A Service's ClusterIP: a local port forwarding each connection to one of its pods'."""

    def __init__(self, name: str, backends: Callable[[], list[int]]):
        self.name, self.backends = name, backends
        self.port = free_port()
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, name=f"proxy-{name}", daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = self.backends()
        start = next(self._turn)
        upstream = None
        for i in range(len(ports)):
            try:
                upstream = await asyncio.open_connection("127.0.0.1",
                                                         ports[(start + i) % len(ports)])
                break
            except OSError:
                continue
        if upstream is None:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, upstream[1]), pipe(upstream[0], writer))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class Container:
    spec: ContainerSpec
    command: list[str]
    env: dict[str, str]
    cwd: Path
    writable: list[Path]
    read_only: list[Path]
    isolate: bool
    log_dir: Path
    tmp: Path | None = None
    run_as: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    restarts: int = 0
    stopping: bool = False
    started_at: float = 0.0
    next_start: float = 0.0

    def start(self) -> None:
        log = open(self.log_dir / f"{self.spec.name}-{self.restarts}.log", "ab")  # noqa: SIM115
        command = [*self.run_as, *self.command]
        if self.isolate:
            command = [*mount_namespace(self.writable, self.read_only, self.tmp,
                                        self.log_dir / f".image-{self.spec.name}",
                                        image_files() if self.run_as else None), *command]
        self.process = subprocess.Popen(command, env=self.env, cwd=self.cwd, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        log.close()
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            os.killpg(self.process.pid, sig)  # type: ignore[union-attr]

    def stop(self, grace: float = 30.0) -> None:
        self.stopping = True
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=30)  # type: ignore[union-attr]

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.log_dir.glob(f"{self.spec.name}-*.log")))


@dataclass
class Pod:
    name: str
    workload: Workload
    ports: dict[int, int]
    dirs: dict[str, Path]
    containers: dict[str, Container] = field(default_factory=dict)
    deleted: bool = False

    def local_port(self, port: int | str, container: ContainerSpec | None = None) -> int:
        if isinstance(port, str) and not port.isdigit():
            for spec in [container] if container else [c.spec for c in self.containers.values()]:
                if spec is not None and port in spec.ports:
                    return self.ports[spec.ports[port]]
            raise KeyError(f"pod {self.name} has no port named {port!r}")
        return self.ports[int(port)]


class LocalCluster:
    """The workloads of one rendered overlay, run here. See the module docstring."""

    def __init__(self, docs: list[dict[str, Any]], root: Path, subs: Substitutions,
                 say: Callable[[str], None] = print):
        self.root, self.subs, self.say = root, subs, say
        self.started = time.monotonic()
        self.events: list[tuple[float, str]] = []
        self.workloads = workloads(docs)
        self.maps = {name: ({k: str(subs.model_dir) for k in data} if
                            name.startswith("autoresearch-model") else data)
                     for name, data in config_maps(docs).items()}
        for name, data in self.maps.items():
            for prefix, replaced in subs.files.items():
                if name.startswith(prefix):
                    data.update(replaced)
        self.services: dict[str, Service] = services(docs)
        self.shared_claims = shared_claims(docs)
        self.budgets: list[Budget] = budgets(docs)
        self.pods: dict[str, Pod] = {}
        self.enforce_read_only = can_isolate()
        self.run_as_users = can_run_as_users()
        if self.run_as_users:
            root.chmod(0o755)  # as a node's pod directories: the pods' users traverse it
            users = {c.security.user for w in self.workloads.values() for c in w.containers()}
            for user in sorted(u for u in users if u):
                check_readable_by(user, root)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.proxies = {name: Proxy(name, lambda s=svc: self._backends(s))
                        for name, svc in self.services.items()}
        self._supervisor = threading.Thread(target=self._supervise, name="kubelet", daemon=True)
        self._supervisor.start()

    # ---------------------------------------------------------------- events
    def event(self, text: str) -> None:
        at = time.monotonic() - self.started
        self.events.append((at, text))
        self.say(f"[{at:7.1f} s] {text}")

    def timeline(self) -> str:
        return "\n".join(f"{at:7.1f} s  {text}" for at, text in self.events)

    # ---------------------------------------------------------------- services
    def _backends(self, service: Service) -> list[int]:
        pods = self._selected(service.selector)
        target = next(iter(service.ports.values()), None)
        ports = []
        for pod in pods:
            try:
                if target is not None:
                    ports.append(pod.local_port(target))
            except KeyError:
                continue
        return ports

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.proxies[service].port}"

    # ---------------------------------------------------------------- volumes
    @staticmethod
    def _writable_dir(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _owned(self, path: Path, mode: int, fs_group: int | None = None) -> Path:
        """A volume's directory with the mode (and fsGroup) its driver gives it."""
        self._writable_dir(path)
        if self.run_as_users:
            if fs_group is not None:
                os.chown(path, -1, fs_group)
            path.chmod(mode)
        return path

    def _files_dir(self, path: Path, files: dict[str, str]) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o755)
        for name, text in files.items():
            (path / name).write_text(text)
            (path / name).chmod(0o644)
        return path

    def _volume_dirs(self, pod_name: str, workload: Workload,
                     annotations: dict[str, str]) -> dict[str, Path]:
        pod_root = self.root / "pods" / pod_name
        fs_group = (workload.template["spec"].get("securityContext") or {}).get("fsGroup")
        dirs: dict[str, Path] = {}
        for name, volume in workload.volumes.items():
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = self.root / "volumes" / claim
                if claim in self.shared_claims:  # Filestore: as its CSI driver leaves it
                    dirs[name] = self._writable_dir(path)
                else:
                    dirs[name] = self._owned(path, 0o2775, fs_group)
            elif "nfs" in volume:
                dirs[name] = self._writable_dir(self.root / "volumes" / self.subs.nfs_claim)
            elif "emptyDir" in volume:
                dirs[name] = self._owned(pod_root / name, 0o777)
            elif "secret" in volume:
                secret = self.subs.secrets.get(volume["secret"]["secretName"], {})
                dirs[name] = self._files_dir(pod_root / name, secret)
            elif "configMap" in volume:
                dirs[name] = self._files_dir(pod_root / name,
                                             self.maps.get(volume["configMap"]["name"], {}))
            elif "projected" in volume:
                files: dict[str, str] = {}
                for source in volume["projected"]["sources"]:
                    if "configMap" in source:
                        files |= self.maps.get(source["configMap"]["name"], {})
                    if "secret" in source:
                        files |= self.subs.secrets.get(source["secret"]["name"], {})
                dirs[name] = self._files_dir(pod_root / name, files)
            elif "downwardAPI" in volume:
                files = {}
                for item in volume["downwardAPI"]["items"]:
                    path = item["fieldRef"]["fieldPath"]
                    files[item["path"]] = annotations.get(path.split("'")[1], "")
                dirs[name] = self._files_dir(pod_root / name, files)
        for claim in workload.volume_claims:  # a ReadWriteOnce disk each: fsGroup applies
            dirs[claim] = self._owned(self.root / "volumes" / f"{claim}-{pod_name}", 0o2775,
                                      fs_group)
        return dirs

    # ---------------------------------------------------------------- rewriting
    def _rewrite(self, text: str, pod: Pod, mounts: dict[str, Path]) -> str:
        """Cluster addresses and mount paths in `text` as this machine's; local paths already
        under the rehearsal's root (substituted values) are left alone."""
        shield = "\x00root\x00"
        text = text.replace(str(self.root), shield)
        for name, proxy in self.proxies.items():
            suffix = rf"(?:\.{NAMESPACE}(?:\.svc(?:\.cluster\.local)?)?)?"
            pattern = rf"(?<![\w.-]){re.escape(name)}{suffix}:(\d+)"
            text = re.sub(pattern, f"127.0.0.1:{proxy.port}", text)

        def local(match: re.Match) -> str:
            port = int(match.group(2))
            return f"127.0.0.1:{pod.ports[port]}" if port in pod.ports else match.group(0)

        text = re.sub(r"\b(localhost|127\.0\.0\.1|0\.0\.0\.0):(\d+)", local, text)
        if mounts:  # one pass, longest path first, so a rewritten path is never rewritten again
            paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
            text = re.sub(rf"(?<![\w.-])({paths})(?=/|$|[^\w.-])",
                          lambda m: str(mounts[m.group(1)]), text)
        return text.replace(shield, str(self.root))

    def _argument(self, arg: str, pod: Pod, mounts: dict[str, Path]) -> list[str]:
        if arg in self.subs.args:
            return list(self.subs.args[arg])
        match = re.fullmatch(r"--port=(\d+)", arg)
        if match and int(match.group(1)) in pod.ports:
            return [f"--port={pod.ports[int(match.group(1))]}"]
        if arg == "--host=0.0.0.0":
            return ["--host=127.0.0.1"]
        return [self._rewrite(arg, pod, mounts)]

    def _container(self, pod: Pod, spec: ContainerSpec, log_dir: Path) -> Container:
        image: Image | None = image_of(spec.image)
        annotations = pod.workload.template.get("metadata", {}).get("annotations", {})
        env = dict(image.env if image else {})
        env |= resolve_env(spec.env, self.maps, self.subs.secrets, NAMESPACE, annotations)
        mounts: dict[str, Path] = {}
        writable: list[Path] = []
        read_only: list[Path] = []
        for mount in spec.mounts:
            local = pod.dirs.get(mount.volume)
            if local is None:
                continue
            if mount.sub_path:
                local = self._writable_dir(local / mount.sub_path)
            mounts[mount.path] = local
            (read_only if mount.read_only else writable).append(local)
        entry = spec.command or list(image.entrypoint if image else [])
        head = self.subs.commands.get(entry[0], [entry[0]]) if entry else []
        raw = [expand(a, env) for a in [*entry[1:], *spec.args]]
        args = [part for a in raw for part in self._argument(a, pod, mounts)]
        if entry and entry[0] == "redis-server":
            redis_port = next(iter(spec.ports.values()), 6379)
            args += ["--port", str(pod.ports[redis_port]), "--bind", "127.0.0.1"]
        env = {k: self._rewrite(v, pod, mounts) for k, v in env.items()}
        env |= {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "datasets")]),
            "HOME": image.home if image else "/nonexistent",
            "PYTHONDONTWRITEBYTECODE": "1",
            **({"TMPDIR": str(mounts["/tmp"])} if "/tmp" in mounts else {}),
            **self.subs.env,
        }
        workdir = mounts.get(image.workdir) if image else None
        return Container(spec, [*head, *args], env, workdir or log_dir, writable, read_only,
                         self.enforce_read_only, log_dir, mounts.get("/tmp"),
                         run_as(spec.security) if self.run_as_users else [])

    # ---------------------------------------------------------------- pods
    def create_pod(self, workload_name: str, index: int, generation: int = 0) -> Pod:
        workload = self.workloads[workload_name]
        name = f"{workload.name}-{index}" + (f"-r{generation}" if generation else "")
        annotations = workload.template.get("metadata", {}).get("annotations", {})
        specs = workload.containers()
        numbers = {p for s in specs for p in s.ports.values()}
        for spec in specs:
            numbers |= {int(m.group(1)) for a in spec.args
                        if (m := re.fullmatch(r"--port=(\d+)", a))}
        pod = Pod(name, workload, {n: free_port() for n in sorted(numbers)},
                  self._volume_dirs(name, workload, annotations))
        log_dir = self.root / "logs" / name
        log_dir.mkdir(parents=True, exist_ok=True)
        for spec in specs:
            pod.containers[spec.name] = self._container(pod, spec, log_dir)
        self._rewrite_files(pod, specs[0])
        with self._lock:
            self.pods[name] = pod
        for container in pod.containers.values():
            container.start()
        self.event(f"pod {name} started ({', '.join(pod.containers)})")
        return pod

    def _rewrite_files(self, pod: Pod, spec: ContainerSpec) -> None:
        """Paths and addresses inside mounted config files, as the container sees them; a
        Kubernetes manifest among them is left as written (it is for the API server)."""
        mounts = {m.path: pod.dirs[m.volume] / m.sub_path if m.sub_path else pod.dirs[m.volume]
                  for m in spec.mounts if m.volume in pod.dirs}
        for name, volume in pod.workload.volumes.items():
            if not {"configMap", "projected", "downwardAPI"} & set(volume) or name not in pod.dirs:
                continue
            for file in pod.dirs[name].iterdir():
                text = file.read_text() if file.is_file() else ""
                if text and not re.search(r"(?m)^apiVersion:", text):
                    file.write_text(self._rewrite(text, pod, mounts))

    def run_job(self, job: dict[str, Any], timeout: float = 900) -> tuple[bool, str]:
        """A Job created through the API: its pod run here to completion."""
        name = job["metadata"]["name"]
        self.workloads[name] = Workload("Job", name, 1, job["spec"]["template"])
        pod = self.create_pod(name, 0)
        container = next(iter(pod.containers.values()))
        try:
            code = container.process.wait(timeout=timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            container.stop(grace=10)
            code = -1
        self.event(f"job {name} finished ({code})")
        return code == 0, container.log_text()

    def wait_started(self, pod: Pod, timeout_scale: float = 1.0) -> None:
        """Block until every container passes its startup probe (else its readiness probe)."""
        for container in pod.containers.values():
            probe = container.spec.probes.get("startupProbe") or container.spec.probes.get(
                "readinessProbe")
            if probe is None:
                continue
            deadline = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
            started = time.monotonic()
            restarts = container.restarts

            def passes(c: Container = container, p: dict = probe, r: int = restarts) -> bool:
                if c.restarts > r + 1:
                    raise RuntimeError(f"{pod.name}/{c.spec.name} is crash-looping:\n"
                                       f"{c.log_text()[-4000:]}")
                return self.probe(pod, c, p)

            try:
                wait_until(passes, timeout=max(deadline, 30) * timeout_scale,
                           what=f"{pod.name}/{container.spec.name} to start", interval=0.2)
            except TimeoutError:
                raise TimeoutError(f"{pod.name}/{container.spec.name} did not start:\n"
                                   f"{container.log_text()[-4000:]}") from None
            self.event(f"{pod.name}/{container.spec.name} started in "
                       f"{time.monotonic() - started:.1f} s")

    def probe(self, pod: Pod, container: Container, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = pod.local_port(get["port"], container.spec)
            try:
                status = httpx.get(f"http://127.0.0.1:{port}{get.get('path', '/')}",
                                   timeout=timeout).status_code
            except httpx.HTTPError:
                return False
            return 200 <= status < 400
        if "exec" in probe:
            command = [self._rewrite(expand(a, container.env), pod, {})
                       for a in probe["exec"]["command"]]
            if "redis-cli ping" in " ".join(command):  # it would reach the pod's own 6379
                port = pod.local_port(next(iter(container.spec.ports.values())))
                command = ["sh", "-c", f'test "$(redis-cli -p {port} ping)" = PONG']
            command = [*self.subs.commands.get(command[0], [command[0]]), *command[1:]]
            try:
                return subprocess.run(command, env=container.env, capture_output=True,
                                      timeout=timeout + 5).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False
        if "tcpSocket" in probe:
            try:
                socket.create_connection(("127.0.0.1", pod.local_port(
                    probe["tcpSocket"]["port"], container.spec)), timeout=timeout).close()
                return True
            except OSError:
                return False
        return True

    def scale_up(self, workload_name: str, replicas: int | None = None) -> list[Pod]:
        workload = self.workloads[workload_name]
        pods = [self.create_pod(workload_name, i)
                for i in range(replicas if replicas is not None else workload.replicas)]
        for pod in pods:
            self.wait_started(pod)
        return pods

    def kill(self, pod_name: str, container: str | None = None) -> Container:
        """SIGKILL a container, as an OOM kill or a node fault would; the kubelet restarts it."""
        pod = self.pods[pod_name]
        target = pod.containers[container or next(iter(pod.containers))]
        target.signal(signal.SIGKILL)
        target.process.wait(timeout=30)  # type: ignore[union-attr]
        self.event(f"{pod_name}/{target.spec.name} killed (SIGKILL)")
        return target

    def outage(self, pod_name: str, seconds: float) -> None:
        """Take a pod's containers away for `seconds` and then let the kubelet start them
        again on the same volumes: a pod rescheduled with its disk re-attached elsewhere
        (SIGTERM first, as a drain sends)."""
        pod = self.pods[pod_name]
        grace = pod.workload.template["spec"].get("terminationGracePeriodSeconds", 30)
        for container in pod.containers.values():
            container.stop(grace)
        back = time.monotonic() + seconds
        for container in pod.containers.values():
            container.next_start = back
            container.stopping = False
        self.event(f"{pod_name} down for {seconds:.0f} s (SIGTERM; started again after)")

    def delete_pod(self, pod_name: str, replace: bool = True) -> Pod | None:
        """Delete a pod as `kubectl delete pod` does (SIGTERM, the grace period, SIGKILL); its
        controller creates a replacement with fresh emptyDirs."""
        pod = self.pods[pod_name]
        grace = pod.workload.template["spec"].get("terminationGracePeriodSeconds", 30)
        pod.deleted = True
        started = time.monotonic()
        for container in pod.containers.values():
            container.stop(grace)
        self.event(f"pod {pod_name} deleted (SIGTERM; gone after "
                   f"{time.monotonic() - started:.1f} s)")
        if not replace:
            return None
        replacement = self._replace(pod_name)
        self.wait_started(replacement)
        return replacement

    def _replace(self, pod_name: str) -> Pod:
        """The controller's new pod for a deleted one (same index, next generation)."""
        pod = self.pods[pod_name]
        index = int(pod_name.split("-r")[0].rsplit("-", 1)[1])
        generation = sum(1 for p in self.pods if p.startswith(pod_name.split("-r")[0]))
        return self.create_pod(pod.workload.name, index, generation)

    # ---------------------------------------------------------------- drains
    def _selected(self, selector: dict[str, str]) -> list[Pod]:
        with self._lock:
            return [p for p in self.pods.values()
                    if not p.deleted and p.workload.selected_by(selector)]

    def ready(self, pod: Pod) -> bool:
        """Every container runs and passes its readiness probe (what a budget counts)."""
        for container in pod.containers.values():
            probe = container.spec.probes.get("readinessProbe")
            if not container.alive() or (probe is not None and not self.probe(pod, container,
                                                                              probe)):
                return False
        return True

    def refusing_budget(self, pod: Pod) -> tuple[Budget, int] | None:
        """The budget (and its healthy count) that refuses evicting `pod` now, if any."""
        for budget in self.budgets:
            if not pod.workload.selected_by(budget.selector):
                continue
            selected = self._selected(budget.selector)
            healthy = sum(self.ready(p) for p in selected)
            if budget.allowed(healthy, len(selected)) <= 0:
                return budget, healthy
        return None

    def drain(self, pod_names: list[str], retry_seconds: float = 5.0,
              timeout: float = 900.0) -> dict[str, Any]:
        """`kubectl drain` of a node that holds `pod_names`: each is evicted through the
        eviction API, which refuses while a disruption budget would be broken (kubectl retries
        every 5 s); an evicted pod gets SIGTERM and its grace period, and its controller makes
        a replacement elsewhere. Returns what happened: refusals, and the fewest ready pods of
        each budget seen while it ran (sampled every 0.2 s)."""
        started = time.monotonic()
        pending = list(pod_names)
        refusals: dict[str, int] = {}
        concerned = [b for b in self.budgets
                     if any(self.pods[n].workload.selected_by(b.selector) for n in pod_names)]
        fewest = {b.name: len(self._selected(b.selector)) for b in concerned}
        replacements: list[Pod] = []
        watching = threading.Event()

        def watch() -> None:
            while not watching.wait(0.2):
                for budget in concerned:
                    ready = sum(self.ready(p) for p in self._selected(budget.selector))
                    fewest[budget.name] = min(fewest[budget.name], ready)

        watcher = threading.Thread(target=watch, name="drain-watch", daemon=True)
        watcher.start()
        self.event(f"drain of a node holding {', '.join(pod_names)} (under "
                   f"{len(self.budgets)} disruption budgets)")
        try:
            while pending:
                if time.monotonic() - started > timeout:
                    raise TimeoutError(f"drain did not finish: {pending} still refused")
                for name in list(pending):
                    refused = self.refusing_budget(self.pods[name])
                    if refused is not None:
                        budget, healthy = refused
                        if name not in refusals:
                            self.event(f"eviction of {name} refused: budget {budget.name} "
                                       f"has {healthy} ready (retrying every "
                                       f"{retry_seconds:.0f} s)")
                        refusals[name] = refusals.get(name, 0) + 1
                        continue
                    pending.remove(name)
                    self.delete_pod(name, replace=False)
                    replacements.append(self._replace(name))
                if pending:
                    time.sleep(retry_seconds)
            for pod in replacements:
                self.wait_started(pod)
        finally:
            watching.set()
            watcher.join(timeout=5)
        self.event(f"drain done in {time.monotonic() - started:.1f} s: "
                   + ", ".join(f"{b} never below {n} ready" for b, n in sorted(fewest.items())))
        return {"refusals": refusals, "fewest_ready": fewest,
                "replacements": [p.name for p in replacements]}

    def _supervise(self) -> None:
        """The kubelet's restart loop: a container that exited is started again (restart
        policy Always), with what it printed kept in its previous log."""
        while not self._stop.wait(0.3):
            with self._lock:
                pods = list(self.pods.values())
            for pod in pods:
                if pod.deleted or not pod.workload.restarts:
                    continue
                for container in pod.containers.values():
                    if container.process is None or container.alive() or container.stopping:
                        continue
                    now = time.monotonic()
                    if not container.next_start:
                        # CrashLoopBackOff: at once after a long run, then 10 s doubling to 5 min.
                        ran = now - container.started_at
                        delay = 0.0 if ran > 60 or container.restarts == 0 else min(
                            10.0 * 2 ** (container.restarts - 1), 300.0)
                        container.next_start = now + delay
                    if now < container.next_start:
                        continue
                    container.next_start = 0.0
                    code = container.process.returncode
                    container.restarts += 1
                    container.start()
                    self.event(f"{pod.name}/{container.spec.name} exited ({code}); restarted "
                               f"(restart {container.restarts})")

    def wait_all_started(self) -> None:
        """Block until every container of every live pod runs and passes its probes (a Job's
        pod, which runs to completion, excepted)."""
        for pod in [p for p in list(self.pods.values()) if not p.deleted and p.workload.restarts]:
            for container in pod.containers.values():
                wait_until(lambda c=container: c.alive(), timeout=330,
                           what=f"{pod.name}/{container.spec.name} to run again", interval=0.1)
            for container in pod.containers.values():
                probe = container.spec.probes.get("readinessProbe") or container.spec.probes.get(
                    "startupProbe")
                if probe is not None:
                    wait_until(lambda c=container, p=probe, q=pod: self.probe(q, c, p), timeout=300,
                               what=f"{pod.name}/{container.spec.name} to be ready",
                               interval=0.2)

    def close(self) -> None:
        self._stop.set()
        self._supervisor.join(timeout=5)
        for pod in list(self.pods.values()):
            for container in pod.containers.values():
                container.stop(grace=10)
        for proxy in self.proxies.values():
            proxy.close()
