"""The Helm chart, rendered by the real helm and checked against the package it deploys."""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.run as torchrun

from inferix.api.v1 import kvcache_pb2, scheduler_pb2, streamer_pb2, worker_pb2
from scheduler.auth import ApiKeys
from tests.deploy.conftest import CHART, ROOT, Manifest, Render, check_helm, containers, dump, find

MULTI_GPU = "examples/multi-gpu.yaml"
CPU = "examples/cpu.yaml"
ALL_FEATURES = "ci/all-features-values.yaml"
VALUES_SETS = [(), (MULTI_GPU,), (CPU,), (ALL_FEATURES,)]

GRPC_SERVICES = {
    m.DESCRIPTOR.services_by_name[name].full_name
    for m, name in [
        (scheduler_pb2, "SchedulerService"),
        (worker_pb2, "WorkerService"),
        (kvcache_pb2, "KVCacheService"),
        (streamer_pb2, "StreamerService"),
    ]
}


def worker_container(manifests: list[Manifest]) -> dict[str, Any]:
    (container,) = containers(find(manifests, "StatefulSet", "-worker"))
    return container


def flag(container: dict[str, Any], name: str) -> str | None:
    """The value of `--name=value` in the container's args (None if absent)."""
    values = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given {len(values)} times"
    return values[0] if values else None


# ---- make helm-lint ------------------------------------------------------------------------------


