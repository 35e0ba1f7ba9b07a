"""The rehearsal's script: bring an overlay up, train through its API Service with the `tinker`
SDK, and break one role at a time while the loop runs, as Kubernetes (or a bad day) would.

The loop is deterministic (fixed token data, fixed LoRA seeds, cross-entropy steps), so what
"nothing lost" means is exact: every session's losses, step by step, are bit-for-bit those of
the same loop on an undisturbed server (the single-GPU overlay); every sample request returns;
every saved checkpoint is listed and loads. Disruptions are keyed to loop steps, so the same
step of the same run is hit on every rehearsal.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import tinker
from tinker import types

from tools.processes import wait_until
from tools.rehearsal.cluster import LocalCluster, Pod, Substitutions
from tools.rehearsal.manifests import GKE, render

API_KEY = "tml-rehearsal-key"
REDIS_PASSWORD = "rehearsal-redis-password"
LEARNING_RATE = 5e-2
SECRETS = {
    "autoresearch-api-keys": {"keys.txt": API_KEY + "\n"},
    "autoresearch-redis": {"password": REDIS_PASSWORD},
    "autoresearch-client": {"api-key": API_KEY},
}


@dataclass(frozen=True)
class RunPlan:
    """One session's training run: its LoRA seed and whether it trains the output head (which
    vLLM cannot serve, so its samples must come from a trainer)."""

    name: str
    seed: int
    train_unembed: bool


RUNS = (RunPlan("a", 11, True), RunPlan("b", 12, False))


def _datum(ids: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:],
                                       "weights": [1.0] * (len(ids) - 1)})


def batch(seed: int) -> list[types.Datum]:
    return [_datum([2 + (seed * 7 + i * 13 + j * 5) % 90 for j in range(12)]) for i in range(3)]


@dataclass
class RunRecord:
    losses: list[float] = field(default_factory=list)
    samples: int = 0
    checkpoints: list[str] = field(default_factory=list)
    model_id: str = ""


def _result(future: Any, timeout: float = 600) -> Any:
    return future.result(timeout=timeout)


def train(url: str, model: str, steps: int,
          disrupt: Callable[[int, dict[str, RunRecord], dict[str, Any]], None] | None = None,
          ) -> dict[str, RunRecord]:
    """The loop every overlay runs: per step and per run a forward-backward and an AdamW step;
    every third step sampling from freshly saved weights; a checkpoint at the end (and one
    loaded back). `disrupt(step, records, clients)` runs between steps; for step k it is called
    with step k's work submitted and not yet collected, so a role killed there dies mid-step."""
    records = {plan.name: RunRecord() for plan in RUNS}
    services = {plan.name: tinker.ServiceClient(base_url=url, api_key=API_KEY) for plan in RUNS}
    clients = {plan.name: _result(services[plan.name].create_lora_training_client(
        base_model=model, rank=8, seed=plan.seed, train_unembed=plan.train_unembed))
        for plan in RUNS}
    for plan in RUNS:
        records[plan.name].model_id = clients[plan.name].get_info().model_id
    for step in range(steps):
        pending = {}
        for plan in RUNS:
            client = clients[plan.name]
            pending[plan.name] = (client.forward_backward(batch(step), "cross_entropy"),
                                  client.optim_step(types.AdamParams(
                                      learning_rate=LEARNING_RATE)))
        if disrupt is not None:
            disrupt(step, records, clients)
        for plan in RUNS:
            forward_backward, optim = pending[plan.name]
            records[plan.name].losses.append(_result(forward_backward).metrics["loss:sum"])
            _result(optim)
        if step % 3 == 2:
            for plan in RUNS:
                sampler = _result(clients[plan.name].save_weights_and_get_sampling_client(
                    f"{plan.name}-step{step}"))
                answer = _result(sampler.sample(
                    types.ModelInput.from_ints([2, 10, 11, 12]), num_samples=2,
                    sampling_params=types.SamplingParams(max_tokens=6, temperature=0.7,
                                                         seed=step)))
                records[plan.name].samples += len(answer.sequences)
    for plan in RUNS:
        saved = _result(clients[plan.name].save_state(f"{plan.name}-final")).path
        records[plan.name].checkpoints.append(saved)
        _result(services[plan.name].create_training_client_from_state_with_optimizer(saved))
    return records


