"""The Kubernetes executor: each trial runs as a Job next to the server, in the study's namespace.

The Job is made from the trial Job template the deployment ships (`trial-job.yaml`, mounted at
/config/trial-job.yaml): the executor sets its name (`<study>-<trial id>`), the study and trial
labels, the trial config in the pod annotation `autoresearch.dev/trial-config` (the pod reads it
as /config/trial.yaml), the runner image, and the trial's `--server-url` and `--out`. Everything
else is taken as written in the template.

The Job name is a function of the trial id, so a resumed study re-attaches to a Job that already
exists instead of starting the trial again. The executor polls the Job, streams step metrics
from the trial's record when the results volume is shared with the study, and reads the result
from that record or, failing that, from the result line the `trial` command prints to its log.
Uses only what the shipped Role allows: Jobs (create, get, list, delete), Pods (list) and pod
logs (get).
"""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml

from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import TrialFailed, TrialResult
from autoresearch.study.executors.base import (
    StepSink,
    TrialJob,
    TrialStopped,
    parse_result_line,
)
from autoresearch.study.spec import ExecutorSpec

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "/config/trial-job.yaml"
CONFIG_ANNOTATION = "autoresearch.dev/trial-config"
STUDY_LABEL = "autoresearch.dev/study"
TRIAL_LABEL = "autoresearch.dev/trial"
CONTAINER = "trial"


def job_name(study: str, trial_id: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", f"{study}-{trial_id}".lower()).strip("-")
    return name[:63].rstrip("-")


def _replace_arg(args: list[str], flag: str, value: str) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        kept.append(arg)
    return [*kept, f"{flag}={value}"]


class KubernetesExecutor:
    def __init__(self, study: str, spec: ExecutorSpec, server_url: str | None = None,
                 api_client: Any = None):
        from kubernetes import client, config

        if api_client is None:
            settings = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=settings)
            except config.ConfigException:
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"),
                                        client_configuration=settings)
            api_client = client.ApiClient(settings)
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.study = study
        self.spec = spec
        self.server_url = server_url
        self.namespace = (spec.namespace or os.environ.get("POD_NAMESPACE")
                          or _kubeconfig_namespace())
        self.template = yaml.safe_load(Path(spec.job_template or DEFAULT_TEMPLATE).read_text())
        self.image = spec.image or os.environ.get("AUTORESEARCH_RUNNER_IMAGE")
        self.poll_seconds = spec.poll_seconds

    # ------------------------------------------------------------ manifest
    def manifest(self, job: TrialJob) -> dict[str, Any]:
        body = copy.deepcopy(self.template)
        labels = {STUDY_LABEL: self.study, TRIAL_LABEL: job.id}
        meta = body.setdefault("metadata", {})
        meta["name"] = job_name(self.study, job.id)
        meta.pop("namespace", None)
        meta.setdefault("labels", {}).update(labels)
        pod = body["spec"]["template"]
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        pod["metadata"].setdefault("annotations", {})[CONFIG_ANNOTATION] = job.config.to_yaml()
        containers = pod["spec"]["containers"]
        container = next((c for c in containers if c.get("name") == CONTAINER), containers[0])
        if self.image:
            container["image"] = self.image
        args = list(container.get("args") or ["trial", "--config=/config/trial.yaml"])
        if self.server_url:
            args = _replace_arg(args, "--server-url", self.server_url)
        container["args"] = _replace_arg(args, "--out", str(job.directory))
        return body

    # ----------------------------------------------------------------- run
    def run(self, job: TrialJob, on_step: StepSink) -> TrialResult:
        from kubernetes.client.exceptions import ApiException

        name = job_name(self.study, job.id)
        try:
            self.batch.create_namespaced_job(self.namespace, self.manifest(job))
            log.info("created Job %s for trial %s", name, job.id)
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("Job %s already exists: re-attaching to trial %s", name, job.id)
        streamed = 0
        try:
            while True:
                status = self.batch.read_namespaced_job(name, self.namespace).status
                streamed = self._stream(job, on_step, streamed)
                if status is not None and (status.succeeded or 0) > 0:
                    break
                if status is not None and ((status.failed or 0) > 0
                                           or _condition(status, "Failed")):
                    raise TrialFailed(f"Job {name} failed:\n{self._log(job)[-2000:]}")
                time.sleep(self.poll_seconds)
            self._stream(job, on_step, streamed)
        except TrialStopped:
            # Stopped or pruned by the study: the Job must not go on spending the cluster.
            self.batch.delete_namespaced_job(name, self.namespace,
                                             propagation_policy="Background")
            raise
        record = TrialRecord(job.directory) if job.directory.exists() else None
        final = record.final() if record is not None else None
        if final is not None:
            return TrialResult(job.directory, final.get("dev"), final.get("test"), final["steps"],
                               final["tokens"], final["wall_seconds"], final.get("checkpoint"))
        result = parse_result_line(self._log(job), job.directory)
        if result is None:
            raise TrialFailed(f"Job {name} succeeded but left no result in its record or log")
        return result

    def _stream(self, job: TrialJob, on_step: StepSink, seen: int) -> int:
        """Forward step and evaluation lines the trial appended to its record (shared volume
        only)."""
        if not (job.directory / "record.jsonl").exists():
            return seen
        entries = [e for e in TrialRecord(job.directory).entries()
                   if e["type"] in ("step", "eval")]
        for index, entry in enumerate(entries[seen:], start=seen):
            on_step(entry)
            seen = index + 1
        return seen

    def _log(self, job: TrialJob) -> str:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{STUDY_LABEL}={self.study},{TRIAL_LABEL}={job.id}")
        texts = []
        for pod in sorted(pods.items, key=lambda p: p.metadata.name):
            response = self.core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, container=CONTAINER, _preload_content=False)
            texts.append(response.data.decode("utf-8", "replace"))
        return "\n".join(texts)

    def close(self) -> None:
        """Delete this study's finished Jobs (their results are journaled by now)."""
        jobs = self.batch.list_namespaced_job(self.namespace,
                                              label_selector=f"{STUDY_LABEL}={self.study}")
        for item in jobs.items:
            status = item.status
            if status is not None and ((status.succeeded or 0) > 0 or (status.failed or 0) > 0):
                self.batch.delete_namespaced_job(item.metadata.name, self.namespace,
                                                 propagation_policy="Background")


def _condition(status: Any, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in (status.conditions or []))


def _kubeconfig_namespace() -> str:
    try:
        from kubernetes import config

        _, active = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
        return active.get("context", {}).get("namespace") or "default"
    except Exception:  # noqa: BLE001 - no kubeconfig: in-cluster without POD_NAMESPACE
        return "default"