def test_make_helm_lint_passes() -> None:
    """What `make helm-lint` runs: helm lint --strict, helm template, kubernetes-validate --strict."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_helm.py")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for version in check_helm.KUBE_VERSIONS:
        assert f"kubernetes-validate --strict -k {version}: " in result.stdout
    assert "helm lint --strict: examples/multi-gpu.yaml: ok" in result.stdout
    # The only manifests not validated are custom resources (ServiceMonitor, PrometheusRule,
    # ScaledObject, ...), and it is said so.
    skipped = re.findall(r"^  skipped \S+: (\w+)/", result.stdout, re.M)
    crds = {kind for _, kind in check_helm.CRD_KINDS}
    assert {"ServiceMonitor", "PrometheusRule", "ScaledObject"} <= set(skipped) <= crds, skipped


def test_kubernetes_validate_rejects_what_kubernetes_rejects(render: Render) -> None:
    """The validation is strict: an unknown field in a rendered pod spec is an error for every version."""
    manifests = render(set=["worker.extraEnv[0].name=X", "worker.extraEnv[0].valueFrm=typo"])
    rendered = json.dumps(find(manifests, "StatefulSet", "-worker"))
    for version in check_helm.KUBE_VERSIONS:
        validation = check_helm.validate({"typo": rendered}, version)
        assert any("StatefulSet" in e and "valueFrm" in e for e in validation.errors), validation.errors
    # ... and a kind without a schema is an error unless it is a CRD skipped by name.
    unknown = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n"
    assert check_helm.validate({"widget": unknown}, check_helm.KUBE_VERSIONS[0]).errors


# ---- values.schema.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("worker:\n  replicas: -1\n", "/worker/replicas"),
        ("worker:\n  gpu:\n    enabled: true\n    resourceName: nvidia.com/gpu\n    count: 2\n", "count"),
        ("worker:\n  sequenceParallel: 0\n", "/worker/sequenceParallel"),
        ("scheduler:\n  replicas: two\n", "/scheduler/replicas"),
        ("scheduler:\n  replicas: 2\n", "/scheduler/replicas"),
        ("streamer:\n  encoder: h265\n", "/streamer/encoder"),
        ("gpus: 8\n", "gpus"),
        ("worker:\n  autoscaling:\n    enabled: true\n    mode: vpa\n", "/worker/autoscaling/mode"),
        ("worker:\n  autoscaling:\n    targets:\n      demandPerWorker: 1.5\n", "demandPerWorker"),
        ("monitoring:\n  dashboard:\n    enable: true\n", "enable"),
    ],
    ids=[
        "negative-replicas",
        "unknown-gpu-key",
        "zero-ranks",
        "wrong-type",
        "two-schedulers",
        "bad-enum",
        "unknown-top-level-key",
        "unknown-autoscaling-mode",
        "demand-above-1",
        "monitoring-typo",
    ],
)
def test_broken_values_fail_schema_validation(tmp_path: Path, values: str, message: str) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(values)
    lint = check_helm.lint([broken])
    assert lint.returncode != 0
    assert "schema" in lint.stdout + lint.stderr and message in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    template = check_helm.template([broken])
    assert template.returncode != 0 and message in template.stderr, template.stderr


def test_examples_are_valid_values() -> None:
    examples = sorted((CHART / "examples").glob("*.yaml"))
    assert {p.name for p in examples} >= {"multi-gpu.yaml", "cpu.yaml"}
    for example in examples:
        assert check_helm.lint([example]).returncode == 0, example


# ---- the worker pod -------------------------------------------------------------------------------


def test_multi_gpu_worker_requests_gpus_and_starts_ranks_with_torchrun(render: Render) -> None:
    import yaml

    example = yaml.safe_load((CHART / MULTI_GPU).read_text())["worker"]
    ranks = example["sequenceParallel"]
    assert ranks > 1
    manifests = render(MULTI_GPU)
    worker = find(manifests, "StatefulSet", "-worker")
    container = worker_container(manifests)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == ranks
    assert resources["requests"]["nvidia.com/gpu"] == ranks
    # torchrun's own parser: one node, `ranks` processes, the workers module.
    parsed = torchrun.get_args_parser().parse_args(container["command"][1:] + container["args"])
    assert container["command"][0] == "torchrun"
    assert parsed.nproc_per_node == str(ranks) and parsed.standalone and parsed.module
    assert parsed.training_script == "workers"
    assert worker["spec"]["replicas"] == example["replicas"]
    pod = worker["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == example["nodeSelector"]
    assert pod["tolerations"] == example["tolerations"]
    assert pod["affinity"] == example["affinity"]
    assert flag(container, "device") == "cuda"
    assert container["image"].split(":")[0].endswith("/worker-cuda")


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_world_size_follows_sequence_parallel(render: Render, ranks: int) -> None:
    container = worker_container(render(set=[f"worker.sequenceParallel={ranks}"]))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == ranks
    if ranks == 1:
        assert container["command"] == ["python", "-m", "workers"]
    else:
        parsed = torchrun.get_args_parser().parse_args(container["command"][1:] + container["args"])
        assert parsed.nproc_per_node == str(ranks)


@pytest.mark.parametrize("values", [(), (MULTI_GPU,)])
def test_a_worker_drains_before_it_is_killed(render: Render, values: tuple[str, ...]) -> None:
    """SIGTERM drains a worker (blocks in flight committed, sessions moved) within worker.grace: the
    kubelet's SIGKILL, and torchrun's for a pod's ranks, come only after that, with room to stop."""
    import yaml

    manifests = render(*values)
    worker = find(manifests, "StatefulSet", "-worker")
    container = worker_container(manifests)
    grace = float(yaml.safe_load((CHART / "values.yaml").read_text())["worker"]["grace"])
    assert float(flag(container, "grace") or 0) == grace >= 10  # a block in flight on a GPU and the hand-over
    pod = worker["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= grace + 20, pod["terminationGracePeriodSeconds"]
    if container["command"][0] == "torchrun":
        parsed = torchrun.get_args_parser().parse_args(container["command"][1:] + container["args"])
        assert grace < float(parsed.shutdown_timeout) < pod["terminationGracePeriodSeconds"]
    # No preStop delay: the scheduler reaches the worker by its pod address, published while it drains.
    assert "lifecycle" not in container
    assert find(manifests, "Service", "-worker")["spec"]["publishNotReadyAddresses"] is True


def test_cpu_workers_request_no_gpu(render: Render) -> None:
    container = worker_container(render(CPU))
    assert not any("gpu" in key for key in container["resources"].get("limits", {}))
    assert flag(container, "device") == "cpu"
    assert container["image"].split(":")[0].endswith("/worker-cpu")


def test_worker_mounts_the_model_folder(render: Render) -> None:
    # The multi-GPU example: a PVC (sub-folder) plus a model.yaml from a ConfigMap.
    manifests = render(MULTI_GPU)
    worker = find(manifests, "StatefulSet", "-worker")
    pod = worker["spec"]["template"]["spec"]
    container = worker_container(manifests)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-weights"]["persistentVolumeClaim"] == {"claimName": "inferix-models", "readOnly": True}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["model-weights"]["mountPath"] == "/models" and mounts["model-weights"]["readOnly"]
    assert mounts["model-weights"]["subPath"] == "self-forcing"
    model_dir = flag(container, "model")
    assert model_dir is not None and mounts["model"]["mountPath"] == model_dir
    # The init container links the weights into that folder and adds the ConfigMap's model.yaml.
    (init,) = containers(worker, init=True)
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mounts["model"] == model_dir and init_mounts["model-weights"] == "/models"
    assert f"{model_dir}/model.yaml" in init["args"][0]
    config_map = find(manifests, "ConfigMap", "-model")
    assert volumes["model-config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_map["data"]["model.yaml"].strip() == "preset: self-forcing-dmd"

    # Only a hostPath: the worker loads the mounted folder itself.
    manifests = render(set=["worker.model.volume.hostPath.path=/mnt/models/causvid", "worker.model.mountPath=/weights"])
    container = worker_container(manifests)
    pod = find(manifests, "StatefulSet", "-worker")["spec"]["template"]["spec"]
    assert flag(container, "model") == "/weights"
    assert {"name": "model-weights", "mountPath": "/weights", "readOnly": True} in container["volumeMounts"]
    assert {"name": "model-weights", "hostPath": {"path": "/mnt/models/causvid"}} in pod["volumes"]

    # No volume: the built-in toyworld model, no --model.
    assert flag(worker_container(render()), "model") is None


def test_workers_have_stable_identities(render: Render) -> None:
    manifests = render()
    worker = find(manifests, "StatefulSet", "-worker")
    headless = find(manifests, "Service", "-worker")
    assert headless["spec"]["clusterIP"] == "None"
    assert worker["spec"]["serviceName"] == headless["metadata"]["name"]
    container = worker_container(manifests)
    assert flag(container, "worker-id") == "$(POD_NAME)"
    assert flag(container, "advertise-address") == (
        f"$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:50052"
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


# ---- the chart against the package ----------------------------------------------------------------


def _substitute(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args, with values standing in for the downward API."""
    fake = {"POD_NAME": "inferix-worker-0", "POD_NAMESPACE": "inferix"}
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), fake.get(m.group(1), m.group(0))), text)


def _entry_point(container: dict[str, Any]) -> tuple[str, list[str]]:
    """(module, its argv) of a `python -m MODULE` or `torchrun ... -m MODULE` container."""
    command, args = container["command"], container.get("args", [])
    if command[:2] == ["python", "-m"]:
        return command[2], command[3:] + args
    assert command[0] == "torchrun", f"unexpected command {command}"
    parsed = torchrun.get_args_parser().parse_args(command[1:] + args)
    assert parsed.module, "torchrun must start the service module with -m"
    return parsed.training_script, list(parsed.training_script_args)


def _inferix_containers(manifests: list[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "StatefulSet"):
            for container in containers(manifest):
                if container["command"][0] in ("python", "torchrun"):
                    found.append((manifest["metadata"]["name"], container))
    return found


def test_container_commands_are_package_entry_points(render: Render) -> None:
    """Every service container runs a module of the package, and its parser accepts the chart's flags."""
    cases: list[dict[str, Any]] = []
    where: list[str] = []
    for values in VALUES_SETS:
        for name, container in _inferix_containers(render(*values)):
            module, argv = _entry_point(container)
            spec = importlib.util.find_spec(f"{module}.__main__")
            assert spec is not None, f"{name}: `python -m {module}`: no {module}/__main__.py in the package"
            env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            argv = [_substitute(a, env) for a in argv]
            cases.append({"module": module, "argv": argv, "env": {k: _substitute(v, env) for k, v in env.items()}})
            where.append(f"{'+'.join(values) or 'defaults'}: {name}")
    assert {c["module"] for c in cases} == {"scheduler", "workers", "kvcache_svc", "streamer"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.deploy.parse_cli"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for label, case, parsed in zip(where, cases, json.loads(result.stdout), strict=True):
        assert parsed["ok"], f"{label}: python -m {case['module']} {' '.join(case['argv'])}\n{parsed['error']}"
        args = parsed["args"]
        # Reachable from other pods, on the port the probes and Services use.
        assert args["host"] == "0.0.0.0", label
        if case["module"] == "workers":
            assert args["worker_id"] == "inferix-worker-0", label
        if case["module"] in ("scheduler", "kvcache_svc") and "INFERIX_REDIS_URL" in case["env"]:
            assert args["redis_url"] == case["env"]["INFERIX_REDIS_URL"], label
        # The live outputs: the streamer pushes to the relay and serves the viewer page; the scheduler
        # hands out where players and browsers find them, and where the streamer reaches it.
        if case["module"] == "streamer":
            assert args["rtmp_url"] == "rtmp://inferix-rtmp:1935/live", label
            assert args["http_port"] == "8088" and args["scheduler"] == "inferix-scheduler:50051", label
        if case["module"] == "scheduler":
            assert args["advertise_address"] == "inferix-scheduler:50051", label
            assert args["rtmp_play_url"].startswith("rtmp://") and args["rtmp_play_url"].endswith("/live"), label
            assert args["viewer_page_url"].startswith("http"), label
    # `python -m MODULE --help` works for each (the command line as a person would try it).
    helps = {
        module: subprocess.Popen(
            [sys.executable, "-m", module, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for module in sorted({c["module"] for c in cases})
    }
    for module, process in helps.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0 and f"usage: python -m {module}" in out, err


def test_probes_use_grpc_health_of_the_services(render: Render) -> None:
    for name, container in _inferix_containers(render(MULTI_GPU)):
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        assert container["readinessProbe"]["grpc"]["port"] == port, name
        assert container["readinessProbe"]["grpc"]["service"] in GRPC_SERVICES, name
        assert container["livenessProbe"]["grpc"] == {"port": port}, name
        assert container["startupProbe"]["grpc"] == {"port": port}, name
        assert flag(container, "port") == str(port), name


def test_images_are_built_by_the_dockerfiles(render: Render) -> None:
    """Each Inferix image is docker/<name>.Dockerfile, whose ENTRYPOINT runs the chart's module."""
    for values in VALUES_SETS:
        for manifest in render(*values):
            if manifest["kind"] not in ("Deployment", "StatefulSet"):
                continue
            for container in containers(manifest) + containers(manifest, init=True):
                repository = container["image"].rsplit(":", 1)[0]
                if not repository.startswith("ghcr.io/inferix/"):
                    assert repository == "docker.io/library/redis", repository
                    continue
                dockerfile = ROOT / "docker" / f"{repository.rsplit('/', 1)[1]}.Dockerfile"
                assert dockerfile.is_file(), f"{container['image']}: no {dockerfile.relative_to(ROOT)}"
                entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile.read_text(), re.MULTILINE)
                assert entrypoint is not None, dockerfile
                if container["command"][:2] == ["python", "-m"]:
                    assert json.loads(entrypoint.group(1)) == container["command"], dockerfile


# ---- secrets, network policies, optional resources ------------------------------------------------


def test_api_keys_come_from_a_mounted_secret(render: Render, tmp_path: Path) -> None:
    manifests = render(ALL_FEATURES)
    scheduler = find(manifests, "Deployment", "-scheduler")
    (container,) = containers(scheduler)
    keys_file = flag(container, "api-keys-file")
    assert keys_file is not None
    mount = next(m for m in container["volumeMounts"] if keys_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in scheduler["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    secret = find(manifests, "Secret", "-api-keys")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    content = base64.b64decode(secret["data"][keys_file.rsplit("/", 1)[1]]).decode()
    # The scheduler's own loader reads the rendered file.
    path = tmp_path / "api-keys"
    path.write_text(content)
    keys = ApiKeys.load(path, env="")
    assert keys.principals == {"alice", "bob"}

    # No keys given: one generated key, long enough for the scheduler.
    generated = base64.b64decode(find(render(), "Secret", "-api-keys")["data"]["api-keys"]).decode()
    path.write_text(generated)
    assert len(ApiKeys.load(path, env="").digests) == 1

    # An existing Secret: nothing rendered, its key file mounted.
    manifests = render(set=["apiKeys.existingSecret=team-keys", "apiKeys.existingSecretKey=keys.txt"])
    assert not [m for m in manifests if m["kind"] == "Secret" and "api-keys" in m["metadata"]["name"]]
    (container,) = containers(find(manifests, "Deployment", "-scheduler"))
    assert flag(container, "api-keys-file") == "/etc/inferix/api-keys/keys.txt"


def test_services_share_the_mesh_secrets(render: Render) -> None:
    from inferix.server import INTERNAL_TOKEN_ENV  # what every service reads

    manifests = render(MULTI_GPU)
    secret = find(manifests, "Secret", "-mesh")
    for key in ("internal-token", "viewer-secret"):
        assert len(base64.b64decode(secret["data"][key])) >= 32
    ref = {"name": secret["metadata"]["name"]}
    services = {f"inferix-{c}" for c in ("scheduler", "kvcache", "streamer", "worker")}
    found = {}
    for name, container in _inferix_containers(manifests):
        secrets = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        found[name] = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in secrets}
    assert set(found) == services
    for name, env in found.items():
        assert env[INTERNAL_TOKEN_ENV] == {**ref, "key": "internal-token"}, name
    # The viewer links: signed by the scheduler, checked by the streamer.
    for name in ("inferix-scheduler", "inferix-streamer"):
        assert found[name]["INFERIX_VIEWER_SECRET"] == {**ref, "key": "viewer-secret"}, name
    # An existing Secret instead: nothing generated.
    manifests = render(set=["meshSecret.existingSecret=mesh"])
    assert not [m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"].endswith("-mesh")]
    (kvcache,) = containers(find(manifests, "Deployment", "-kvcache"))
    token = next(e for e in kvcache["env"] if e["name"] == INTERNAL_TOKEN_ENV)
    assert token["valueFrom"]["secretKeyRef"] == {"name": "mesh", "key": "internal-token"}


def _allowed(policy: Manifest, port: int | None, protocol: str = "TCP") -> list[Any]:
    """The `from` peers allowed on `port` (None: every port of `protocol`; ["*"] = any source)."""
    peers: list[Any] = []
    for rule in policy["spec"]["ingress"]:
        if any(p.get("port") == port and p["protocol"] == protocol for p in rule["ports"]):
            peers += rule.get("from", ["*"])
    return peers


def _components(peers: list[Any]) -> set[str]:
    return {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers if "podSelector" in p}


def test_network_policies(render: Render) -> None:
    manifests = render()
    policy = {m["metadata"]["name"].rsplit("-", 1)[1]: m for m in manifests if m["kind"] == "NetworkPolicy"}
    assert set(policy) == {"scheduler", "worker", "kvcache", "streamer", "redis", "rtmp"}
    assert "*" in _allowed(policy["scheduler"], 50051)  # clients
    assert _components(_allowed(policy["scheduler"], 50051)) == {"streamer"}  # viewer commands
    assert _components(_allowed(policy["worker"], 50052)) == {"scheduler"}
    assert _components(_allowed(policy["kvcache"], 50053)) == {"scheduler", "worker"}
    assert _components(_allowed(policy["streamer"], 50054)) == {"worker"}
    assert _allowed(policy["streamer"], 8088) == ["*"]  # the viewer page
    assert _allowed(policy["streamer"], None, "UDP") == ["*"]  # WebRTC media (ICE host candidates)
    assert _components(_allowed(policy["redis"], 6379)) == {"scheduler", "kvcache"}
    assert _allowed(policy["rtmp"], 1935) == ["*"]  # players; nginx limits publishing
    for name, p in policy.items():
        assert p["spec"]["policyTypes"] == ["Ingress"], name
        selected = p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        assert selected == name
    # Recordings for clients: the streamer's gRPC port opens when it has a public address.
    # Restricted clients: the streamer still reaches the scheduler.
    restricted = render(set=["networkPolicy.clientsFrom[0].ipBlock.cidr=203.0.113.0/24"])
    scheduler_peers = _allowed(find(restricted, "NetworkPolicy", "-scheduler"), 50051)
    assert "*" not in scheduler_peers and {"ipBlock": {"cidr": "203.0.113.0/24"}} in scheduler_peers
    assert _components(scheduler_peers) == {"streamer"}
    manifests = render(set=["streamer.publicAddress=streamer.example.com:50054"])
    streamer = find(manifests, "NetworkPolicy", "-streamer")
    assert _allowed(streamer, 50054) == ["*"]
    (scheduler,) = containers(find(manifests, "Deployment", "-scheduler"))
    assert flag(scheduler, "streamer-public") == "streamer.example.com:50054"


def test_optional_resources(render: Render) -> None:
    defaults = {(m["kind"], m["metadata"]["name"]) for m in render()}
    kinds = {kind for kind, _ in defaults}
    assert "ServiceMonitor" not in kinds and "Ingress" not in kinds  # off by default
    assert {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    everything = render(ALL_FEATURES)
    monitor = find(everything, "ServiceMonitor", "inferix")
    metrics = find(everything, "Service", "-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    ingress = find(everything, "Ingress", "-viewer")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "inferix-streamer", "port": {"name": "http"}}
    # External Redis from a Secret: no Redis StatefulSet, the URL from the Secret.
    assert not [m for m in everything if m["metadata"]["name"].endswith("-redis")]
    (kvcache,) = containers(find(everything, "Deployment", "-kvcache"))
    url = next(e for e in kvcache["env"] if e["name"] == "INFERIX_REDIS_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "redis-credentials", "key": "url"}
    # OpenTelemetry on every service.
    for name, container in _inferix_containers(everything):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317", name


def test_disruption_budgets_and_redis_persistence(render: Render) -> None:
    manifests = render()
    budgets = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "PodDisruptionBudget"}
    workloads = [
        m for m in manifests if m["kind"] in ("Deployment", "StatefulSet") and "redis" not in m["metadata"]["name"]
    ]
    for workload in workloads:
        budget = budgets[workload["metadata"]["name"]]
        assert budget["spec"]["selector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
    redis = find(manifests, "StatefulSet", "-redis")
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    (container,) = containers(redis)
    assert (
        "--appendonly" in container["args"] and container["args"][container["args"].index("--appendonly") + 1] == "yes"
    )


def test_a_rolling_update_never_runs_two_schedulers(render: Render) -> None:
    """The old scheduler hands its sessions over on SIGTERM and the new one resumes them from Redis:
    they must not overlap (both would drive the same sessions)."""
    scheduler = find(render(ALL_FEATURES), "Deployment", "-scheduler")
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}
    assert scheduler["spec"]["replicas"] == 1
    (container,) = containers(scheduler)
    assert any(e["name"] == "INFERIX_REDIS_URL" for e in container["env"])  # sessions outlive the pod


# ---- TLS on the scheduler's client port ------------------------------------------------------------

TLS_POD = "ci/tls-pod-values.yaml"
TLS_INGRESS = "ci/tls-ingress-values.yaml"


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _parse(module: str, argv: list[str]) -> dict[str, Any]:
    """The module's own parser on `argv` (tests/deploy/parse_cli.py)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.deploy.parse_cli"],
        input=json.dumps([{"module": module, "argv": argv, "env": {}}]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (parsed,) = json.loads(result.stdout)
    assert parsed["ok"], parsed["error"]
    return dict(parsed["args"])


def test_tls_in_the_pod(render: Render) -> None:
    """mode pod: the scheduler serves TLS from the mounted Secret; the streamer and the kubelet's probes use
    its plaintext internal port, behind a ClusterIP Service the LoadBalancer never exposes."""
    manifests = render(TLS_POD)
    deployment = find(manifests, "Deployment", "-scheduler")
    (scheduler,) = containers(deployment)
    module, argv = _entry_point(scheduler)
    args = _parse(module, argv)
    assert (args["tls_cert"], args["tls_key"]) == ("/etc/inferix/tls/tls.crt", "/etc/inferix/tls/tls.key")
    assert (args["internal_host"], args["internal_port"]) == ("0.0.0.0", "50055")
    # The whole Secret is mounted (no subPath), so the kubelet updates the files when the Secret changes.
    (mount,) = [m for m in scheduler["volumeMounts"] if m["name"] == "tls"]
    assert mount == {"name": "tls", "mountPath": "/etc/inferix/tls", "readOnly": True}
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "inferix-scheduler-tls"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert scheduler[probe]["grpc"]["port"] == 50055, probe  # Kubernetes' gRPC probes speak plaintext
    public = find(manifests, "Service", "-scheduler")
    assert public["spec"]["type"] == "LoadBalancer" and [p["port"] for p in public["spec"]["ports"]] == [50051]
    internal = find(manifests, "Service", "-scheduler-internal")
    assert internal["spec"]["type"] == "ClusterIP" and [p["port"] for p in internal["spec"]["ports"]] == [50055]
    (streamer,) = containers(find(manifests, "Deployment", "-streamer"))
    assert _env(streamer)["INFERIX_SCHEDULER_ADDRESS"] == "inferix-scheduler-internal:50055"
    assert _env(scheduler)["INFERIX_SCHEDULER_ADVERTISE_ADDRESS"] == "inferix-scheduler-internal:50055"
    policy = find(manifests, "NetworkPolicy", "-scheduler")
    assert _allowed(policy, 50051) == ["*"]  # clients, over TLS
    assert _components(_allowed(policy, 50055)) == {"streamer"}  # the plaintext port: the streamer only
    assert not [m for m in manifests if m["kind"] == "Ingress"]


def test_tls_at_the_ingress(render: Render) -> None:
    """mode ingress: the Ingress terminates TLS and speaks gRPC to the scheduler, which serves plaintext."""
    manifests = render(TLS_INGRESS)
    ingress = find(manifests, "Ingress", "-scheduler")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert annotations["cert-manager.io/cluster-issuer"] == "letsencrypt"  # the user's, added to the defaults
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["api.inferix.example.com"], "secretName": "inferix-api-tls"}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "api.inferix.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "inferix-scheduler", "port": {"name": "grpc"}}
    (scheduler,) = containers(find(manifests, "Deployment", "-scheduler"))
    assert flag(scheduler, "tls-cert") is None and flag(scheduler, "internal-port") is None
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-scheduler-internal")]
    # Off by default: no TLS flags, no scheduler Ingress.
    (plain,) = containers(find(render(), "Deployment", "-scheduler"))
    assert flag(plain, "tls-cert") is None
    assert not [m for m in render() if m["kind"] == "Ingress"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("scheduler: {tls: {mode: pod}}", "/scheduler/tls"),
        ("scheduler: {tls: {mode: ingress, secretName: api-tls}}", "/scheduler/tls/ingress"),
        ("scheduler: {tls: {mode: tls}}", "/scheduler/tls/mode"),
    ],
)
def test_tls_values_are_checked(tmp_path: Path, values: str, message: str) -> None:
    broken = tmp_path / "tls.yaml"
    broken.write_text(values)
    lint = check_helm.lint([broken])
    assert lint.returncode != 0 and message in lint.stdout + lint.stderr, lint.stdout + lint.stderr


TLS_VIEWER = "ci/tls-viewer-values.yaml"


def _parse_env(module: str, argv: list[str], env: dict[str, str | None]) -> dict[str, Any]:
    """The module's own parser on `argv` with the container's `env` (tests/deploy/parse_cli.py)."""
    case = {"module": module, "argv": argv, "env": {k: v for k, v in env.items() if v is not None}}
    result = subprocess.run(
        [sys.executable, "-m", "tests.deploy.parse_cli"],
        input=json.dumps([case]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (parsed,) = json.loads(result.stdout)
    assert parsed["ok"], parsed["error"]
    return dict(parsed["args"])


def test_viewer_https_from_a_secret_and_its_limits(render: Render) -> None:
    """streamer.viewer.tls: the streamer serves its HTTP port over HTTPS from the whole mounted Secret (rotated
    in place by the kubelet), the Ingress speaks HTTPS to it, viewer links are https://; gRPC stays plaintext."""
    manifests = render(TLS_VIEWER)
    deployment = find(manifests, "Deployment", "-streamer")
    (streamer,) = containers(deployment)
    module, argv = _entry_point(streamer)
    args = _parse_env(module, argv, _env(streamer))
    assert (args["http_tls_cert"], args["http_tls_key"]) == ("/etc/inferix/tls/tls.crt", "/etc/inferix/tls/tls.key")
    limits = (args["max_body_bytes"], args["body_timeout_s"], args["commands_per_s"], args["offers_per_s"])
    assert limits == ("32768", "5.0", "20.0", "1.0") and args["max_viewers"] == "4"  # parse_cli: as strings
    assert "tls_cert" not in args  # the gRPC port's TLS flags are the scheduler's only
    (mount,) = [m for m in streamer["volumeMounts"] if m["name"] == "tls"]
    assert mount == {"name": "tls", "mountPath": "/etc/inferix/tls", "readOnly": True}
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "inferix-viewer-tls"
    ports = {p["name"]: p["appProtocol"] for p in find(manifests, "Service", "-streamer")["spec"]["ports"]}
    assert ports == {"grpc": "grpc", "http": "https"}
    ingress = find(manifests, "Ingress", "-viewer")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    (scheduler,) = containers(find(manifests, "Deployment", "-scheduler"))
    assert _env(scheduler)["INFERIX_VIEWER_PAGE_URL"] == "https://watch.inferix.example.com"

    # Off by default: plain HTTP, the default limits.
    (plain,) = containers(find(render(), "Deployment", "-streamer"))
    default = _parse_env(*_entry_point(plain), _env(plain))
    assert default["http_tls_cert"] is None and "tls" not in {m["name"] for m in plain["volumeMounts"]}
    assert (default["max_body_bytes"], default["max_viewers"]) == ("65536", "16")


MESH_TLS = "ci/mesh-tls-values.yaml"
MESH_TLS_CERT_MANAGER = "ci/mesh-tls-cert-manager-values.yaml"
MESH_TLS_FILES = ("/etc/inferix/mesh-tls/ca.crt", "/etc/inferix/mesh-tls/tls.crt", "/etc/inferix/mesh-tls/tls.key")


def _mesh_tls_pods(manifests: list[Manifest]) -> dict[str, tuple[Manifest, dict[str, Any]]]:
    """{component: (workload, its service container)} of the four services."""
    pods = {}
    for component, kind in (("scheduler", "Deployment"), ("kvcache", "Deployment"), ("streamer", "Deployment")):
        workload = find(manifests, kind, f"-{component}")
        (pods[component],) = [(workload, c) for c in containers(workload)]
    worker = find(manifests, "StatefulSet", "-worker")
    pods["worker"] = (worker, containers(worker)[0])
    return pods


def test_mesh_tls_gives_each_service_its_secret(render: Render) -> None:
    """meshTls: each service mounts its own Secret whole (renewals reach the files) and its own parser reads
    the mesh TLS files and the health port from its environment; the kubelet probes the plaintext health
    port; the scheduler's internal port (mutual TLS) takes the streamer's calls and nothing else."""
    manifests = render(MESH_TLS)
    for component, (workload, container) in _mesh_tls_pods(manifests).items():
        module, argv = _entry_point(container)
        args = _parse_env(module, argv, _env(container))
        assert (args["mesh_tls_ca"], args["mesh_tls_cert"], args["mesh_tls_key"]) == MESH_TLS_FILES, component
        assert args["health_port"] == "50056", component
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "mesh-tls"]
        assert mount == {"name": "mesh-tls", "mountPath": "/etc/inferix/mesh-tls", "readOnly": True}
        (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == "mesh-tls"]
        assert volume["secret"]["secretName"] == f"inferix-mesh-{component}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == 50056, (component, probe)
        if component == "scheduler":
            assert (args["tls_cert"], args["internal_port"]) == ("/etc/inferix/tls/tls.crt", "50055")
    (streamer,) = containers(find(manifests, "Deployment", "-streamer"))
    assert _env(streamer)["INFERIX_SCHEDULER_ADDRESS"] == "inferix-scheduler-internal:50055"
    assert _components(_allowed(find(manifests, "NetworkPolicy", "-scheduler"), 50055)) == {"streamer"}
    # Off by default: no mesh TLS file, volume or health port anywhere.
    for component, (workload, container) in _mesh_tls_pods(render()).items():
        assert not any(name.startswith("INFERIX_MESH_TLS") for name in _env(container)), component
        assert "mesh-tls" not in dump(workload) and container["readinessProbe"]["grpc"]["port"] != 50056


def test_mesh_tls_certificates_from_cert_manager(render: Render) -> None:
    """meshTls.certManager: one Certificate per service, into the Secret the service mounts, for the names its
    callers dial, usable to serve and to call; the scheduler gets an internal port even without TLS."""
    manifests = render(MESH_TLS_CERT_MANAGER)
    certificates = {m["metadata"]["name"]: m["spec"] for m in manifests if m["kind"] == "Certificate"}
    pods = _mesh_tls_pods(manifests)
    assert sorted(certificates) == sorted(f"inferix-{component}-mesh-tls" for component in pods)
    for component, (workload, _) in pods.items():
        spec = certificates[f"inferix-{component}-mesh-tls"]
        (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == "mesh-tls"]
        assert spec["secretName"] == volume["secret"]["secretName"]
        assert {"server auth", "client auth"} <= set(spec["usages"])
        assert spec["issuerRef"] == {"name": "inferix-mesh-ca", "kind": "Issuer", "group": "cert-manager.io"}
    scheduler, worker, streamer = (pods[name][1] for name in ("scheduler", "worker", "streamer"))
    dialed = {
        "kvcache": flag(scheduler, "kvcache"),
        "streamer": flag(scheduler, "streamer"),
        "scheduler": _env(streamer)["INFERIX_SCHEDULER_ADDRESS"],
    }
    for component, address in dialed.items():
        assert (
            address is not None
            and address.rpartition(":")[0] in certificates[f"inferix-{component}-mesh-tls"]["dnsNames"]
        ), component
    advertised = _substitute(flag(worker, "advertise-address") or "", {}).rpartition(":")[0]
    (wildcard,) = certificates["inferix-worker-mesh-tls"]["dnsNames"]
    assert wildcard.startswith("*.") and advertised.partition(".")[2] == wildcard[2:]
    assert flag(scheduler, "internal-port") == "50055" and flag(scheduler, "tls-cert") is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("meshTls: {enabled: true, certManager: {enabled: true}}", "meshTls.certManager.issuerRef.name"),
        ("meshTls: {enabled: true}\nstreamer: {publicAddress: 'rec.example.com:50054'}", "streamer.publicAddress"),
        ("meshTls: {enabled: true, healthPort: 0}", "/meshTls/healthPort"),
    ],
)
def test_mesh_tls_values_are_checked(tmp_path: Path, values: str, message: str) -> None:
    broken = tmp_path / "mesh-tls.yaml"
    broken.write_text(values)
    rendered = check_helm.template([broken])  # `helm lint` logs a template's fail() without failing
    assert rendered.returncode != 0 and message in rendered.stderr, rendered.stderr


# ---- autoscaling, dashboards and alerts -----------------------------------------------------------

OPS_HPA = "ci/ops-hpa-values.yaml"
OPS_KEDA = "ci/ops-keda-values.yaml"
# Alert -> its runbook section in docs/operations.md.
RUNBOOKS = {
    "InferixWorkerBelowRealtime": "#worker-below-real-time",
    "InferixQueueWaiting": "#sessions-waiting-in-the-queue",
    "InferixRecoveryFailures": "#recovery-failures",
    "InferixRtmpPushFailing": "#rtmp-push-failing",
    "InferixKvPoolNearFull": "#kv-pool-near-full",
}


def test_monitoring_and_autoscaling_are_off_by_default(render: Render) -> None:
    manifests = render()
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"HorizontalPodAutoscaler", "ScaledObject", "PrometheusRule"}
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-dashboard")]
    assert find(manifests, "StatefulSet", "-worker")["spec"]["replicas"] == 1


@pytest.mark.parametrize(("values", "kind"), [(OPS_HPA, "HorizontalPodAutoscaler"), (OPS_KEDA, "ScaledObject")])
def test_worker_autoscaling_scales_in_slowly(render: Render, values: str, kind: str) -> None:
    manifests = render(values)
    worker = find(manifests, "StatefulSet", "-worker")
    assert "replicas" not in worker["spec"]  # the autoscaler's, or each helm upgrade would reset it
    scaler = find(manifests, kind, "-worker")
    target = scaler["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "StatefulSet", "inferix-worker")
    if kind == "HorizontalPodAutoscaler":
        spec = scaler["spec"]
        bounds, behavior = (spec["minReplicas"], spec["maxReplicas"]), spec["behavior"]
        assert bounds == (2, 8)
        assert spec["metrics"][0]["external"]["target"] == {"type": "AverageValue", "averageValue": "0.75"}
    else:
        spec = scaler["spec"]
        bounds = (spec["minReplicaCount"], spec["maxReplicaCount"])
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert bounds == (1, 16)
        [trigger] = spec["triggers"]
        assert trigger["metadata"]["serverAddress"] == "http://prometheus.monitoring.svc:9090"
        assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "0.8")
    # Scale-in: only after the stabilization window, one pod per period (each drains its streams first).
    down = behavior["scaleDown"]
    assert down["stabilizationWindowSeconds"] == (600 if kind == "HorizontalPodAutoscaler" else 900)
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    assert down["selectPolicy"] == "Min"


def test_alerts_link_their_runbooks(render: Render) -> None:
    for values, base in [
        (OPS_HPA, "https://git.example.com/inferix/blob/main/docs/operations.md"),
        (OPS_KEDA, "docs/operations.md"),
    ]:
        rule = find(render(values), "PrometheusRule", "inferix")
        alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
        assert alerts.keys() == RUNBOOKS.keys()
        for name, alert in alerts.items():
            assert alert["annotations"]["runbook_url"] == base + RUNBOOKS[name]
            assert alert["annotations"]["summary"] and alert["annotations"]["description"], name
            assert alert["labels"]["severity"] in ("warning", "critical"), name
    assert alerts["InferixWorkerBelowRealtime"]["for"] == "2m"
    assert "> 60" in alerts["InferixQueueWaiting"]["expr"]
    hpa_rule = find(render(OPS_HPA), "PrometheusRule", "inferix")
    assert hpa_rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == "monitoring"  # ci/ops-keda-values.yaml's choice
    # Each release's alerts select its own series: the ServiceMonitor's labels, or metricLabels.
    assert 'namespace="inferix",service="inferix-metrics"' in hpa_rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert 'cluster="gpu-east",job="inferix-metrics"' in alerts["InferixKvPoolNearFull"]["expr"]


def test_dashboard_configmap_for_the_grafana_sidecar(render: Render) -> None:
    dashboard = find(render(OPS_HPA), "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Inferix"}
    assert dashboard["data"]["inferix.json"] == (CHART / "dashboards" / "inferix.json").read_text().rstrip("\n")
    panels = {p["title"] for p in json.loads(dashboard["data"]["inferix.json"])["panels"]}
    assert {
        "Sessions by state",
        "Block latency vs the real-time budget",
        "Real-time factor per worker",
        "KV pages",
        "Admission rejections",
        "Recoveries",
        "Streamer viewers and RTMP",
        "Encode time per frame",
    } <= panels
    elsewhere = find(render(OPS_KEDA), "ConfigMap", "-dashboard")["metadata"]
    assert (elsewhere["namespace"], elsewhere["labels"]["grafana_dashboard"]) == ("monitoring", "inferix")


def test_autoscaling_bounds_are_checked(tmp_path: Path) -> None:
    broken = tmp_path / "bounds.yaml"
    broken.write_text("worker:\n  autoscaling:\n    enabled: true\n    minReplicas: 5\n    maxReplicas: 2\n")
    rendered = check_helm.template([broken])
    assert rendered.returncode != 0 and "minReplicas (5) is above maxReplicas (2)" in rendered.stderr, rendered.stderr


def test_worker_decoder_is_passed_to_every_worker(render: Render) -> None:
    # Default: no --decoder, the model folder decides (its VAE unless model.yaml says 'decoder:').
    assert flag(worker_container(render()), "decoder") is None
    container = worker_container(render(set=["worker.decoder=taehv:/models/taew2_1.pth"]))
    assert flag(container, "decoder") == "taehv:/models/taew2_1.pth"
