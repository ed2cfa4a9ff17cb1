"""Container posture, read back from the engine: the CIS Docker Benchmark's runtime items (5.x)
that apply to a sandbox, for every container a gateway runs, warm or in use.

The configuration is what ``docker inspect`` says, not what replgate meant to ask for; the
kernel process's own view (capabilities, seccomp, no-new-privileges) is read from the host's
``/proc``. Items that do not apply: 5.6 sshd (none), 5.8 privileged ports and 5.13 host
interfaces (no network at all), 5.27 image updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.conftest import TEST_RUNTIME, GatewayProcess, containers_of, inspected
from tests.security.conftest import Hostile

ENGINE_RUNTIME = {"runc": "runc", "gvisor": "runsc"}[TEST_RUNTIME]
"""The OCI runtime every sandbox of this run must be running under, read back from the engine."""
CAP_NET_ADMIN, CAP_SYS_MODULE, CAP_SYS_ADMIN = 12, 16, 21
SENSITIVE = ("/", "/boot", "/dev", "/etc", "/lib", "/proc", "/sys", "/usr", "/var/run",
             "/run", "/var/lib/docker", "/root", "/home")


def _containers(client: docker.DockerClient, owner: str) -> list[dict[str, Any]]:
    """The gateway's running sandboxes. A stopped one runs no code: a paused session's (its
    container is removed in the background after the pause) or a deleted one's on its way out,
    which may also be gone by the time it is inspected."""
    found = inspected(client, containers_of(client, owner))
    running = [config for config in found if config["State"]["Running"]]
    assert running, f"no running container of {owner}"
    return running


def _check(config: dict[str, Any], gateway: GatewayProcess, memory: int) -> None:
    host, settings, state = config["HostConfig"], config["Config"], config["State"]
    name = config["Name"]
    assert state["Running"], name
    # 5.3 capabilities: all dropped, none added. 5.4 not privileged.
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], name
    assert host["Privileged"] is False, name
    # 5.5 no sensitive host folder; only the session's workspace and its socket folder (and,
    # read-only, the gateway's /etc/hosts and, under runc, its own boot id and CRIU's cache of
    # the kernel's features, root's alone: docs/security.md).
    binds = sorted((m["Destination"], m["Source"], m["Type"], m["RW"]) for m in config["Mounts"])
    own_boot_id = ([] if host["Runtime"] == "runsc"
                   else ["/run/criu.kdat", "/run/replgate/boot_id"])
    assert [b[0] for b in binds] == ["/etc/hosts", "/home/user", "/kernel", *own_boot_id], binds
    assert all(not rw for destination, _, _, rw in binds
               if destination in ("/etc/hosts", *own_boot_id))
    for _destination, source, kind, _rw in binds:
        assert kind == "bind" and source.startswith(str(gateway.state_dir) + "/"), source
        assert source not in SENSITIVE and "docker.sock" not in source
    assert not host.get("Binds") and not host.get("VolumesFrom") and not host.get("Devices")
    # 5.9, 5.15-5.17, 5.20, 5.30, 5.31: no host namespace, no network, no Docker socket.
    assert host["NetworkMode"] == "none"
    # ... and no network sandbox of the engine's either (_containers.HOSTS says why).
    assert settings["NetworkDisabled"] is True
    assert not config["NetworkSettings"]["SandboxKey"] and not config["ResolvConfPath"]
    assert host["PidMode"] in ("", "private") and host["IpcMode"] in ("private", "none")
    assert host["UTSMode"] in ("", "private") and host["UsernsMode"] in ("", "private")
    assert not host.get("PortBindings") and not host.get("PublishAllPorts")
    assert not host.get("ExtraHosts") and not host.get("Links")
    # 5.10, 5.28: memory (no swap on top), CPU and process limits.
    assert host["Memory"] == memory and host["MemorySwap"] == memory, name
    assert host["MemorySwappiness"] in (0, None)
    assert host["NanoCpus"] > 0 or host["CpuQuota"] > 0
    assert 0 < host["CpuShares"] < 1024  # 5.11: a CPU priority set, below the default
    assert host["PidsLimit"] and 0 < host["PidsLimit"] <= 4096
    assert host["OomKillDisable"] in (False, None)
    # 5.12 read-only root; writable places are size-capped tmpfs (with nosuid, nodev).
    assert host["ReadonlyRootfs"] is True
    for path, options in (host.get("Tmpfs") or {}).items():
        assert "size=" in options and "nosuid" in options and "nodev" in options, (path, options)
    assert host["ShmSize"] <= 256 * 2**20
    # 5.21, 5.25, 5.1/5.2: no new privileges, default seccomp, AppArmor not unconfined.
    options = host.get("SecurityOpt") or []
    assert "no-new-privileges" in options or "no-new-privileges:true" in options
    assert not [o for o in options if "unconfined" in o or o.startswith("seccomp=")], options
    assert config.get("AppArmorProfile") != "unconfined"
    # 5.14 no restart policy that brings a container back by itself.
    assert host["RestartPolicy"]["Name"] in ("", "no")
    # 4.1 / 5.x: a non-root user; 5.18 ulimits: open files capped, no core dumps.
    assert settings["User"] not in ("", "0", "root") and not settings["User"].startswith("0:")
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host.get("Ulimits") or []}
    assert ulimits["core"] == (0, 0) and 0 < ulimits["nofile"][1] <= 65536
    # 5.22/5.23 no privileged exec configured, 5.26 no healthcheck needed; labels name it.
    assert settings["Labels"]["io.replgate.owner"] == gateway.owner
    # The isolation asked for, as the engine runs it.
    assert host["Runtime"] == ENGINE_RUNTIME, (name, host["Runtime"])
    status = Path(f"/proc/{state['Pid']}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    if host["Runtime"] == "runsc":
        # The host process is gVisor's kernel (the sentry): seccomp-confined, in a user
        # namespace and mount, IPC, UTS and network namespaces of its own (its capabilities
        # are that user namespace's), none of the ones that would matter even there. The
        # sandboxed processes are its tasks, numbered by it, not host processes.
        effective = int(fields["CapEff"], 16)
        assert not effective & (1 << CAP_SYS_ADMIN | 1 << CAP_NET_ADMIN | 1 << CAP_SYS_MODULE)
        for namespace in ("user", "mnt", "ipc", "uts", "net"):
            assert (Path(f"/proc/{state['Pid']}/ns/{namespace}").readlink()
                    != Path(f"/proc/self/ns/{namespace}").readlink()), namespace
        return
    # The kernel side, from the host's /proc: nothing to raise, seccomp in filter mode.
    assert fields["CapEff"].strip() == fields["CapPrm"].strip() == "0000000000000000"
    assert fields["CapBnd"].strip() == "0000000000000000"
    assert fields["Uid"].split()[0] != "0"


def test_posture_of_every_sandbox_of_the_hostile_gateway(hostile: Hostile) -> None:
    sid = hostile.new_session()
    try:
        hostile.ok(sid, "print('in use')")
        containers = _containers(hostile.docker, hostile.gateway.owner)
        assert len(containers) >= 2  # one in use and the warm ones
        for config in containers:
            _check(config, hostile.gateway, 512 * 2**20)
            if config["HostConfig"]["Runtime"] == "runsc":
                ulimits = {u["Name"]: u["Hard"] for u in config["HostConfig"]["Ulimits"]}
                assert ulimits["nproc"] == 128  # gVisor's own count; the host's is the sentry's
                assert config["HostConfig"]["PidsLimit"] == 2 * 128 + 128
            else:
                assert config["HostConfig"]["PidsLimit"] == 128
            assert config["HostConfig"]["Tmpfs"]["/tmp"].endswith(f"size={32 * 2**20},mode=1777")
    finally:
        hostile.delete(sid)


@pytest.mark.parametrize("tenant", ["alpha", "beta"])
def test_posture_of_every_sandbox_with_default_settings(
        gateway: GatewayProcess, docker_client: docker.DockerClient, tenant: str) -> None:
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(tenant), timeout=120) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        try:
            assert c.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}).status_code == 200
            for config in _containers(docker_client, gateway.owner):
                _check(config, gateway, 2 * 2**30)
        finally:
            c.delete(f"/v1/sessions/{sid}")


def test_image_has_no_setuid_files_and_runs_as_non_root(docker_client: docker.DockerClient,
                                                       hostile: Hostile) -> None:
    image_name = _containers(docker_client, hostile.gateway.owner)[0]["Config"]["Image"]
    image = docker_client.images.get(image_name)
    assert image.attrs["Config"]["User"] not in ("", "0", "root")
    output = docker_client.containers.run(
        image_name, entrypoint=["/bin/sh", "-c",
                                "find / -xdev -type f -perm /6000 2>/dev/null; echo END"],
        network_mode="none", remove=True, user="1000:1000")
    assert output.decode().split() == ["END"]
