"""The GKE deployment: every overlay renders, validates and passes the policy scan, offline.

Each overlay under deploy/gke/overlays is rendered with kustomize (the standalone binary, or
the one built into kubectl); every object is validated against the Kubernetes OpenAPI schemas
that `kubernetes-validate` ships; Checkov scans the rendered objects, a trial Job made from the
template the way the executor makes it, and the Dockerfiles. The remaining tests state the
deployment's own rules: GPU placement, probes, storage, secrets, RBAC and network reach.
A test whose tool is missing skips and names the tool.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GKE = ROOT / "deploy" / "gke"
OVERLAYS = ("single-gpu", "split", "study-job", "study-job-kueue")
SERVER_OVERLAYS = ("single-gpu", "split")
NAMESPACE = "autoresearch"
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
"""The oldest minor GKE still offers for new clusters here, and the newest schema shipped."""
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job", "DaemonSet"}
EXTERNAL_SECRETS = {"autoresearch-api-keys", "autoresearch-hf-token", "autoresearch-redis",
                    "autoresearch-client"}
"""Created by the operator (docs/deploy-gke.md); the manifests only reference them."""
TRIAL_TEMPLATES = {
    "study-job": GKE / "overlays" / "study-job" / "trial-job.yaml",
    "study-job-kueue": GKE / "components" / "kueue" / "trial-job.yaml",
}
CURATED_CHECKS = {
    # privilege and root
    "CKV_K8S_16", "CKV_K8S_20", "CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_29", "CKV_K8S_30",
    # capabilities
    "CKV_K8S_25", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_39",
    # host namespaces and host access
    "CKV_K8S_17", "CKV_K8S_18", "CKV_K8S_19", "CKV_K8S_26", "CKV_K8S_27",
    # resource requests and limits
    "CKV_K8S_10", "CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13",
    # probes
    "CKV_K8S_8", "CKV_K8S_9",
    # image tags and pulls
    "CKV_K8S_14", "CKV_K8S_15",
    # filesystem, seccomp, tokens, namespace, RBAC, network policy
    "CKV_K8S_22", "CKV_K8S_31", "CKV_K8S_38", "CKV_K8S_21", "CKV_K8S_49", "CKV2_K8S_6",
    # images
    "CKV_DOCKER_2", "CKV_DOCKER_3", "CKV_DOCKER_7", "CKV_DOCKER_8",
}
"""Checks that must have been evaluated (and passed), so a scan that silently skipped the
objects cannot pass."""


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


def render(overlay: str) -> list[dict]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl (which embeds kustomize) is installed")
    result = subprocess.run([*command, str(GKE / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kustomize build {overlay} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


def objects(rendered: dict[str, list[dict]], *overlays: str):
    for overlay in overlays or OVERLAYS:
        for obj in rendered[overlay]:
            yield overlay, obj


def pod_spec(obj: dict) -> dict | None:
    if obj["kind"] not in WORKLOAD_KINDS:
        return None
    return obj["spec"]["template"]["spec"]


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def name_of(overlay: str, obj: dict) -> str:
    return f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"


def instantiate_trial(template: Path, image: str) -> dict:
    """Fill the template the way the study's executor does (see the template's header)."""
    job = yaml.safe_load(template.read_text())
    job["metadata"]["name"] = "gemma-270m-sql-t0001"
    job["metadata"]["namespace"] = NAMESPACE
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        meta["labels"].update({"autoresearch.dev/study": "gemma-270m-sql",
                               "autoresearch.dev/trial": "t0001"})
    job["spec"]["template"]["metadata"]["annotations"]["autoresearch.dev/trial-config"] = (
        "name: t0001\nrl:\n  steps: 20\n")
    trial = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trial")
    trial["image"] = image
    return job


def study_image(rendered: dict[str, list[dict]], overlay: str) -> str:
    study = next(o for _, o in objects(rendered, overlay) if o["kind"] == "Job")
    env = study["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == "AUTORESEARCH_RUNNER_IMAGE")


# ----------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_matches_the_kubernetes_schema(rendered, version):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed")
    problems = []
    for overlay, obj in objects(rendered):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{name_of(overlay, obj)}: {exc.message} at {list(exc.path)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", TRIAL_TEMPLATES)
def test_the_trial_job_the_executor_creates_matches_the_schema(rendered, overlay):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed")
    job = instantiate_trial(TRIAL_TEMPLATES[overlay], study_image(rendered, overlay))
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)


def test_the_trial_template_is_mounted_where_the_study_reads_it(rendered):
    for overlay in TRIAL_TEMPLATES:
        maps = {o["metadata"]["name"]: o for _, o in objects(rendered, overlay)
                if o["kind"] == "ConfigMap"}
        template = next(m for n, m in maps.items() if n.startswith("autoresearch-trial-template"))
        assert yaml.safe_load(template["data"]["trial-job.yaml"]) == yaml.safe_load(
            TRIAL_TEMPLATES[overlay].read_text())
        study = next(o for _, o in objects(rendered, overlay) if o["kind"] == "Job")
        spec = pod_spec(study)
        projected = {s["configMap"]["name"] for v in spec["volumes"] if "projected" in v
                     for s in v["projected"]["sources"]}
        assert template["metadata"]["name"] in projected
        assert spec["containers"][0]["args"] == ["run", "/config/study.yaml"]


def test_the_kueue_template_differs_from_the_plain_one_by_the_queue_label_only():
    plain = yaml.safe_load(TRIAL_TEMPLATES["study-job"].read_text())
    queued = yaml.safe_load(TRIAL_TEMPLATES["study-job-kueue"].read_text())
    assert queued["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name") == "autoresearch"
    assert queued == plain


# ----------------------------------------------------------------- policy scan


@pytest.fixture(scope="module")
def checkov_reports(rendered, tmp_path_factory) -> list[dict]:
    binary = tool("checkov")
    if binary is None:
        pytest.skip("checkov is not installed (see docs/deploy-gke.md, 'Validating offline')")
    workdir = tmp_path_factory.mktemp("scan")
    files = []
    for overlay, docs in rendered.items():
        path = workdir / f"{overlay}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        files.append(path)
    for overlay, template in TRIAL_TEMPLATES.items():
        path = workdir / f"trial-{overlay}.yaml"
        path.write_text(yaml.safe_dump(instantiate_trial(template, study_image(rendered, overlay))))
        files.append(path)
    files += sorted((ROOT / "deploy" / "docker").glob("Dockerfile.*"))
    command = [binary, "--config-file", str(ROOT / "deploy" / ".checkov.yaml"), "-o", "json"]
    for path in files:
        command += ["-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=workdir)
    assert result.stdout.strip(), f"checkov printed no report:\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout)
    return reports if isinstance(reports, list) else [reports]


def test_checkov_finds_no_failed_check(checkov_reports):
    failed = [f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
              for report in checkov_reports for c in report["results"]["failed_checks"]]
    assert not failed, "\n".join(failed)
    errors = [e for report in checkov_reports for e in report["results"]["parsing_errors"]]
    assert not errors, errors


def test_checkov_evaluated_every_curated_check(checkov_reports):
    evaluated = {c["check_id"] for report in checkov_reports
                 for c in report["results"]["passed_checks"]}
    missing = CURATED_CHECKS - evaluated
    assert not missing, sorted(missing)
    kinds = {report["check_type"] for report in checkov_reports}
    assert {"kubernetes", "dockerfile"} <= kinds


def test_every_skipped_check_is_documented_with_a_reason(rendered, checkov_reports):
    annotated: dict[str, set[str]] = {}
    trials = [("trial template", instantiate_trial(template, "runner:0"))
              for template in TRIAL_TEMPLATES.values()]
    for overlay, obj in [*objects(rendered), *trials]:
        for key, value in (obj["metadata"].get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = value.partition("=")
                assert len(reason.split()) >= 4, f"{name_of(overlay, obj)}: {value!r} has no reason"
                annotated.setdefault(obj["metadata"]["name"], set()).add(check)
    for report in checkov_reports:
        for c in report["results"]["skipped_checks"]:
            resource_name = c["resource"].split(".")[-1]
            assert c["check_id"] in annotated.get(resource_name, set()), (
                f"{c['check_id']} skipped on {c['resource']} without an annotated reason")
    config = yaml.safe_load((ROOT / "deploy" / ".checkov.yaml").read_text())
    text = (ROOT / "deploy" / ".checkov.yaml").read_text()
    for check in config.get("skip-check", []):
        comment = text.split(f"- {check}")[0].rsplit("skip-check:", 1)[-1]
        assert "#" in comment, f"{check} is skipped in .checkov.yaml without a reason above it"


# ----------------------------------------------------------------- deployment rules


def test_everything_lands_in_the_autoresearch_namespace_labelled_part_of_autoresearch(rendered):
    for overlay, obj in objects(rendered):
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "autoresearch", \
            name_of(overlay, obj)
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == NAMESPACE
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, name_of(overlay, obj)


def test_every_container_sets_requests_and_limits_and_a_locked_down_security_context(rendered):
    for overlay, obj in objects(rendered):
        spec = pod_spec(obj)
        if spec is None:
            continue
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["seccompProfile"]["type"] == \
            "RuntimeDefault", name_of(overlay, obj)
        for c in containers(spec):
            where = f"{name_of(overlay, obj)} container {c['name']}"
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][section]), where
            ctx = c["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in ctx["capabilities"] and not ctx.get("privileged"), where
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), \
            name_of(overlay, obj)


def test_gpu_pods_target_the_gpu_pool_and_request_whole_gpus(rendered):
    gpu_workloads = set()
    for overlay, obj in objects(rendered):
        spec = pod_spec(obj)
        if spec is None:
            continue
        gpu_containers = [c for c in containers(spec)
                          if "nvidia.com/gpu" in c["resources"]["limits"]]
        if not gpu_containers:
            assert "cloud.google.com/gke-accelerator" not in spec.get("nodeSelector", {}), \
                f"{name_of(overlay, obj)} holds a GPU node without using a GPU"
            continue
        gpu_workloads.add(obj["metadata"]["name"])
        assert spec["nodeSelector"]["cloud.google.com/gke-accelerator"], name_of(overlay, obj)
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            spec["tolerations"], name_of(overlay, obj)
        for c in gpu_containers:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == \
                c["resources"]["requests"]["nvidia.com/gpu"] == "1", name_of(overlay, obj)
    assert gpu_workloads == {"autoresearch-server", "autoresearch-trainer", "autoresearch-sampler"}


def test_server_processes_probe_readyz_for_readiness_and_healthz_for_liveness(rendered):
    server_roles = {"server", "gateway", "trainer", "sampler"}
    seen = set()
    for overlay, obj in objects(rendered, *SERVER_OVERLAYS):
        spec = pod_spec(obj)
        role = obj["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if spec is None or role not in server_roles:
            continue
        process = next(c for c in spec["containers"] if c["name"] == role)
        ready = process["readinessProbe"]["httpGet"]["path"]
        alive = process["livenessProbe"]["httpGet"]["path"]
        if role == "server":  # the only API pod: a long call must not empty its Service
            assert (ready, alive) == ("/api/v1/healthz", "/livez"), name_of(overlay, obj)
        else:
            assert (ready, alive) == ("/readyz", "/api/v1/healthz"), name_of(overlay, obj)
        for c in spec["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, f"{name_of(overlay, obj)} {c}"
        seen.add(role)
    assert seen == server_roles


def test_split_roles_run_the_agreed_commands(rendered):
    args = {}
    for _, obj in objects(rendered, "split"):
        spec = pod_spec(obj)
        if spec:
            for c in spec["containers"]:
                args[c["name"]] = c.get("command", []) + c["args"]
    for role in ("gateway", "trainer", "sampler"):
        assert args[role][0] == role
        assert any(a.startswith("--redis-url=redis://") for a in args[role]), role
    assert "--data-dir=/data/checkpoints" in args["trainer"]
    assert {"--backend=vllm", "--vllm-url=http://localhost:8001"} <= set(args["sampler"])
    assert args["vllm"][:2] == ["vllm", "serve"]
    assert {"--enable-lora", "--max-loras=8"} <= set(args["vllm"])
    assert any(a.startswith("--max-lora-rank=") for a in args["vllm"])


def test_checkpoints_live_on_one_filestore_rwx_claim_that_every_pod_can_mount(rendered):
    for overlay in SERVER_OVERLAYS:
        claims = [o for _, o in objects(rendered, overlay) if o["kind"] == "PersistentVolumeClaim"]
        assert [(c["metadata"]["name"], c["spec"]["storageClassName"], c["spec"]["accessModes"])
                for c in claims] == [("autoresearch-data", "standard-rwx", ["ReadWriteMany"])]
    for overlay, obj in objects(rendered):
        spec = pod_spec(obj)
        for volume in (spec or {}).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] == "autoresearch-data", \
                    name_of(overlay, obj)


def test_secrets_are_referenced_never_shipped(rendered):
    referenced = set()
    for overlay, obj in objects(rendered):
        assert obj["kind"] != "Secret", f"{name_of(overlay, obj)}: secrets are created by hand"
        spec = pod_spec(obj)
        for volume in (spec or {}).get("volumes", []):
            if "secret" in volume:
                referenced.add(volume["secret"]["secretName"])
        for c in containers(spec) if spec else []:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.add(ref["name"])
    for _, template in TRIAL_TEMPLATES.items():
        job = yaml.safe_load(template.read_text())
        for c in job["spec"]["template"]["spec"]["containers"]:
            referenced |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                           if "secretKeyRef" in e.get("valueFrom", {})}
    assert referenced == EXTERNAL_SECRETS
    guide = (ROOT / "docs" / "deploy-gke.md").read_text()
    for name in EXTERNAL_SECRETS:
        assert f"create secret generic {name}" in guide, f"the guide never creates {name}"


def test_the_study_executor_may_manage_jobs_and_read_pods_in_its_namespace_only(rendered):
    kinds = {obj["kind"] for _, obj in objects(rendered)}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    for overlay in TRIAL_TEMPLATES:
        docs = rendered[overlay]
        role = next(o for o in docs if o["kind"] == "Role")
        rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"])
                 for r in role["rules"]}
        assert rules == {
            (("batch",), ("jobs",)): {"create", "get", "list", "watch", "delete"},
            (("",), ("pods",)): {"get", "list"},
            (("",), ("pods/log",)): {"get"},
        }
        binding = next(o for o in docs if o["kind"] == "RoleBinding")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "autoresearch-runner",
                                        "namespace": NAMESPACE}]
        study = pod_spec(next(o for o in docs if o["kind"] == "Job"))
        assert study["serviceAccountName"] == "autoresearch-runner"
    for overlay, obj in objects(rendered):
        spec = pod_spec(obj)
        if spec and spec.get("serviceAccountName") != "autoresearch-runner":
            assert spec["automountServiceAccountToken"] is False, name_of(overlay, obj)


def selects(selector: dict, labels: dict) -> bool:
    """Kubernetes label-selector semantics for matchLabels and matchExpressions."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def reach(policies: list[dict], labels: dict) -> tuple[bool, bool]:
    """(reachable from inside the namespace, reachable from outside it) for a pod's labels."""
    inside = outside = False
    for policy in policies:
        if not selects(policy["spec"]["podSelector"], labels):
            continue
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            if not peers:
                inside = outside = True
            for peer in peers or []:
                if "ipBlock" in peer or "namespaceSelector" in peer:
                    outside = True
                if set(peer) == {"podSelector"}:
                    inside = True
    return inside, outside


