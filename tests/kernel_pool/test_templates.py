"""Kernel templates: a new sandbox's first kernel restored from a checkpointed kernel instead of
booting (real engine, CRIU, kernels). Each pool here keeps its templates in a folder of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest
from kp_support import own_session, pausing_pool, run_ok

from kernel_pool import KernelPool, NetworkPolicy, Profile, Session
from kernel_pool.backends.docker import DockerBackend, DockerSandbox
from kernel_pool.backends.docker._template import (
    TEMPLATE_PID,
    Template,
    TemplateError,
    first_pid,
    run_criu,
)
from kernel_pool.backends.docker._template import find as find_template
from kernel_pool.backends.docker._template import load as load_template
from kernel_pool.backends.docker._template import remove_others as remove_other_templates
from kernel_pool.backends.docker._template import restore as restore_template

TEMPLATE_WAIT_S = 90.0

STATE = """
import os, random
import numpy as np
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\\t" in line)
print(os.getpid(), random.random(), np.random.rand(), status["Uid"].split()[0],
      status["CapEff"].strip(), status["NoNewPrivs"].strip(), status["Seccomp"].strip(),
      os.path.isdir(os.environ["MPLCONFIGDIR"]), os.path.isdir(os.environ["IPYTHONDIR"]))
"""


def backend_of(pool: KernelPool) -> DockerBackend:
    assert isinstance(pool.backend, DockerBackend)
    return pool.backend


def sandbox_of(session: Session) -> DockerSandbox:
    sandbox = session.kernel.sandbox
    assert isinstance(sandbox, DockerSandbox)
    return sandbox


async def template_of(pool: KernelPool) -> Template:
    """The default profile's template, once made (the first kernel of the profile starts it)."""
    backend, profile = backend_of(pool), pool.settings.profiles["default"]
    for _ in range(int(TEMPLATE_WAIT_S * 10)):
        template = backend.template_for(profile)
        if template is not None:
            return template
        await asyncio.sleep(0.1)
    raise AssertionError(f"no template after {TEMPLATE_WAIT_S} s: {backend.templates_refusal}")


@pytest.fixture(scope="module")
async def template_pool(state_root: Path, docker_client: docker.DockerClient,
                        ) -> AsyncIterator[KernelPool]:
    async with pausing_pool(state_root, docker_client, "templates",
                            template_dir=state_root / "templates-own") as pool:
        assert backend_of(pool).templates, backend_of(pool).templates_refusal
        first = await pool.create_session()  # boots, and has the template made meanwhile
        assert not sandbox_of(first).from_template
        await template_of(pool)
        await pool.delete_session(first.id)
        yield pool


@pytest.fixture
async def session(template_pool: KernelPool) -> AsyncIterator[Session]:
    async with own_session(template_pool) as own:
        yield own


async def test_new_kernels_are_restored_and_start_afresh(template_pool: KernelPool) -> None:
    template = await template_of(template_pool)
    one = await template_pool.create_session()
    two = await template_pool.create_session()
    try:
        seen = []
        for session in (one, two):
            sandbox = sandbox_of(session)
            assert sandbox.from_template
            pid, py_random, np_random, uid, caps, nnp, seccomp, mpl, ipy = (
                (await run_ok(session, STATE)).split())
            # The template's kernel, in this container, as confined as a booted one.
            assert (int(pid), uid, caps, nnp, seccomp) == (
                TEMPLATE_PID, "1000", "0000000000000000", "1", "2")
            assert (mpl, ipy) == ("True", "True")  # its private folders, made again in /tmp
            connection = await sandbox.connection_info()
            assert connection is not None and connection["key"] != template.key
            seen.append((py_random, np_random))
            # Charged to its own container: the kernel's memory shows in that cgroup.
            usage = await sandbox.usage()
            assert usage.memory_bytes is not None and usage.memory_bytes > 50 * 2**20
            cgroups = await run_ok(session, "print(open('/proc/self/cgroup').read())")
            assert sandbox.info.container_id in cgroups
        # Reseeded: the copies of one template do not draw the same numbers.
        assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1]
        result = await two.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
        assert result.status == "ok" and "image/png" in result.outputs[0].data, result
    finally:
        for session in (one, two):
            await template_pool.delete_session(session.id)


