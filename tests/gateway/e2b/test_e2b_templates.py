"""E2B's template builder, unmodified from .venv, against a running gateway: builds on the engine
(``gateway.templates``), sandboxes of them (a start command's server listening at once in
each), their status and logs, aliases and tags, and another tenant refused."""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import (
    BuildException,
    Sandbox,
    Template,
    TemplateException,
    wait_for_file,
    wait_for_port,
    wait_for_url,
)
from e2b.exceptions import SandboxException
from e2b.template.logger import LogEntry
from e2b.template.types import BuildInfo, TemplateBuildStatus
from e2b_code_interpreter import Sandbox as CodeSandbox

from tests.conftest import GatewayProcess

pytestmark = pytest.mark.usefixtures("e2b_env")

PACKAGE = "tinydb"
"""A PyPI package the sandbox image does not have."""
BUILD_S = 600


def _wait(info: BuildInfo, logs: list[LogEntry]) -> TemplateBuildStatus:
    """Poll the build's status as the SDK does, gathering its log; its last status."""
    deadline = time.monotonic() + BUILD_S
    while True:
        got = Template.get_build_status(info, logs_offset=len(logs))
        logs.extend(got.log_entries)
        if got.status not in (TemplateBuildStatus.BUILDING, TemplateBuildStatus.WAITING):
            if got.reason is not None:
                logs.append(LogEntry(datetime.now(UTC), "error", f"reason: {got.reason}"))
            return got.status
        assert time.monotonic() < deadline, "the build did not end"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def context_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2b-context")
    (root / "data").mkdir()
    (root / "data" / "hello.txt").write_text("hello from the template's context")
    (root / "data" / "also.txt").write_text("a second file")
    (root / "data" / "near.txt").symlink_to("hello.txt")
    (root / "data" / "far.txt").symlink_to("/etc/hostname")  # out of the context: made by a RUN
    return root


@pytest.fixture(scope="module")
def built(e2b_env: dict[str, str], context_dir: Path) -> Iterator[tuple[str, BuildInfo]]:
    """A template adding a PyPI package and copied files, started in the background."""
    alias = f"e2b-tpl-{uuid.uuid4().hex[:8]}"
    template = (Template(file_context_path=str(context_dir)).from_base_image()
                .pip_install([PACKAGE]).copy("data/*", "/opt/e2b-data")
                .set_envs({"TEMPLATE_GREETING": "hi there"})
                .set_start_cmd("echo started > /tmp/started.txt && exec sleep 1000",
                               wait_for_file("/tmp/started.txt")))
    info = Template.build_in_background(template, f"{alias}:v1")
    yield alias, info
    httpx.delete(f"{e2b_env['E2B_API_URL']}/templates/{alias}",
                 headers={"X-API-Key": e2b_env["E2B_API_KEY"]}, timeout=60)


def test_build_in_background_answers_at_once_then_its_status_and_logs(
        built: tuple[str, BuildInfo]) -> None:
    alias, info = built
    assert (info.template_id, info.tags) == (alias, ["v1"])
    first = Template.get_build_status(info)
    assert first.status in (TemplateBuildStatus.BUILDING, TemplateBuildStatus.WAITING)
    logs: list[LogEntry] = list(first.log_entries)
    assert _wait(info, logs) is TemplateBuildStatus.READY, logs[-3:]
    assert any(PACKAGE in entry.message for entry in logs), [e.message for e in logs]
    offsets = Template.get_build_status(info, logs_offset=len(logs))
    assert offsets.log_entries == [] and offsets.status is TemplateBuildStatus.READY