# ------------------------------------------------------------------ overlays
@dataclass
class Rehearsal:
    overlay: str
    cluster: LocalCluster
    records: dict[str, RunRecord]
    seconds: float
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    """What the tests check beyond the timeline (the placements around the Redis outage)."""

    def report(self) -> str:
        lines = [f"# rehearsal of overlays/{self.overlay}", "", "timeline:",
                 self.cluster.timeline(), "", "runs:"]
        for name, record in self.records.items():
            lines.append(f"  {name} ({record.model_id}): {len(record.losses)} steps, losses "
                         f"{[round(x, 4) for x in record.losses]}, {record.samples} samples, "
                         f"checkpoints {record.checkpoints}")
        lines += ["", *self.notes, f"total {self.seconds:.1f} s"]
        return "\n".join(lines)


DEVICE_ARGS = {
    "cuda": {"--device=cuda": ["--device=cpu", "--emulate-device=cuda"]},
    "cpu": {"--device=cuda": ["--device=cpu"], "--dtype=bfloat16": ["--dtype=float32"]},
}
"""What the manifests' GPU flags become: the CUDA layout emulated on the CPU (bf16 throughout,
the GPU's default path, batch invariance off as on a GPU), or the CPU's own fp32 layout."""


def _substitutions(model_dir: Path, root: Path, env: dict[str, str],
                   device: str = "cuda") -> Substitutions:
    """The model copied beside the volumes, as an image would hold it; the GPU's flags as
    `device` says (`DEVICE_ARGS`)."""
    local = root / "image" / "model"
    shutil.copytree(model_dir, local)
    for path in [local.parent, local, *local.rglob("*")]:  # an image's files: readable by all
        path.chmod(0o755 if path.is_dir() else 0o644)
    return Substitutions(model_dir=local, secrets=SECRETS, env=env, args=DEVICE_ARGS[device])


def own_share(cluster: LocalCluster) -> str:
    """The deployment's storage step: the share-owner Job, from its rendered manifest, run as
    root with the capabilities it adds against the claim's share (`deploy/gke/share-owner`)."""
    [job] = [d for d in render(GKE / "share-owner") if d.get("kind") == "Job"]
    ok, log = cluster.run_job(job, timeout=120)
    if not ok:
        raise RuntimeError(f"the share-owner Job failed:\n{log}")
    for line in log.strip().splitlines():
        cluster.event(f"share-owner: {line}")
    return log


def refused_until_owned(cluster: LocalCluster, pod: Pod) -> str:
    """A pod started on the fresh share (owned by root) must stop with the error that names
    the storage step; the step runs, and the pod's next start must come up. Returns that
    error."""
    container = next(iter(pod.containers.values()))
    wait_until(lambda: "share-owner" in container.log_text(), timeout=120,
               what=f"{pod.name} to refuse the root-owned share", interval=0.2)
    refusal = next(line for line in container.log_text().splitlines() if "share-owner" in line)
    cluster.event(f"{pod.name} refused the share: {refusal[:160]}")
    own_share(cluster)
    cluster.wait_started(pod)
    return refusal