async def test_criu_in_a_sandbox_loads_the_kernels_features_from_the_gateways_cache(
        template_pool: KernelPool, tmp_path: Path) -> None:
    # Without it, each CRIU run in a sandbox probed the kernel anew (a third of a restore's
    # CPU): its /run is read-only, where CRIU would write the cache itself.
    backend = backend_of(template_pool)
    assert backend.kdat_cache is not None and backend.kdat_cache.stat().st_mode & 0o777 == 0o600
    session = await template_pool.create_session()
    try:
        sandbox = sandbox_of(session)
        (tmp_path / "work").mkdir()
        with contextlib.suppress(TemplateError):  # its verdict on the sandbox does not matter
            await asyncio.to_thread(run_criu, sandbox._init_pid, sandbox.info.container_id,
                                    ["check", "-v4"], tmp_path, tmp_path / "work", "check")
        log = (tmp_path / "work" / "check.log").read_text()
        assert "Loaded kdat cache from /run/criu.kdat" in log, log[:2000]
    finally:
        await template_pool.delete_session(session.id)


async def test_restart_boots_and_a_memory_pause_keeps_a_restored_kernel(
        session: Session, template_pool: KernelPool) -> None:
    assert sandbox_of(session).from_template
    await run_ok(session, "import threading, time\nticks = [0]\n"
                          "def tick():\n    while True:\n        ticks[0] += 1\n"
                          "        time.sleep(0.01)\n"
                          "threading.Thread(target=tick, name='ticker', daemon=True).start()\n"
                          "x = 41")
    # ./run.sh gives this host memory pauses: a test that skipped them would prove nothing.
    assert backend_of(template_pool).checkpoints, backend_of(template_pool).checkpoint_refusal
    # A kernel restored from a template lives in its container's own time namespace: the
    # whole container can be checkpointed like one whose kernel booted.
    info = await session.pause()
    assert info.paused_with == "memory", session.reason
    assert await run_ok(session, "print(x, ticks[0] > 0)") == "41 True\n"
    await session.restart()
    assert not sandbox_of(session).from_template
    assert int(await run_ok(session, "import os\nprint(os.getpid())")) != TEMPLATE_PID


async def test_a_sandbox_with_an_environment_of_its_own_gets_it_in_a_restored_kernel(
        session: Session, template_pool: KernelPool) -> None:
    parent = await template_pool.create_session(env={"REPLGATE_TEST_MARK": "kept"})
    try:
        await run_ok(parent, "y = 2")
        # The copy is a sandbox made with the parent's environment, resumed in a container of
        # its own: its kernel comes from the template, the environment set in it after.
        copies = await template_pool.fork_session(parent.id, 1)
        try:
            copy = copies[0]
            out = await run_ok(copy, "import os\nprint(os.environ['REPLGATE_TEST_MARK'], y)")
            assert out == "kept 2\n"
            assert sandbox_of(copy).from_template
        finally:
            for copy in copies:
                await template_pool.delete_session(copy.id)
    finally:
        await template_pool.delete_session(parent.id)


async def test_a_policy_attached_at_claim_reaches_the_proxy_from_a_restored_kernel(
        session: Session) -> None:
    assert sandbox_of(session).from_template
    await session.set_network(NetworkPolicy(allow=["192.0.2.1:9"]))
    # The template's forwarder (listening since before the checkpoint) reaches the proxy
    # attached at the claim, which decides: this address is not on the policy.
    out = await run_ok(session, "import requests\n"
                       "print(requests.get('http://198.51.100.7/', timeout=10).text)")
    assert out.startswith("replgate egress refused 198.51.100.7:80"), out
    assert sandbox_of(session).from_template  # no restart, no boot