def test_a_sandbox_of_the_template_has_its_package_files_env_and_start_command(
        built: tuple[str, BuildInfo]) -> None:
    alias, info = built
    assert _wait(info, []) is TemplateBuildStatus.READY
    sandbox = Sandbox.create(template=alias)
    try:
        out = sandbox.commands.run(
            f"python -c 'import {PACKAGE}; print({PACKAGE}.__name__)' && "
            "cat /opt/e2b-data/hello.txt && echo && cat /opt/e2b-data/also.txt && echo && "
            "echo $TEMPLATE_GREETING && readlink /opt/e2b-data/near.txt /opt/e2b-data/far.txt")
        assert out.stdout.splitlines() == [
            PACKAGE, "hello from the template's context", "a second file", "hi there",
            "hello.txt", "/etc/hostname"]
        started = sandbox.commands.run(
            "for i in $(seq 50); do [ -f /tmp/started.txt ] && break; sleep 0.1; done; "
            "cat /tmp/started.txt && for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline; echo; "
            "done 2>/dev/null | grep -q '^sleep 1000' && echo running")
        assert started.stdout.split() == ["started", "running"]  # its start command runs
    finally:
        sandbox.kill()
    kernel = CodeSandbox.create(template=f"{alias}:v1")  # the kernel itself, by a tag
    try:
        code = kernel.run_code(f"import {PACKAGE}, os; {PACKAGE}.__name__, os.environ["
                               "'TEMPLATE_GREETING']")
        assert code.text == repr((PACKAGE, "hi there")), code
    finally:
        kernel.kill()


def test_exists_aliases_listing_and_tags(built: tuple[str, BuildInfo],
                                         e2b_env: dict[str, str]) -> None:
    alias, info = built
    assert _wait(info, []) is TemplateBuildStatus.READY
    key = {"X-API-Key": e2b_env["E2B_API_KEY"]}
    listed = httpx.get(f"{e2b_env['E2B_API_URL']}/v2/templates", headers=key).json()
    assert [(t["templateID"], t["buildStatus"]) for t in listed
            if t["templateID"] == alias] == [(alias, "ready")]
    one = httpx.get(f"{e2b_env['E2B_API_URL']}/templates/{alias}", headers=key).json()
    assert [b["buildID"] for b in one["builds"]] == [info.build_id]
    assert Template.exists(alias) is True
    assert Template.exists("base") is True
    assert Template.exists(f"nonexistent-{uuid.uuid4().hex}") is False
    assigned = Template.assign_tags(f"{alias}:v1", ["production", "latest"])
    assert assigned.build_id == info.build_id
    assert set(assigned.tags) == {"production", "latest"}
    assert {t.tag for t in Template.get_tags(alias)} == {"v1", "production", "latest"}
    Template.remove_tags(alias, "latest")
    assert {t.tag for t in Template.get_tags(alias)} == {"v1", "production"}
    for bad in (":invalid", f"{alias}:"):
        with pytest.raises(TemplateException):
            Template.assign_tags(f"{alias}:v1", bad)


def test_another_tenant_is_refused(built: tuple[str, BuildInfo], gateway: GatewayProcess,
                                   e2b_env: dict[str, str]) -> None:
    alias, info = built
    assert _wait(info, []) is TemplateBuildStatus.READY
    theirs = {"api_key": gateway.keys["beta"]}
    assert Template.exists(alias, **theirs) is False
    mine = Sandbox.create(template=alias)
    profile = mine.get_info().template_id  # the template's profile (tpl_...)
    mine.kill()
    for name in (alias, profile):
        with pytest.raises(SandboxException, match="404") as refused:
            Sandbox.create(template=name, **theirs)
        listed = str(refused.value).partition("the profiles are")[2]
        assert listed and profile not in listed  # nor is it among the profiles named
    with pytest.raises(BuildException, match="404"):
        Template.get_build_status(info, **theirs)
    with pytest.raises(TemplateException):
        Template.get_tags(alias, **theirs)
    api = e2b_env["E2B_API_URL"]
    link = httpx.get(f"{api}/templates/{alias}/files/{'a' * 64}",
                     headers={"X-API-Key": e2b_env["E2B_API_KEY"]})
    assert link.status_code == 201, link.text
    url = link.json()["url"]
    assert httpx.get(f"{api}/templates/{alias}/files/{'a' * 64}",
                     headers={"X-API-Key": gateway.keys["beta"]}).status_code == 404
    forged = url.replace("tenant=alpha", "tenant=beta")
    assert forged != url
    refused = httpx.put(forged, content=b"not a tar")
    assert refused.status_code == 403 and "not made for these files" in refused.json()["message"]


def test_a_failing_step_is_named_and_the_sdk_points_at_it() -> None:
    template = Template().from_base_image().run_cmd("echo fine")
    template = template.run_cmd("echo about to fail && exit 3")  # the failing step
    with pytest.raises(BuildException, match="exit 3") as failed:
        Template.build(template, f"e2b-fail-{uuid.uuid4().hex[:8]}")
    lines = [frame.line for frame in traceback.extract_tb(failed.value.__traceback__)
             if frame.filename == __file__]
    assert any("# the failing step" in (line or "") for line in lines), lines