def new_root() -> Path:
    """A fresh directory for one rehearsal's volumes and logs (not under /tmp, which pods
    mount)."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="autoresearch-rehearsal-", dir=base))


def single_gpu(model_dir: Path, steps: int, root: Path | None = None,
               say: Callable[[str], None] = print, device: str = "cuda") -> Rehearsal:
    """The all-in-one server on a fresh share owned by root: it refuses the share until the
    share-owner Job has run, then comes up; the loop; then its pod deleted and replaced (a node
    upgrade) and the loop resumed from the saved checkpoint."""
    root = root or new_root()
    started = time.monotonic()
    cluster = LocalCluster(render("single-gpu"), root,
                           _substitutions(model_dir, root, {}, device), say)
    try:
        pod = cluster.create_pod("autoresearch-server", 0)
        refusal = refused_until_owned(cluster, pod)
        url = cluster.url("autoresearch-api")
        model = str(cluster.subs.model_dir)
        records = train(url, model, steps)
        cluster.event("loop done: " + ", ".join(f"{n} {len(r.losses)} steps"
                                                for n, r in records.items()))
        cluster.delete_pod(pod.name)
        service = tinker.ServiceClient(base_url=url, api_key=API_KEY)
        for name, record in records.items():
            client = _result(service.create_training_client_from_state_with_optimizer(
                record.checkpoints[-1]))
            loss = _result(client.forward(batch(steps), "cross_entropy")).metrics["loss:sum"]
            cluster.event(f"after the replacement, run {name} resumed from "
                          f"{record.checkpoints[-1]} (next loss {loss:.4f})")
        return Rehearsal("single-gpu", cluster, records, time.monotonic() - started,
                         [f"before the share-owner Job: {refusal}"], {"refusal": refusal})
    except BaseException:
        cluster.close()
        raise


def _trainer_of(cluster: LocalCluster, model_id: str, redis_url: str) -> str:
    """The trainer pod that owns a run's session (its placement, read from Redis)."""
    import redis

    session = model_id.split(":", 1)[0]
    owner = redis.Redis.from_url(redis_url).get(f"ar:placement:{session}")
    for name, pod in cluster.pods.items():
        if pod.deleted or pod.workload.name != "autoresearch-trainer":
            continue
        port = pod.local_port("http")
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            continue
        if owner is not None and ready.get("worker_id") == owner.decode():
            return name
    raise LookupError(f"no live trainer pod owns {session} (placement {owner!r})")


REDIS_OUTAGE_SECONDS = 120.0
"""How long the split rehearsal's Redis stays away by default: the two minutes of a Redis pod
rescheduled with its disk re-attached, twelve times the trainers' heartbeat TTL (10 s), so
every heartbeat lapses many times over while it is gone."""