async def test_a_profile_with_egress_hands_out_warm_kernels_restored_from_its_template(
        state_root: Path, docker_client: docker.DockerClient) -> None:
    """A profile's ``egress_allow`` is attached to its kernels as a session's policy is (the
    proxy beside the sandbox, its variables set in the kernel), not baked into a boot: its
    warm kernels come from its template like any other profile's."""
    egress = Profile(name="default", workspace_size="64m", tmp_size="32m", min_idle=1,
                     egress_allow=["192.0.2.1:9"])
    async with pausing_pool(state_root, docker_client, "templates-egress",
                            profiles={"default": egress},
                            template_dir=state_root / "templates-egress-own") as pool:
        await template_of(pool)
        booted = await pool.create_session()  # the warm kernel started before the template
        await pool.delete_session(booted.id)
        await pool.wait_ready(timeout_s=TEMPLATE_WAIT_S)  # its replacement, restored
        session = await pool.create_session()
        try:
            assert sandbox_of(session).from_template
            out = await run_ok(session, "import os, requests\nprint(os.environ['HTTPS_PROXY'])\n"
                               "print(requests.get('http://198.51.100.7/', timeout=10).text)")
            assert out.startswith("http://127.0.0.1:3128\nreplgate egress refused "
                                  "198.51.100.7:80"), out
            command = await session.run_command("echo $HTTPS_PROXY", timeout_s=30)
            assert command.stdout == "http://127.0.0.1:3128\n", command
        finally:
            await pool.delete_session(session.id)


async def test_a_template_that_fails_to_restore_is_dropped_and_kernels_boot(
        template_pool: KernelPool) -> None:
    template = await template_of(template_pool)
    # A page image gone: the records still say the template is whole, the restore fails.
    for pages in template.folder.glob("pages-*.img"):
        pages.unlink()
    session = await template_pool.create_session()
    try:
        assert not sandbox_of(session).from_template
        assert await run_ok(session, "print(1 + 1)") == "2\n"
        assert not template.folder.exists()
    finally:
        await template_pool.delete_session(session.id)
    # Another is made (a second attempt in this gateway's life), and used.
    remade = await template_of(template_pool)
    assert remade.folder.is_dir()
    again = await template_pool.create_session()
    try:
        assert sandbox_of(again).from_template
        assert await run_ok(again, "print(2 + 2)") == "4\n"
    finally:
        await template_pool.delete_session(again.id)


async def test_a_second_gateway_restores_from_the_template_it_finds(
        template_pool: KernelPool, state_root: Path, docker_client: docker.DockerClient) -> None:
    template = await template_of(template_pool)
    kept = sorted(template.folder.parent.iterdir())
    async with pausing_pool(state_root, docker_client, "templates-second",
                            template_dir=template.folder.parent) as second:
        # The template is found on disk: nothing is booted to make it again.
        assert await template_of(second) == template
        session = await second.create_session()
        assert sandbox_of(session).from_template
        assert await run_ok(session, "print(3 * 3)") == "9\n"
    # No template was made beside it (a new one would be a folder of its own).
    assert sorted(template.folder.parent.iterdir()) == kept


async def test_without_templates_kernels_boot(state_root: Path,
                                              docker_client: docker.DockerClient) -> None:
    async with pausing_pool(state_root, docker_client, "no-templates",
                            kernel_templates=False) as pool:
        assert not backend_of(pool).templates
        session = await pool.create_session()
        assert not sandbox_of(session).from_template
        assert backend_of(pool).template_for(pool.settings.profiles["default"]) is None
        assert await run_ok(session, "print(5)") == "5\n"
    shutil.rmtree(state_root / "no-templates", ignore_errors=True)


