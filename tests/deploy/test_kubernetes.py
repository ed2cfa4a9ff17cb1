"""The Kubernetes manifests (``deploy/kubernetes``): rendered with ``kubectl kustomize`` and every
object checked offline against the Kubernetes 1.32 API schemas (``kubernetes-validate``, strict:
an unknown or misspelt field fails), then the properties the deployment relies on: gateways
replicated, probed and confined; nodes given what the Docker backend needs from their machine;
only gateways reaching the nodes' port; settings that exist; secrets passed by reference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from common.settings import ENV_PREFIX, FLAT_NAMES, Settings
from tests.conftest import REPO

KUSTOMIZATION = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.32.0"
GATEWAY_PORT = 8000
NODE_PORT = 7070

# ../shared/CONTRACT.md, "Many machines": settings of gateways and nodes that common/settings.py
# may not have yet (once it does, the Settings check below covers them too).
CONTRACT_NAMES = {
    "REPLGATE_DATABASE_URL", "REPLGATE_BUNDLE_STORE", "REPLGATE_TLS_CA", "REPLGATE_TLS_CERT",
    "REPLGATE_TLS_KEY", "REPLGATE_ADMIN_KEYS", "REPLGATE_NODE_TIMEOUT_S",
}
# "the usual AWS_* variables and AWS_ENDPOINT_URL" of the bundle store: the AWS SDKs' names.
AWS_NAMES = {
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
}
# Values that must come from a Secret, never written into a manifest.
SECRET_SETTINGS = {
    "REPLGATE_DATABASE_URL", "REPLGATE_API_KEYS", "REPLGATE_ADMIN_KEYS",
    "REPLGATE_APPROVER_KEYS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "REPLGATE_BUNDLE_KEY",
}


def _settings_names(model: type[BaseModel], prefix: str) -> set[str]:
    """Every environment name a settings model reads: each field, nested ones joined by ``__``."""
    names = set()
    for field_name, field in model.model_fields.items():
        name = f"{prefix}{field_name.upper()}"
        names.add(name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= _settings_names(annotation, f"{name}__")
    return names


SETTINGS_NAMES = (_settings_names(Settings, ENV_PREFIX)
                  | {ENV_PREFIX + flat.upper() for flat in FLAT_NAMES})


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed, and it renders deploy/kubernetes (kustomize): "
                    "install kubectl 1.27 or newer, e.g. the binary from "
                    "https://kubernetes.io/docs/tasks/tools/install-kubectl-linux/ into "
                    "/usr/local/bin (Debian's kubernetes-client package is too old)")
    done = subprocess.run([kubectl, "kustomize", str(KUSTOMIZATION)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize failed: {done.stderr}"
    return [item for item in yaml.safe_load_all(done.stdout) if item]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [item for item in objects
                if item["kind"] == kind and item["metadata"]["name"] == name]
    return found


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in objects if item["kind"] in ("Deployment", "DaemonSet")]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector beyond matchLabels: {selector}"
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def gateway_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = one(objects, "Deployment", "replgate-gateway")["spec"]["template"]
    return template


def node_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = one(objects, "DaemonSet", "replgate-node")["spec"]["template"]
    return template


def test_every_object_is_valid_for_kubernetes_1_32(objects: list[dict[str, Any]]) -> None:
    kinds = {(item["kind"], item["metadata"]["name"]) for item in objects}
    assert {("Deployment", "replgate-gateway"), ("Service", "replgate-gateway"),
            ("DaemonSet", "replgate-node"), ("PodDisruptionBudget", "replgate-gateway"),
            ("NetworkPolicy", "replgate-node"), ("ServiceAccount", "replgate-gateway"),
            ("ServiceAccount", "replgate-node")} <= kinds
    assert any(kind == "ConfigMap" for kind, _ in kinds)
    assert any(kind == "Secret" for kind, _ in kinds)
    for item in objects:
        try:
            kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{item['kind']} {item['metadata']['name']}: {exc.message} at "
                        f"{'.'.join(map(str, exc.path))}")


def test_images_are_set_by_the_kustomization(objects: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((KUSTOMIZATION / "kustomization.yaml").read_text())
    (entry,) = kustomization["images"]
    wanted = f"{entry['newName']}:{entry['newTag']}"
    for workload in workloads(objects):
        for container in containers(workload["spec"]["template"]["spec"]):
            assert container["image"] == wanted, (
                f"{workload['metadata']['name']}/{container['name']} runs "
                f"{container['image']!r}, not the kustomization's {entry['name']!r} image")


def test_every_container_has_resources(objects: list[dict[str, Any]]) -> None:
    for workload in workloads(objects):
        for container in containers(workload["spec"]["template"]["spec"]):
            resources = container.get("resources", {})
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where


def test_gateways_are_replicated_probed_and_confined(objects: list[dict[str, Any]]) -> None:
    deployment = one(objects, "Deployment", "replgate-gateway")
    assert deployment["spec"]["replicas"] >= 2
    pod = gateway_pod(objects)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["args"][:3] == ["serve", "--host", "0.0.0.0"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert ports.get(get["port"], get["port"]) == GATEWAY_PORT, probe

    pod_context, context = spec.get("securityContext", {}), container["securityContext"]
    assert pod_context.get("runAsNonRoot") is True
    assert pod_context.get("runAsUser", 0) != 0
    seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "hostPath" not in json.dumps(spec["volumes"])

    service = one(objects, "Service", "replgate-gateway")
    assert matches({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert not matches({"matchLabels": service["spec"]["selector"]},
                       node_pod(objects)["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert ports.get(port["targetPort"], port["targetPort"]) == GATEWAY_PORT

    budget = one(objects, "PodDisruptionBudget", "replgate-gateway")
    assert matches(budget["spec"]["selector"], pod["metadata"]["labels"])
    assert not matches(budget["spec"]["selector"], node_pod(objects)["metadata"]["labels"])
    assert 1 <= budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_nodes_get_what_the_docker_backend_needs(objects: list[dict[str, Any]]) -> None:
    spec = node_pod(objects)["spec"]
    assert spec["nodeSelector"] == {"replgate.dev/node": "true"}
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork"), "a hostNetwork pod escapes the NetworkPolicy"
    (container,) = spec["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert container["args"] == ["node", "--advertise", f"$(POD_IP):{NODE_PORT}"]
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert [port["containerPort"] for port in container["ports"]] == [NODE_PORT]
    assert container["securityContext"]["privileged"] is True

    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}

    def host_path(mount_path: str) -> str:
        return str(volumes[mounts[mount_path]["name"]]["hostPath"]["path"])

    assert host_path("/var/run/docker.sock") == "/var/run/docker.sock"
    assert volumes[mounts["/var/run/docker.sock"]["name"]]["hostPath"]["type"] == "Socket"
    # The engine bind-mounts the host's paths that the node names: they must be the same.
    state_dir = env["REPLGATE_STATE_DIR"]["value"]
    assert host_path(state_dir) == state_dir
    assert mounts[state_dir]["mountPropagation"] == "Bidirectional"

    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    script = next(arg for arg in drain if arg.endswith("node-drain.py"))
    script_mount = mounts[os.path.dirname(script)]
    configmap = one(objects, "ConfigMap", volumes[script_mount["name"]]["configMap"]["name"])
    assert os.path.basename(script) in configmap["data"]
    assert str(NODE_PORT) in drain
    assert spec["terminationGracePeriodSeconds"] > int(drain[-1])


def test_only_privileged_containers_propagate_mounts_to_the_host(
        objects: list[dict[str, Any]]) -> None:
    """The API server refuses Bidirectional mounts elsewhere, which the schemas do not say."""
    for workload in workloads(objects):
        for container in containers(workload["spec"]["template"]["spec"]):
            context = container.get("securityContext", {})
            for mount in container.get("volumeMounts", []):
                if mount.get("mountPropagation") == "Bidirectional":
                    assert context.get("privileged") is True, container["name"]
            if context.get("privileged"):
                assert context.get("allowPrivilegeEscalation", True) is True, container["name"]


def test_only_gateways_reach_the_nodes_port(objects: list[dict[str, Any]]) -> None:
    policy = one(objects, "NetworkPolicy", "replgate-node")["spec"]
    nodes, gateways = node_pod(objects)["metadata"]["labels"], gateway_pod(objects)["metadata"][
        "labels"]
    assert matches(policy["podSelector"], nodes)
    assert not matches(policy["podSelector"], gateways)
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "admits pods beyond the gateways' (namespace, ipBlock)"
    assert matches(peer["podSelector"], gateways)
    assert not matches(peer["podSelector"], nodes)
    assert rule["ports"] == [{"protocol": "TCP", "port": NODE_PORT}]


def test_no_pod_gets_a_service_account_token(objects: list[dict[str, Any]]) -> None:
    for workload in workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        account = one(objects, "ServiceAccount", spec["serviceAccountName"])
        assert account["automountServiceAccountToken"] is False


def test_every_variable_is_a_setting(objects: list[dict[str, Any]]) -> None:
    """A setting renamed or removed in common/settings.py (or the contract) fails here."""
    allowed = SETTINGS_NAMES | CONTRACT_NAMES | AWS_NAMES
    for workload in workloads(objects):
        for container in containers(workload["spec"]["template"]["spec"]):
            where = f"{workload['metadata']['name']}/{container['name']}"
            names: set[str] = set()
            for source in container.get("envFrom", []):
                assert set(source) == {"configMapRef"}, f"{where}: {source}"
                names |= set(one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
            for item in container.get("env", []):
                if "fieldRef" in item.get("valueFrom", {}):
                    # The downward API's values exist for the arguments to use.
                    assert f"$({item['name']})" in " ".join(container.get("args", [])), where
                else:
                    names.add(item["name"])
            assert names <= allowed, f"{where} sets what no setting reads: {names - allowed}"


def test_secrets_are_referenced_not_written(objects: list[dict[str, Any]]) -> None:
    secrets = {item["metadata"]["name"]: item for item in objects if item["kind"] == "Secret"}
    secret_values = [value for secret in secrets.values()
                     for value in secret.get("stringData", {}).values()]
    for configmap in (item for item in objects if item["kind"] == "ConfigMap"):
        assert not set(configmap["data"]) & SECRET_SETTINGS, configmap["metadata"]["name"]
    for workload in workloads(objects):
        assert not any(value in json.dumps(workload) for value in secret_values), (
            f"{workload['metadata']['name']} holds a Secret's value")
        for container in containers(workload["spec"]["template"]["spec"]):
            for item in container.get("env", []):
                if item["name"] in SECRET_SETTINGS:
                    assert "value" not in item, f"{item['name']} written in {container['name']}"
                reference = item.get("valueFrom", {}).get("secretKeyRef")
                if reference and not reference.get("optional"):
                    assert reference["key"] in secrets[reference["name"]]["stringData"]
        for volume in workload["spec"]["template"]["spec"]["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets


class _Gateway(BaseHTTPRequestHandler):
    """A gateway's node endpoints as the contract states them, for the drain script."""

    nodes: list[dict[str, Any]]
    calls: list[tuple[str, str, str | None]]

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.calls.append(("GET", self.path, self.headers.get("Authorization")))
        assert self.path == "/v1/nodes"
        self._answer(200, self.nodes)
        for node in self.nodes:  # each look pauses one more session of a draining node
            if node["state"] == "draining" and node["sessions"]:
                node["sessions"] -= 1

    def do_POST(self) -> None:
        self.calls.append(("POST", self.path, self.headers.get("Authorization")))
        node = next(n for n in self.nodes if self.path == f"/v1/nodes/{n['id']}/drain")
        node["state"] = "draining"
        self._answer(202, node)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, type[_Gateway]]]:
    handler = type("Handler", (_Gateway,), {"calls": [], "nodes": [
        {"id": "n-other", "address": "10.0.0.8:7070", "state": "up", "sessions": 3},
        {"id": "n-this", "address": "10.0.0.9:7070", "state": "up", "sessions": 2}]})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_pre_stop_drains_this_node_and_waits(gateway: tuple[str, type[_Gateway]]) -> None:
    url, handler = gateway
    done = subprocess.run(
        [sys.executable, str(KUSTOMIZATION / "node-drain.py"), url, str(NODE_PORT), "30"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "POD_IP": "10.0.0.9",
             "REPLGATE_ADMIN_KEYS": "admin-1, admin-2"})
    assert done.returncode == 0, done.stderr
    assert "drained" in done.stderr
    assert ("POST", "/v1/nodes/n-this/drain", "Bearer admin-1") in handler.calls
    assert not any(path.startswith("/v1/nodes/n-other") for _, path, _ in handler.calls)
    this, other = handler.nodes[1], handler.nodes[0]
    assert this["sessions"] == 0, "returned before the node was empty"
    assert other == {"id": "n-other", "address": "10.0.0.8:7070", "state": "up", "sessions": 3}


def test_pre_stop_fails_when_the_node_does_not_empty(
        gateway: tuple[str, type[_Gateway]]) -> None:
    url, handler = gateway
    handler.nodes[1]["sessions"] = 10_000
    done = subprocess.run(
        [sys.executable, str(KUSTOMIZATION / "node-drain.py"), url, str(NODE_PORT), "1"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "POD_IP": "10.0.0.9", "REPLGATE_ADMIN_KEYS": "k"})
    assert done.returncode == 1
    assert "still holds" in done.stderr
