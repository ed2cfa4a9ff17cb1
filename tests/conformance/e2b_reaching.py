"""A pytest plugin for E2B's core SDK suite: which tests reach a server, by their fixtures.

Loaded by ``run_e2b_suite.py`` into the suite's own pytest run (``-p e2b_reaching``), it
writes each collected test's id and fixture names as JSON lines to the file that
``RG_REACHING_OUT`` names, and changes nothing else. A test reaches a server when it takes a
sandbox (``sandbox``, ``sandbox_factory`` and their async twins) or a template build
(``build``), or is one of :data:`DIRECT`, which call the API themselves; the rest of the suite is
offline unit tests of the SDK.
"""

from __future__ import annotations

import json
import os
from typing import Any

SERVER_FIXTURES = {"sandbox_factory", "async_sandbox_factory", "build", "async_build"}
DIRECT = ("test_kill_non_existing_sandbox", "test_mcp_gateway_start_failure",
          "test_check_base_template_name_exists", "test_check_non_existing_name",
          "test_build_in_background_should_start")
"""Tests that call E2B's API without a server fixture."""


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    out = os.environ.get("RG_REACHING_OUT")
    if not out:
        return
    with open(out, "w") as f:
        for item in items:
            f.write(json.dumps({"id": item.nodeid,
                                "fixtures": list(getattr(item, "fixturenames", []))}) + "\n")


def reaching(lines: list[str]) -> set[str]:
    """The ids of the tests that reach a server, from the lines the plugin wrote."""
    found = set()
    for line in lines:
        test = json.loads(line)
        if SERVER_FIXTURES & set(test["fixtures"]) or any(d in test["id"] for d in DIRECT):
            found.add(test["id"])
    return found


def area(test_id: str) -> str:
    """The area of the issue a test belongs to (the excluded ones: templates, network,
    host names)."""
    path, name = test_id.split("::")[0], test_id.split("::")[-1]
    for needle, label in (("template_", "templates"), ("test_network", "network"),
                          ("test_internet_access", "network"), ("egress", "network"),
                          ("test_host", "host names"), ("/git/", "git"), ("/pty/", "pty"),
                          ("test_watch", "watch"), ("/files/", "files"),
                          ("send_stdin", "stdin"), ("/commands/", "commands"),
                          ("snapshot", "snapshots"), ("test_metrics", "metrics")):
        if needle in path:
            return label
    if "test_create" in path and "mcp" in name:
        return "mcp"
    if any(part in path for part in ("test_create", "test_connect", "test_timeout", "test_kill")):
        return "lifecycle"
    return path.rsplit("/", 1)[-1].removesuffix(".py")
