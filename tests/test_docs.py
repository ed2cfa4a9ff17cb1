"""The documentation holds together: the README and the pages it leads to link only files of the
repository (and headings that exist in them), and docs/api.md names every route the gateway
serves, and no route it does not serve but in its "Planned" section; every REPLGATE_* variable
they name is one replgate reads, docs/configuration.md names every setting, and every
`replgate ...` and `./run.sh ...` command they show is one the CLI and run.sh have.

The README's examples are run by tests/test_readme.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel
from starlette.routing import Mount, Route, WebSocketRoute

from common.settings import ENV_PREFIX, FLAT_NAMES, Settings
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


NOT_SETTINGS = {"REPLGATE_URL", "REPLGATE_API_KEY", "REPLGATE_VENV", "REPLGATE_TOOLS",
                "REPLGATE_DEBIAN_MIRROR", "REPLGATE_IMAGE_VERSION", "REPLGATE_POOL__X",
                "REPLGATE_LIMITS__X"}
"""Variables of the clients (the gateway's address and key), of ./run.sh and of the image
build, and the placeholders of nested names: not the gateway's settings."""


def setting_variables() -> set[str]:
    """Every ``REPLGATE_*`` variable ``Settings`` reads: the flat names, each field's, and
    each nested field's (``__`` between the levels)."""
    found = {ENV_PREFIX + flat.upper() for flat in FLAT_NAMES}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            found.add(prefix + name.upper())
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                walk(field.annotation, f"{prefix}{name.upper()}__")

    walk(Settings, ENV_PREFIX)
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_variable_named_is_one_replgate_reads(document: Path) -> None:
    """A misspelt or renamed variable in the docs is one a user sets for nothing."""
    named = set(re.findall(r"\bREPLGATE_[A-Z0-9_]*[A-Z0-9]\b", document.read_text()))
    unknown = {name for name in named - setting_variables() - NOT_SETTINGS
               if not name.startswith("REPLGATE_TEST_")}
    assert unknown == set()


def test_configuration_documents_every_setting() -> None:
    """Each setting is in docs/configuration.md by one of its names: its variable, its flat
    name, or (a pool or profile field) its name in the page's list of the nested ones."""
    text = (REPO / "docs" / "configuration.md").read_text()
    listed = {f"{ENV_PREFIX}{group}__{name}"
              for group, names in re.findall(r"`REPLGATE_(\w+?)__<NAME>`: [^(]*\(([^)]*)\)", text)
              for name in re.findall(r"`([A-Z_]+)`", names)}
    flat = {f"{ENV_PREFIX}{'__'.join(path).upper()}": ENV_PREFIX + name.upper()
            for name, path in FLAT_NAMES.items()}
    models = {f"{ENV_PREFIX}POOL", f"{ENV_PREFIX}LIMITS", f"{ENV_PREFIX}LIMITS__CAPS",
              f"{ENV_PREFIX}LIMITS__NAME"}  # (the models themselves; a profile's own name)
    missing = sorted(name for name in setting_variables() - models - set(flat.values())
                     if f"`{name}`" not in text and name not in listed
                     and f"`{flat.get(name)}`" not in text)
    assert missing == []


COMMAND = re.compile(r"^\s*(?:\$ )?(?:[A-Z_0-9]+=\S+ )*(?:\.venv/bin/)?replgate (?P<args>.+)$",
                     re.MULTILINE)
INLINE_COMMAND = re.compile(r"`(?:\.venv/bin/)?replgate (?P<args>[a-z][^`]*)`")
RUN_SH = re.compile(r"^\s*(?:\$ )?\./run\.sh (?P<sub>[a-z]+)", re.MULTILINE)
ANY_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.MULTILINE | re.DOTALL)
"""A code block, in a list item (indented) too."""


def commands_named(pattern: re.Pattern[str], *, fenced: bool) -> list[tuple[Path, str]]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        blocks = ANY_FENCE.findall(text) if fenced else [ANY_FENCE.sub("", text)]
        found += [(document, match.group(1)) for block in blocks
                  for match in pattern.finditer(block)]
    return found


def unknown_words(words: list[str]) -> str | None:
    """What of ``replgate WORDS`` the CLI does not have: a command or an option (values and
    options' arguments are not checked: a page may name an option without one)."""
    from gateway.cli import build_parser

    parser = build_parser()
    for word in words:
        if word.startswith("-"):
            if word.split("=")[0] not in parser._option_string_actions:
                return f"no option {word}"
            continue
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if commands:
            if word not in commands[0].choices:
                return f"no command {word!r}"
            parser = commands[0].choices[word]
    return None


def test_every_replgate_command_in_the_docs_is_one_it_has() -> None:
    """Each ``replgate ...`` of a code block or a code span names commands and options the
    CLI has; a code block's line parses as written."""
    from gateway.cli import build_parser

    named = commands_named(COMMAND, fenced=True) + commands_named(INLINE_COMMAND, fenced=False)
    problems = []
    for document, command in named:
        words = shlex.split(re.split(r"[|;&]", command.replace("\\", ""))[0], comments=True)
        problem = unknown_words(words)
        if problem is None and (document, command) in commands_named(COMMAND, fenced=True):
            try:
                build_parser().parse_args(words)
            except SystemExit:
                problem = "does not parse"
        if problem is not None:
            problems.append(f"{document.name}: replgate {command}: {problem}")
    assert len(named) > 20 and problems == []


def test_every_run_sh_command_in_the_docs_is_one_it_has() -> None:
    offered = set(re.findall(r"^  ([a-z]+)\)", (REPO / "run.sh").read_text(), re.MULTILINE))
    named = {(document.name, sub) for document, sub in commands_named(RUN_SH, fenced=True)}
    assert {"serve", "test"} <= {sub for _, sub in named}
    assert [f"{name}: ./run.sh {sub}" for name, sub in sorted(named) if sub not in offered] == []