def test_a_failing_steps_status_names_its_index() -> None:
    template = Template().from_base_image().run_cmd("true").run_cmd("false")
    alias = f"e2b-fail-{uuid.uuid4().hex[:8]}"
    info = Template.build_in_background(template, alias)
    logs: list[LogEntry] = []
    assert _wait(info, logs) is TemplateBuildStatus.ERROR
    status = Template.get_build_status(info)
    assert status.reason is not None and status.reason.step == "2", status.reason
    assert "false" in status.reason.message
    with pytest.raises(SandboxException, match="not ready"):
        Sandbox.create(template=alias)


def test_a_base_the_engine_cannot_get_fails_at_base() -> None:
    template = Template().from_image("registry.invalid/nothing:1").run_cmd("true")
    info = Template.build_in_background(template, f"e2b-nobase-{uuid.uuid4().hex[:8]}")
    assert _wait(info, []) is TemplateBuildStatus.ERROR
    status = Template.get_build_status(info)
    assert status.reason is not None and status.reason.step == "base", status.reason
    assert "registry.invalid" in status.reason.message


def test_what_cannot_be_mapped_is_refused_with_a_sentence() -> None:
    template = Template().from_image("ubuntu:22.04", username="u", password="p")
    with pytest.raises(BuildException, match="registry's credentials"):
        Template.build(template, f"e2b-creds-{uuid.uuid4().hex[:8]}")


SERVED = ("curl -s -o /dev/null -w '%{http_code} ' http://localhost:8080; "
          "for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline; echo; done 2>/dev/null "
          "| grep -c '^python3 -m http.server'; [ -e /proc/10000 ] && echo restored || true")
"""At once in a new sandbox: the server's answer, how many servers run, and whether the
kernel was restored from the kernel template (its kernel's pid, 10000, exists)."""


@pytest.mark.parametrize("ready", ["url", "port"])
def test_sandboxes_start_with_the_start_commands_server_listening(
        e2b_env: dict[str, str], ready: str) -> None:
    """E2B snapshots a template after its start and ready commands; here the kernel template
    is checkpointed with the server listening, and every sandbox (booted, warm, restored from
    it) has it answering at once, one server. E2B's ``wait_for_port`` runs ``ss`` in the
    sandbox (iproute2, in the image for it)."""
    # Slow to listen: a sandbox handed out before it is ready would find no server.
    template = Template().from_base_image().set_start_cmd(
        "sleep 2; exec python3 -m http.server 8080",
        wait_for_url("http://localhost:8080") if ready == "url" else wait_for_port(8080))
    alias = f"e2b-srv-{uuid.uuid4().hex[:8]}"
    Template.build(template, alias)
    try:
        restored = False
        deadline = time.monotonic() + 120
        while not restored:
            assert time.monotonic() < deadline, "no sandbox restored from the kernel template"
            sandbox = Sandbox.create(template=alias)
            try:
                said = sandbox.commands.run(SERVED).stdout.split()
            finally:
                sandbox.kill()
            assert said[:2] == ["200", "1"], said
            restored = said[2:] == ["restored"]
            time.sleep(1)  # time for the warm sandbox to come up
    finally:
        httpx.delete(f"{e2b_env['E2B_API_URL']}/templates/{alias}",
                     headers={"X-API-Key": e2b_env["E2B_API_KEY"]}, timeout=60)


def test_a_restarted_gateway_still_answers_the_tags_and_the_build_status(
        built: tuple[str, BuildInfo], gateway: GatewayProcess) -> None:
    alias, info = built
    assert _wait(info, []) is TemplateBuildStatus.READY
    Template.assign_tags(f"{alias}:v1", ["kept"])
    tags = {(t.tag, t.build_id) for t in Template.get_tags(alias)}
    assert ("kept", info.build_id) in tags
    gateway.stop()
    gateway.start()
    assert {(t.tag, t.build_id) for t in Template.get_tags(alias)} == tags
    status = Template.get_build_status(info)
    assert status.status is TemplateBuildStatus.READY and status.build_id == info.build_id
    assert Template.assign_tags(f"{alias}:kept", ["again"]).build_id == info.build_id
