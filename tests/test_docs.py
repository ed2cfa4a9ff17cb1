"""The documentation holds together: the README and the pages it leads to link only files of the
repository (and headings that exist in them), and docs/api.md names every route the gateway
serves, and no route it does not serve but in its "Planned" section.

The README's examples are run by tests/test_readme.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount, Route, WebSocketRoute

from common.settings import Settings
from gateway.app import create_app
from tests.conftest import REPO

README = REPO / "README.md"
API = REPO / "docs" / "api.md"
DOCUMENTS = [README, REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
MENTION = re.compile(r"`(?P<methods>[A-Z]+(?:\\?\|[A-Z]+)*|WebSocket) (?P<path>/[^`\s]*)`")
PLANNED = "\n## Planned"
SKIPPED_MODULES = {"gateway.routers.ui"}
"""The web UI's page and static files: not an API."""


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_reach_files_and_headings_of_the_repository(document: Path) -> None:
    broken = []
    for target in links(document):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.is_relative_to(REPO) or not linked.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: {linked.name} has no heading #{anchor}")
    assert broken == []


def test_readme_links_nothing_outside_the_repository() -> None:
    targets = links(README)

    assert "docs/api.md" in targets
    assert [t for t in targets if t.startswith("../") or "/../" in t] == []


@dataclass(frozen=True)
class Served:
    methods: frozenset[str]
    """Empty for a mount or an ASGI app that takes any method."""
    path: str
    prefix: bool = False
    """A mount: anything under ``path`` is its."""
    api: bool = True
    """False for the web UI's files and FastAPI's OAuth helper page: served, not API."""


def normal(path: str) -> str:
    """A path with its parameters unnamed: ``/v1/sessions/{}`` for ``{id}`` and ``{session_id}``."""
    return re.sub(r"\{[^}]*\}", "{}", path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> list[Served]:
    """Every route of the app ``replgate serve`` runs (built, not started)."""
    app = create_app(Settings(state_dir=tmp_path_factory.mktemp("state")))
    routes = []
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        endpoint = getattr(route, "endpoint", None)
        api = not (getattr(endpoint, "__module__", None) in SKIPPED_MODULES
                   or context.path == app.swagger_ui_oauth2_redirect_url)
        path = normal(context.path or "")
        if isinstance(route, Mount):
            routes.append(Served(frozenset(), path, prefix=True, api=api))
        elif isinstance(route, WebSocketRoute):
            routes.append(Served(frozenset({"WebSocket"}), path, api=api))
        else:
            assert isinstance(route, Route), route
            methods = frozenset(context.methods or ()) - {"HEAD"}
            routes.append(Served(methods, path, api=api))
    assert len(routes) > 50
    return routes


def mentions(text: str) -> set[tuple[str, str]]:
    """``(method, path)`` of every route the text names as `METHOD /path` (`GET|POST /path`)."""
    return {(method, normal(m.group("path")))
            for m in MENTION.finditer(text)
            for method in m.group("methods").replace("\\", "").split("|")}


def answers(route: Served, method: str, path: str) -> bool:
    if route.prefix:
        return path.startswith(route.path + "/")
    return path == route.path and (not route.methods or method in route.methods)


def is_named(route: Served, named: set[tuple[str, str]]) -> bool:
    """Each of the route's methods is named with its path (any one, for a mount or a bare app)."""
    if not route.methods:
        return any(answers(route, m, p) for m, p in named)
    return all((method, route.path) in named for method in route.methods)


def test_api_reference_names_every_route_served(served: list[Served]) -> None:
    named = mentions(API.read_text().split(PLANNED)[0])

    missing = [f"{'|'.join(sorted(r.methods)) or '*'} {r.path}" for r in served
               if r.api and not is_named(r, named)]
    assert missing == [], "docs/api.md does not name these routes"


def test_api_reference_names_no_route_that_is_not_served(served: list[Served]) -> None:
    current, planned = API.read_text().split(PLANNED)

    unserved = [f"{m} {p}" for m, p in sorted(mentions(current))
                if not any(answers(r, m, p) for r in served)]
    assert unserved == [], "docs/api.md names routes the gateway does not serve"
    assert all(not any(answers(r, m, p) for r in served) for m, p in mentions(planned)), (
        "docs/api.md lists as planned a route that is served")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_command_runs_a_pip_the_virtualenv_lacks(document: Path) -> None:
    """uv makes ``.venv`` without pip: a documented ``.venv/bin/pip`` fails as written."""
    assert ".venv/bin/pip " not in document.read_text()
