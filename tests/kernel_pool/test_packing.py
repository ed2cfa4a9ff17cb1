"""A memory image's archive (``kernel_pool.backends.docker._packing``): compressed when its pages
shrink, stored as it is when they do not, and unpacked either way; a stored archive's files are
copied out only below the folder it is unpacked into."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from kernel_pool.backends.docker._packing import (
    ABOUT_NAME,
    IMAGE_SUFFIX,
    STORED_SUFFIX,
    CheckpointError,
    Packing,
    first_records,
    unpack,
)

RECORDS = {"kernel_tree": True, "kernel_name": "k1"}


def _dump(folder: Path, pages: bytes) -> Path:
    folder.mkdir()
    (folder / ABOUT_NAME).write_text(json.dumps(RECORDS))
    (folder / "pages-1.img").write_bytes(pages)
    (folder / "pstree.img").write_bytes(b"tree")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize(("pages", "suffix"), [
    (os.urandom(16 << 20), STORED_SUFFIX),  # random floats: they do not shrink
    (bytes(range(256)) * (16 << 12), IMAGE_SUFFIX),  # a heap's: they do
])
def test_a_dump_is_compressed_only_when_its_pages_shrink(tmp_path: Path, pages: bytes,
                                                         suffix: str) -> None:
    dump = _dump(tmp_path / "dump", pages)
    image = Packing(dump, tmp_path / "s1.memory").run()
    assert image.name == f"s1.memory{suffix}"
    assert not image.with_name(image.name + ".part").exists()
    if suffix == STORED_SUFFIX:
        assert image.stat().st_size >= len(pages)
    else:
        assert image.stat().st_size < len(pages) // 10
    assert first_records(image) == RECORDS
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    unpack(image, unpacked)
    assert _files(unpacked) == _files(dump)


def _stored(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


@pytest.mark.parametrize("member", [
    tarfile.TarInfo("../escaped.img"),
    tarfile.TarInfo("/tmp/escaped.img"),
    tarfile.TarInfo("deep/../../escaped.img"),
])
def test_a_stored_archive_reaching_outside_its_folder_is_refused(tmp_path: Path,
                                                                 member: tarfile.TarInfo) -> None:
    image = _stored(tmp_path / f"s1.memory{STORED_SUFFIX}", [(member, b"out")])
    folder = tmp_path / "a" / "unpacked"
    folder.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="outside it"):
        unpack(image, folder)
    assert not (tmp_path / "a" / "escaped.img").exists()
    assert not (tmp_path / "escaped.img").exists() and not Path("/tmp/escaped.img").exists()


def test_a_stored_archive_holding_a_link_or_cut_short_is_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("pages-1.img")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    image = _stored(tmp_path / f"l.memory{STORED_SUFFIX}", [(link, b"")])
    folder = tmp_path / "unpacked"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="not a file"):
        unpack(image, folder)
    assert not (folder / "pages-1.img").is_symlink()

    whole = _stored(tmp_path / f"c.memory{STORED_SUFFIX}",
                    [(tarfile.TarInfo("pages-1.img"), os.urandom(1 << 20))])
    with open(whole, "r+b") as cut:
        cut.truncate(600 << 10)
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(CheckpointError, match="corrupt"):
        unpack(whole, again)
