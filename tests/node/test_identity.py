"""A node's default id: the host name and a suffix kept in the state folder."""

from __future__ import annotations

import socket
from pathlib import Path

from node.identity import ID_FILE, default_node_id


def test_the_default_id_is_kept_per_state_folder_and_differs_between_folders(
        tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    first = default_node_id(one)
    assert first.startswith(f"{socket.gethostname()}-") and len(first) > len(socket.gethostname())
    assert default_node_id(one) == first, "a restart keeps its id"
    assert (one / ID_FILE).read_text().strip() == first
    assert default_node_id(two) != first, "two state folders on one host: two ids"
    (one / ID_FILE).write_text("worker-5\n")  # an id an operator wrote there is taken as is
    assert default_node_id(one) == "worker-5"