def split(model_dir: Path, steps: int, trainers: int = 2, root: Path | None = None,
          say: Callable[[str], None] = print,
          redis_outage: float = REDIS_OUTAGE_SECONDS, device: str = "cuda") -> Rehearsal:
    """Redis, two gateways, `trainers` trainers and a sampler pod (worker + vLLM stand-in); the
    loop runs while, one at a time and each after the last has healed: the trainer that owns
    run a is killed mid-step, the vLLM container is killed before a sampling step, the pod of
    the trainer that owns run b is deleted (drained), a gateway is killed, the sampler worker is
    killed before a sampling step, Redis is killed, Redis goes away for `redis_outage`
    seconds mid-step (its pod rescheduled), and a node holding both gateways and run a's
    trainer is drained under the disruption budgets. The share starts owned by root and the
    deployment's share-owner Job gives it to the pods' user first."""
    root = root or new_root()
    started = time.monotonic()
    cluster = LocalCluster(render("split"), root, _substitutions(model_dir, root, {}, device),
                           say)
    notes: list[str] = []
    facts: dict[str, Any] = {}
    try:
        own_share(cluster)
        cluster.scale_up("autoresearch-redis")
        redis_url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{cluster.proxies['autoresearch-redis'].port}/0"
        pods = [cluster.create_pod("autoresearch-gateway", i) for i in range(2)]
        pods += [cluster.create_pod("autoresearch-trainer", i) for i in range(trainers)]
        pods += [cluster.create_pod("autoresearch-sampler", 0)]
        for pod in pods:
            cluster.wait_started(pod)
        url = cluster.url("autoresearch-api")
        model = str(cluster.subs.model_dir)

        def disrupt(step: int, records: dict[str, RunRecord], clients: dict[str, Any]) -> None:
            cluster.wait_all_started()  # one disruption at a time: the last one has healed
            if step == 1:
                victim = _trainer_of(cluster, records["a"].model_id, redis_url)
                notes.append(f"run a was on {victim}, run b on "
                             f"{_trainer_of(cluster, records['b'].model_id, redis_url)}")
                cluster.kill(victim)  # mid-step: step 1's work is queued, not collected
            elif step == 2:
                cluster.kill("autoresearch-sampler-0", "vllm")  # step 2 samples next
            elif step == 3:
                cluster.delete_pod(_trainer_of(cluster, records["b"].model_id, redis_url))
            elif step == 4:
                cluster.kill("autoresearch-gateway-0")
            elif step == 5:
                cluster.kill("autoresearch-sampler-0", "sampler")  # step 5 samples next
            elif step == 6:
                cluster.kill("autoresearch-redis-0")
            elif step == 7:
                facts["placed before the outage"] = _placements(records, redis_url)
                facts["trainer restarts before the outage"] = _trainer_restarts(cluster)
                cluster.outage("autoresearch-redis-0", redis_outage)
            elif step == 8:  # a node upgrade: both gateways and run a's trainer on one node
                facts["placed after the outage"] = _placements(records, redis_url)
                facts["trainer restarts after the outage"] = _trainer_restarts(cluster)
                gateways = sorted(n for n, p in cluster.pods.items() if not p.deleted
                                  and p.workload.name == "autoresearch-gateway")
                facts["drain"] = cluster.drain(
                    [*gateways, _trainer_of(cluster, records["a"].model_id, redis_url)])

        records = train(url, model, steps, disrupt)
        cluster.event("loop done: " + ", ".join(f"{n} {len(r.losses)} steps"
                                                for n, r in records.items()))
        if "placed after the outage" not in facts:  # a loop too short to reach the drain
            facts["placed after the outage"] = _placements(records, redis_url)
            facts["trainer restarts after the outage"] = _trainer_restarts(cluster)
        notes += [f"{k}: {v}" for k, v in facts.items()]
        notes.append("sampled on the sampler workers: " + json.dumps(_sampled(redis_url)))
        notes += _trainer_log_lines(cluster, ("joined", "took over", "saved", "requeued",
                                              "reach Redis", "lost sessions", "rejoined"))
        return Rehearsal("split", cluster, records, time.monotonic() - started, notes, facts)
    except BaseException:
        cluster.close()
        raise


def optimizer_steps(cluster: LocalCluster, checkpoint: str) -> set[int]:
    """The steps each parameter's optimizer state in a saved checkpoint has taken: one per
    `optim_step` applied to the run, so a step lost or applied twice shows here exactly
    (whatever the numerics)."""
    import torch

    from server.storage.checkpoints import CheckpointStore, TinkerPath

    store = CheckpointStore(cluster.root / "volumes" / "autoresearch-data" / "checkpoints")
    state = torch.load(store.checkpoint_dir(TinkerPath.parse(checkpoint)) / "optimizer.pt",
                       map_location="cpu", weights_only=False)
    found: set[int] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "step":
                    found.add(int(item))
                else:
                    walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(state)
    return found


def _trainer_log_lines(cluster: LocalCluster, needles: tuple[str, ...]) -> list[str]:
    """What the trainers said about joining, taking over and draining, in time order."""
    lines = []
    for name, pod in cluster.pods.items():
        if pod.workload.name != "autoresearch-trainer":
            continue
        for line in pod.containers["trainer"].log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if any(n in str(entry.get("message", "")) for n in needles):
                lines.append(f"{entry.get('time')} {name}: {entry['message']}")
    return sorted(lines)


def _placements(records: dict[str, RunRecord], redis_url: str) -> dict[str, str]:
    """Which trainer each run's session is placed on."""
    import redis

    client = redis.Redis.from_url(redis_url)
    return {name: (client.get("ar:placement:" + r.model_id.split(":")[0]) or b"-").decode()
            for name, r in records.items()}


