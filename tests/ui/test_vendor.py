"""The vendored xterm.js files: what gateway/static/vendor/lock.json says they are, they are; the
lock is what npm serves for its versions; the gateway serves exactly the locked files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx

from gateway.routers.ui import vendored
from tests.conftest import GatewayProcess
from tests.ui.vendor import LOCK, VENDOR, load_lock, mismatches, npm_pack, sha256


def test_vendored_files_are_the_locked_ones() -> None:
    assert mismatches() == []
    names = [name for package in load_lock() for name in package["files"]]
    assert len(names) == len(set(names))
    assert {"xterm.mjs", "xterm.css", "addon-fit.mjs"} <= set(names)


def test_the_lock_check_catches_a_changed_an_unlisted_and_a_missing_file(tmp_path: Path) -> None:
    copy = tmp_path / "vendor"
    shutil.copytree(VENDOR, copy)
    (copy / "xterm.css").write_bytes((copy / "xterm.css").read_bytes() + b"\n")
    (copy / "extra.mjs").write_text("export {};\n")
    (copy / "addon-fit.mjs").unlink()
    assert mismatches(copy) == ["xterm.css (@xterm/xterm) is not the locked file",
                                "addon-fit.mjs (@xterm/addon-fit) is missing",
                                "extra.mjs is not in lock.json"]


def test_each_vendored_package_ships_its_license() -> None:
    for package in load_lock():
        licenses = [name for name, entry in package["files"].items()
                    if entry["from"] == "package/LICENSE"]
        assert licenses == [name for name in package["files"] if name.endswith(".LICENSE")]
        assert package["license"] == "MIT" and len(licenses) == 1, package["name"]
        text = (VENDOR / licenses[0]).read_text()
        assert "Permission is hereby granted, free of charge" in text, package["name"]


def test_the_lock_is_what_npm_serves_for_its_versions(tmp_path: Path) -> None:
    for package in load_lock():
        packed = npm_pack(package["name"], package["version"], tmp_path)
        assert packed.integrity == package["integrity"], package["name"]
        manifest = json.loads(packed.members["package/package.json"])
        assert (manifest["name"], manifest["version"], manifest["license"]) == (
            package["name"], package["version"], package["license"])
        for name, entry in package["files"].items():
            assert sha256(packed.members[entry["from"]]) == entry["sha256"], name


async def test_the_gateway_serves_the_locked_files_only(ui_gateway: GatewayProcess) -> None:
    assert set(vendored()) == {name for p in load_lock() for name in p["files"]}
    async with httpx.AsyncClient(base_url=ui_gateway.url) as anonymous:
        for name, media_type in vendored().items():
            answer = await anonymous.get(f"/ui/vendor/{name}")
            assert answer.status_code == 200, name
            assert answer.headers["content-type"] == media_type
            assert answer.content == (VENDOR / name).read_bytes()
        for name in (LOCK.name, "..%2Flock.json", "nothing.mjs", "..%2Fapp.js"):
            missing = await anonymous.get(f"/ui/vendor/{name}")
            assert missing.status_code == 404 and missing.json()["detail"], name
