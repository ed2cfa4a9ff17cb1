"""E2B's builder steps, as the unmodified SDK serializes them, become a Dockerfile and a build
context (``gateway.e2b._templates_dockerfile``); the builds themselves are
``test_e2b_templates.py``'s, on the engine."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from e2b import Template, wait_for_timeout
from e2b.template.utils import tar_file_stream

from gateway.e2b._errors import E2BError
from gateway.e2b._templates_dockerfile import Translation, context, outward_links, translate
from gateway.e2b._templates_models import BuildStart


def _start(template: Template) -> BuildStart:
    inner = template._template  # the SDK's own serialization, as Template.build sends it
    return BuildStart.model_validate(inner._serialize(inner._instructions_with_hashes()))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "test.txt").write_text("This is a test file.")
    (tmp_path / "folder" / "link.txt").symlink_to("test.txt")
    (tmp_path / "folder" / "gone.txt").symlink_to("/nowhere/at/all")
    return tmp_path


def test_each_step_becomes_lines_that_remember_it(folder: Path) -> None:
    template = (Template(file_context_path=str(folder)).from_base_image()
                .copy("folder/*", "folder").run_cmd("cat folder/test.txt")
                .run_cmd("whoami", user="root").set_workdir("/app")
                .set_envs({"A": 'x$y "q"'}).set_user("user")
                .set_start_cmd("echo hi", wait_for_timeout(1_000)))
    start = _start(template)
    out = translate(start, "replgate-sandbox:x", "1000:1000", "b1")
    assert out.lines == [
        "FROM replgate-sandbox:x",
        'COPY --chown=1000:1000 ["e2b/s1/", "folder/"]',
        'RUN ["/bin/bash", "-c", "cat folder/test.txt"]',
        "USER root", 'RUN ["/bin/bash", "-c", "whoami"]', "USER 1000:1000",
        "WORKDIR /app",
        'ENV A="x\\$y \\"q\\""',
        "USER 1000:1000"]
    assert out.steps == ["base", "1", "2", "3", "3", "3", "4", "5", "6"]
    assert (start.start_cmd, start.ready_cmd) == ("echo hi", "sleep 1")
    assert out.step_of(1) == "base" and out.step_of(5) == "3"
    assert out.step_of(len(out.lines) + 1) == "finalize" and out.step_of(None) == "finalize"


def test_a_forced_step_busts_the_cache_from_there_on() -> None:
    template = (Template().from_image("debian:bookworm").run_cmd("true").skip_cache()
                .run_cmd("date"))
    out = translate(_start(template), "debian:bookworm", "root", "build-7")
    assert out.lines[2:] == ['LABEL replgate.e2b.force="build-7"',
                             'RUN ["/bin/bash", "-c", "date"]']
    assert out.steps[2:] == ["2", "2"]


def test_a_globs_matches_are_laid_out_and_links_stay_links(folder: Path) -> None:
    template = (Template(file_context_path=str(folder)).from_base_image()
                .copy("folder/*", "here").copy("folder", "/there"))
    start = _start(template)
    hashes = [step.files_hash or "" for step in start.steps]
    archives = {}
    for src, files_hash in zip(("folder/*", "folder"), hashes, strict=True):
        archives[files_hash] = folder / f"{files_hash}.tar"
        with tar_file_stream(src, str(folder), [], False, True) as stream:
            archives[files_hash].write_bytes(stream.read())
    links = outward_links(hashes, archives.__getitem__)
    assert links == {h: [("folder/gone.txt", "/nowhere/at/all")] for h in hashes}
    out = translate(start, "img", "1000:1000", "b", links)
    made = '"/bin/sh", "-c", "mkdir -p \\"$(dirname \\"$1\\")\\" && ln -sfn \\"$0\\" \\"$1\\""'
    assert out.lines[1:] == [
        'COPY --chown=1000:1000 ["e2b/s1/", "here/"]',
        "USER root", f'RUN [{made}, "/nowhere/at/all", "here/gone.txt"]', "USER 1000:1000",
        f'COPY --chown=1000:1000 ["e2b/{hashes[1]}/folder", "/there"]',
        "USER root", f'RUN [{made}, "/nowhere/at/all", "/there/gone.txt"]', "USER 1000:1000"]
    with tarfile.open(fileobj=io.BytesIO(context(out.copies, archives.__getitem__))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"e2b/s1/test.txt", "e2b/s1/link.txt", f"e2b/{hashes[1]}/folder",
                            f"e2b/{hashes[1]}/folder/test.txt",
                            f"e2b/{hashes[1]}/folder/link.txt"}
    assert members["e2b/s1/link.txt"].issym() and members["e2b/s1/link.txt"].linkname == "test.txt"


def test_an_upload_leaving_its_folder_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../../etc/passwd")
        tar.addfile(info, io.BytesIO(b""))
    copies = [("h", "h", None)]
    with pytest.raises(E2BError, match="outside its folder"):
        context(copies, lambda _: archive)


@pytest.mark.parametrize(("step", "says"), [
    ({"type": "VOLUME", "args": ["/x"]}, "not a builder step"),
    ({"type": "ENV", "args": ["A", "one\ntwo"]}, "one line"),
    ({"type": "COPY", "args": ["a", "b", "", "0755"], "filesHash": "0" * 64}, "mode"),
    ({"type": "COPY", "args": ["../a", "b"], "filesHash": "0" * 64}, "inside the context"),
    ({"type": "COPY", "args": ["a", "b"]}, "files hash"),
])
def test_what_cannot_be_built_is_refused_with_a_sentence(step: dict[str, object],
                                                          says: str) -> None:
    start = BuildStart.model_validate({"fromImage": "img", "steps": [step]})
    with pytest.raises(E2BError, match=says) as refused:
        translate(start, "img", "root", "b")
    assert refused.value.status == 400


def test_a_translation_is_its_lines() -> None:
    out = Translation()
    out.add("base", "FROM x")
    assert out.dockerfile == "FROM x\n" and out.hashes == []