def _trainer_restarts(cluster: LocalCluster) -> dict[str, int]:
    """Container restarts of each live trainer pod."""
    return {name: pod.containers["trainer"].restarts for name, pod in cluster.pods.items()
            if pod.workload.name == "autoresearch-trainer" and not pod.deleted}


def _sampled(redis_url: str) -> dict[str, int]:
    import redis

    stats = redis.Redis.from_url(redis_url).hgetall("ar:stats")
    return {k.decode(): int(v) for k, v in stats.items() if k.startswith(b"sampled:")}


def tiny_study(model_dir: Path, trials: int = 2) -> dict[str, Any]:
    """A study of `trials` one-step trials on the given model: what the study Job runs here."""
    trial = {"base_model": str(model_dir), "tokenizer": str(model_dir), "lora_rank": 4,
             "sft": {"steps": 1, "batch_size": 2},
             "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16},
             "eval": {"every": 0, "dev_tasks": 4, "test_tasks": 4, "max_tokens": 16},
             "checkpoint_every": 1}
    return {"name": "rehearsal", "output_dir": "/results/rehearsal", "seed": 3,
            "reward_workers": 1,
            "executor": {"kind": "kubernetes", "job_template": "/config/trial-job.yaml",
                         "max_parallel_trials": 2},
            "base_trial": trial,
            "search_space": {"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
            "budget": {"max_trials": trials, "confirm_seeds": 0}}


def study_job(model_dir: Path, overlay: str = "study-job", trials: int = 2,
              root: Path | None = None, say: Callable[[str], None] = print) -> Rehearsal:
    """The single-GPU server and, beside it, the study Job (`overlay`: study-job or
    study-job-kueue): the study creates its trials as Jobs through a local stand-in for the
    Kubernetes API, which runs each Job's pod here. The study's pod is killed while its first
    trials run; the Job's retry (backoffLimit 1) resumes it from its journal."""
    import yaml

    from tools.rehearsal.kube_api import FakeKube

    root = root or new_root()
    started = time.monotonic()
    holder: dict[str, LocalCluster] = {}
    api = FakeKube(lambda job: holder["cluster"].run_job(job), run_seconds=0.0)
    kubeconfig = root / "kubeconfig.yaml"
    kubeconfig.write_text(yaml.safe_dump(api.kubeconfig()))
    subs = _substitutions(model_dir, root, {"KUBECONFIG": str(kubeconfig)})
    subs.files = {"autoresearch-study": {
        "study.yaml": yaml.safe_dump(tiny_study(subs.model_dir, trials))}}
    cluster = LocalCluster(render("single-gpu") + render(overlay), root, subs, say)
    holder["cluster"] = cluster
    try:
        own_share(cluster)
        cluster.scale_up("autoresearch-server")
        study = cluster.create_pod("autoresearch-study", 0)
        wait_for = time.monotonic() + 300
        while not api.created and time.monotonic() < wait_for:
            time.sleep(0.2)
        if not api.created:
            raise TimeoutError("the study created no trial Job:\n"
                               + study.containers["study"].log_text()[-4000:])
        cluster.kill(study.name)  # restartPolicy Never: the Job controller makes a new pod
        retry = cluster.create_pod("autoresearch-study", 0, generation=1)
        code = retry.containers["study"].process.wait(timeout=900)  # type: ignore[union-attr]
        cluster.event(f"study pod {retry.name} exited ({code}); trial Jobs created: "
                      f"{api.create_attempts}")
        if code != 0:
            raise RuntimeError(retry.containers["study"].log_text()[-4000:])
        journal = root / "volumes" / "autoresearch-data" / "studies" / "rehearsal"
        return Rehearsal(overlay, cluster, {}, time.monotonic() - started,
                         [f"trial Jobs created: {api.created}",
                          f"create attempts: {api.create_attempts}",
                          f"trial Jobs deleted when done: {api.deleted}",
                          f"journal: {journal / 'journal.duckdb'}"])
    except BaseException:
        cluster.close()
        raise
    finally:
        api.close()