@pytest.mark.parametrize("stage", ["launch_kernel", "kill"])
async def test_a_pool_closed_while_its_template_is_made_leaves_nothing(
        stage: str, state_root: Path, docker_client: docker.DockerClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed while the template's kernel boots, or while its sandbox is being removed after
    the dump (that removal was cut short: the container went, its workspace stayed mounted):
    no container or mount is left (``pausing_pool`` checks), nor an unfinished dump."""
    reached = asyncio.Event()
    step = getattr(DockerSandbox, stage)

    async def observed(sandbox: DockerSandbox, *args: object, **kwargs: object) -> object:
        if sandbox.info.sandbox_id.startswith("template-"):
            reached.set()
        return await step(sandbox, *args, **kwargs)

    monkeypatch.setattr(DockerSandbox, stage, observed)  # only watched: the step runs
    name = f"template-closed-{stage}"
    # A template folder of its own: in the run's shared one, another test's template of the
    # same profile would be found, and none made.
    async with pausing_pool(state_root, docker_client, name,
                            template_dir=state_root / name / "templates") as pool:
        assert backend_of(pool).templates, backend_of(pool).templates_refusal
        assert backend_of(pool).template_for(pool.settings.profiles["default"]) is None
        await asyncio.wait_for(reached.wait(), TEMPLATE_WAIT_S)
    assert list((state_root / name).glob("templates/*.part")) == []
    shutil.rmtree(state_root / name, ignore_errors=True)


def _fake_template(root: Path, name: str, boot_id: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "inventory.img").write_bytes(b"")
    records = {"kernel_name": "k1", "kernel_pid": TEMPLATE_PID, "key": name,
               "boot_id": boot_id or Path("/proc/sys/kernel/random/boot_id").read_text().strip()}
    (folder / "template.json").write_text(json.dumps(records))
    return folder


def test_templates_are_found_by_profile_and_image_and_never_from_another_boot(
        tmp_path: Path) -> None:
    stem = "default-0123456789abcdef"
    older = _fake_template(tmp_path, f"{stem}-00000001")
    newer = _fake_template(tmp_path, f"{stem}-00000002")
    os.utime(older, (1, 1))
    _fake_template(tmp_path, f"{stem}-00000003.part")  # unfinished
    _fake_template(tmp_path, "default-fedcba9876543210-00000004")  # another image
    assert find_template(tmp_path, stem) == load_template(newer)
    shutil.rmtree(newer)
    assert find_template(tmp_path, stem) == load_template(older)
    shutil.rmtree(older)
    _fake_template(tmp_path, f"{stem}-00000005", boot_id="another boot")
    assert find_template(tmp_path, stem) is None


def test_an_own_folder_keeps_one_template_per_profile(tmp_path: Path) -> None:
    keep = _fake_template(tmp_path, "default-0123456789abcdef-0000000a")
    for name in ("default-0123456789abcdef-0000000b", "default-fedcba9876543210-0000000c",
                 "default-0123456789abcdef-0000000d.part"):
        _fake_template(tmp_path, name)
    other_profile = _fake_template(tmp_path, "default-big-0123456789abcdef-0000000e")
    remove_other_templates(tmp_path, "default", keep)
    assert sorted(tmp_path.iterdir()) == sorted([keep, other_profile])


def test_criu_never_enters_a_process_that_is_not_the_containers_pid_1(tmp_path: Path) -> None:
    # The host pid of a container's PID 1 may have ended and been given to another process:
    # that one's namespaces (here, the test's own: the host's) must never be entered.
    template = Template(tmp_path, "k1", TEMPLATE_PID, "key")
    with pytest.raises(TemplateError) as caught:
        restore_template(template, os.getpid(), "f" * 64, tmp_path / "work")
    assert "PID 1 is gone" in str(caught.value) and not caught.value.template_at_fault
    ended = subprocess.Popen(["true"])
    ended.wait()
    with pytest.raises(TemplateError) as caught:
        first_pid(ended.pid, "f" * 64, TEMPLATE_PID)
    assert not caught.value.template_at_fault
