"""Files touched: both trackers report exactly what changed in a folder, and stay bounded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from replgate_kernel import files

TRACKERS = [files.InotifyTracker, files.SnapshotTracker]


def changed(report: dict[str, Any]) -> dict[str, tuple[str, int | None]]:
    return {item["path"]: (item["change"], item["size"]) for item in report["files"]}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "kept.txt").write_text("same")
    (tmp_path / "edited.txt").write_text("old")
    (tmp_path / "removed.txt").write_text("bye")
    (tmp_path / "data").mkdir()
    return tmp_path


@pytest.mark.parametrize("kind", TRACKERS)
def test_tracker_reports_created_modified_and_deleted(kind: Any, workspace: Path) -> None:
    tracker = kind(str(workspace))
    tracker.start()
    (workspace / "new.csv").write_text("a,b\n1,2\n")
    (workspace / "edited.txt").write_text("new text")
    (workspace / "removed.txt").unlink()
    (workspace / "data" / "deep" / "er").mkdir(parents=True)
    (workspace / "data" / "deep" / "er" / "x.bin").write_bytes(b"123")
    (workspace / "scratch").write_text("made and removed within the execution")
    (workspace / "scratch").unlink()
    (workspace / ".replgate" / "outputs").mkdir(parents=True)
    (workspace / ".replgate" / "outputs" / "spill.txt").write_text("the gateway's own")
    report = tracker.finish()
    assert changed(report) == {
        "new.csv": ("created", 8), "edited.txt": ("modified", 8),
        "removed.txt": ("deleted", None), "data/deep/er/x.bin": ("created", 3)}
    assert report["truncated"] is False


@pytest.mark.parametrize("kind", TRACKERS)
def test_tracker_forgets_changes_between_executions(kind: Any, workspace: Path) -> None:
    tracker = kind(str(workspace))
    tracker.start()
    assert changed(tracker.finish()) == {}
    (workspace / "uploaded.txt").write_text("by someone else, between executions")
    (workspace / "data" / "later").mkdir()
    tracker.start()
    (workspace / "data" / "later" / "seen.txt").write_text("in a folder made before")
    assert changed(tracker.finish()) == {"data/later/seen.txt": ("created", 23)}


def test_inotify_tracker_sees_a_folder_moved_in_and_out(workspace: Path, tmp_path_factory:
                                                         pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "inbox").mkdir()
    (outside / "inbox" / "mail.txt").write_text("hi")
    tracker = files.InotifyTracker(str(workspace))
    tracker.start()
    shutil.move(outside / "inbox", workspace / "inbox")
    shutil.move(workspace / "data", outside / "data")
    assert changed(tracker.finish()) == {"inbox/mail.txt": ("created", 2),
                                         "data": ("deleted", None)}


def test_tracker_cuts_a_long_list(workspace: Path) -> None:
    tracker = files.InotifyTracker(str(workspace))
    tracker.start()
    for number in range(files.MAX_REPORTED + 5):
        (workspace / "data" / f"f{number}").write_bytes(b"")
    report = tracker.finish()
    assert len(report["files"]) == files.MAX_REPORTED
    assert report["truncated"] is True