def test_only_the_api_pods_are_reachable_from_outside_the_namespace(rendered):
    for overlay in SERVER_OVERLAYS:
        docs = rendered[overlay]
        policies = [o for o in docs if o["kind"] == "NetworkPolicy"]
        assert any(p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"]
                   and not p["spec"].get("ingress") for p in policies), "no default deny"
        service = next(o for o in docs if o["kind"] == "Service"
                       and o["metadata"]["name"] == "autoresearch-api")
        roles = {}
        for obj in docs:
            spec = pod_spec(obj)
            if spec is None:
                continue
            labels = obj["spec"]["template"]["metadata"]["labels"]
            role = labels["app.kubernetes.io/component"]
            roles[role] = reach(policies, labels)
            is_api = selects({"matchLabels": service["spec"]["selector"]}, labels)
            assert roles[role][1] == is_api, f"{overlay}: {role} outside reach is {roles[role][1]}"
        expected_api = {"single-gpu": {"server"}, "split": {"gateway"}}[overlay]
        assert {r for r, (_, out) in roles.items() if out} == expected_api
        if overlay == "split":
            assert roles["redis"] == (True, False)
            assert roles["trainer"] == (True, False) and roles["sampler"] == (True, False)


def test_redis_admits_only_the_processes_that_use_it(rendered):
    docs = rendered["split"]
    policies = [o for o in docs if o["kind"] == "NetworkPolicy"]
    redis_policy = next(p for p in policies if p["spec"]["podSelector"].get("matchLabels", {})
                        .get("app.kubernetes.io/component") == "redis")
    (rule,) = redis_policy["spec"]["ingress"]
    (peer,) = rule["from"]
    clients = {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
               for o in docs if pod_spec(o)
               and selects(peer["podSelector"], o["spec"]["template"]["metadata"]["labels"])}
    assert clients == {"gateway", "trainer", "sampler"}


def test_long_running_services_have_disruption_budgets_and_the_gateway_autoscales(rendered):
    for overlay in SERVER_OVERLAYS:
        docs = rendered[overlay]
        budgets = [o["spec"] for o in docs if o["kind"] == "PodDisruptionBudget"]
        for obj in docs:
            if obj["kind"] in {"Deployment", "StatefulSet"}:
                labels = obj["spec"]["template"]["metadata"]["labels"]
                mine = [b for b in budgets if selects(b["selector"], labels)]
                assert mine, name_of(overlay, obj)
                if obj["spec"].get("replicas") == 1:  # a node drain must be able to evict it
                    assert all(b.get("maxUnavailable", 0) >= 1 and "minAvailable" not in b
                               for b in mine), name_of(overlay, obj)
    gateway = next(o for o in rendered["split"] if o["kind"] == "Deployment"
                   and o["metadata"]["name"] == "autoresearch-gateway")
    assert "replicas" not in gateway["spec"], "the HPA owns the gateway's replica count"
    hpa = next(o for o in rendered["split"] if o["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "autoresearch-gateway"
    assert hpa["spec"]["minReplicas"] >= 2


def test_the_guide_applies_only_overlays_that_exist():
    guide = (ROOT / "docs" / "deploy-gke.md").read_text()
    for line in guide.splitlines():
        if "-k deploy/gke/overlays/" in line:
            path = line.split("-k ", 1)[1].split()[0]
            assert (ROOT / path / "kustomization.yaml").exists(), line


def _flag_pairs(argv: list[str]) -> list[str]:
    """`--flag value` and `--flag=value` alike, as `--flag=value`."""
    pairs: list[str] = []
    for i, token in enumerate(argv):
        if token.startswith("--") and "=" not in token and i + 1 < len(argv) \
                and not argv[i + 1].startswith("--"):
            continue  # its value follows
        if i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1] \
                and not token.startswith("--"):
            pairs.append(f"{argv[i - 1]}={token}")
        else:
            pairs.append(token)
    return pairs


def test_the_vllm_container_runs_the_codes_serve_command(rendered):
    """The sampler worker refuses a vLLM whose logprobs are not the tempered ones, so the pod's
    `vllm serve` must be the code's own `serve_command()` for the manifest's values."""
    from server.samplers.vllm_process import serve_command

    sampler = next(doc for doc in rendered["split"] if doc["kind"] == "Deployment"
                   and doc["metadata"]["name"] == "autoresearch-sampler")
    containers = {c["name"]: c for c in sampler["spec"]["template"]["spec"]["containers"]}
    vllm = containers["vllm"]
    flags = dict(arg.split("=", 1) for arg in vllm["args"] if "=" in arg)
    argv, env = serve_command(
        "$(VLLM_MODEL)", served_model_name="$(BASE_MODEL)", host=flags["--host"],
        port=int(flags["--port"]), max_loras=int(flags["--max-loras"]),
        max_lora_rank=int(flags["--max-lora-rank"]),
        max_cpu_loras=int(flags["--max-cpu-loras"]),
        max_logprobs=int(flags["--max-logprobs"]), dtype=flags["--dtype"],
        gpu_memory_utilization=float(flags["--gpu-memory-utilization"]))
    assert _flag_pairs(vllm["command"] + vllm["args"]) == _flag_pairs(argv)
    literal_env = {e["name"]: e["value"] for e in vllm["env"] if "value" in e}
    assert {k: literal_env.get(k) for k in env} == env
    worker = containers["sampler"]
    assert f"--vllm-url=http://localhost:{flags['--port']}" in worker["args"]
    assert "startupProbe" in worker  # it waits minutes for vLLM before serving health


def test_nothing_writes_under_a_read_only_mount(rendered):
    """The sampler worker publishes adapters: its --adapter-root must be a writable mount that
    the vLLM container sees at the same path."""
    sampler = next(doc for doc in rendered["split"] if doc["kind"] == "Deployment"
                   and doc["metadata"]["name"] == "autoresearch-sampler")
    containers = {c["name"]: c for c in sampler["spec"]["template"]["spec"]["containers"]}
    worker, vllm = containers["sampler"], containers["vllm"]
    root = next(a.split("=", 1)[1] for a in worker["args"] if a.startswith("--adapter-root="))
    mounts = {m["mountPath"]: m for m in worker["volumeMounts"]}
    assert root in mounts and not mounts[root].get("readOnly")
    assert root in {m["mountPath"] for m in vllm["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True


def test_redis_memory_is_bounded_below_its_limit_and_never_evicts_queued_work(rendered):
    redis = next(o for o in rendered["split"] if o["kind"] == "StatefulSet"
                 and o["metadata"]["name"] == "autoresearch-redis")
    (container,) = pod_spec(redis)["containers"]
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    bound = args[args.index("--maxmemory") + 1]
    assert bound.endswith("mb")
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(bound[:-2]) < int(limit[:-2]) * 1024


# ----------------------------------------------------------------- storage ownership


def _share_owner() -> list[dict]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl (which embeds kustomize) is installed")
    result = subprocess.run([*command, str(GKE / "share-owner")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_share_owner_job_is_root_with_chown_alone_in_a_baseline_namespace_of_its_own():
    """Root with CAP_CHOWN is refused by the restricted namespace the workloads run in, so the
    Job lives in its own namespace at baseline (warning and auditing at restricted), with every
    other capability dropped and nothing else a baseline pod may have."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed")
    docs = _share_owner()
    for obj in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    [namespace] = [d for d in docs if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert namespace["metadata"]["name"] != NAMESPACE
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert job["metadata"]["namespace"] == namespace["metadata"]["name"]
    spec = job["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsUser"] == 0
    assert spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    ctx = container["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE"]}
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert [v for v in spec["volumes"] if "nfs" in v]  # reaches the share without a claim


def test_the_share_owner_gives_away_every_directory_the_workloads_mount_by_subpath(rendered):
    """The kubelet creates a missing subPath directory owned by root, so each one the overlays
    mount from the share is made and given away by the Job too."""
    [job] = [d for d in _share_owner() if d["kind"] == "Job"]
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    owner = env["OWNER"]
    subdirs = set(env["SUBDIRS"].split())
    mounted = set()
    for overlay, obj in objects(rendered):
        spec = pod_spec(obj)
        if spec is None:
            continue
        claims = {v["name"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
        for c in containers(spec):
            for mount in c.get("volumeMounts", []):
                if mount["name"] in claims and mount.get("subPath"):
                    mounted.add(mount["subPath"])
        user, group = spec["securityContext"]["runAsUser"], spec["securityContext"].get(
            "runAsGroup", spec["securityContext"].get("fsGroup"))
        assert f"{user}:{group}" == owner, name_of(overlay, obj)
    for template in TRIAL_TEMPLATES.values():
        trial = yaml.safe_load(template.read_text())["spec"]["template"]["spec"]
        mounted |= {m["subPath"] for c in trial["containers"]
                    for m in c.get("volumeMounts", []) if m.get("subPath")}
    assert mounted and mounted <= subdirs, (mounted, subdirs)


def test_the_share_owner_script_parses_and_fills_in_the_volume_the_job_names():
    script = GKE / "share-owner" / "apply.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    [job] = [d for d in _share_owner() if d["kind"] == "Job"]
    [nfs] = [v["nfs"] for v in job["spec"]["template"]["spec"]["volumes"] if "nfs" in v]
    assert nfs["server"] in text and nfs["path"] in text
    guide = (ROOT / "docs" / "deploy-gke.md").read_text()
    assert "deploy/gke/share-owner/apply.sh" in guide


def test_the_share_owner_script_applies_the_job_on_the_bound_filestore_volume(tmp_path):
    """apply.sh against a kubectl that answers as GKE does for a bound Filestore claim: the
    Job it applies reaches that instance's address and share, and it waits for the Job."""
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl (which embeds kustomize) is installed")
    applied, calls = tmp_path / "applied.yaml", tmp_path / "calls.txt"
    fake = tmp_path / "bin" / "kubectl"
    fake.parent.mkdir()
    fake.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {calls}
case "$*" in
  *"get pvc autoresearch-data"*) printf pvc-0123 ;;
  *"get pv pvc-0123"*volumeAttributes.ip*) printf 10.20.30.40 ;;
  *"get pv pvc-0123"*volumeAttributes.volume*) printf vol1 ;;
  kustomize*) exec {" ".join(command)} "$2" ;;
  "apply -f -") cat > {applied} ;;
esac
""")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:/usr/bin:/bin"}
    result = subprocess.run(["bash", str(GKE / "share-owner" / "apply.sh")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [job] = [d for d in yaml.safe_load_all(applied.read_text()) if d and d["kind"] == "Job"]
    [volume] = job["spec"]["template"]["spec"]["volumes"]
    assert volume["nfs"] == {"server": "10.20.30.40", "path": "/vol1"}
    made = calls.read_text().splitlines()
    assert any(c.startswith("-n autoresearch-share-owner wait --for=condition=complete")
               for c in made), made
