"""The web UI's ES modules: no import circle, each one loaded from app.js and served by /ui/.

A circle among modules that all run at start would load (ES modules tolerate it while no
module body touches an import of a module still loading), but it makes the views one tangle
where a change anywhere may break the load order. No browser is needed: the imports are read
from the files.
"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.routers.ui import ASSETS, vendored
from tests.conftest import REPO

STATIC = REPO / "gateway" / "static"
ENTRY = "app.js"
# `import {...} from "x"` (over several lines too), `export {...} from "x"`, `import "x"`
# and `import("x")`: every form that makes the browser load a module.
IMPORT = re.compile(
    r"""^\s*(?:import|export)\b[^;"']*?\bfrom\s*["']([^"']+)["']"""
    r"""|^\s*import\s*["']([^"']+)["']"""
    r"""|\bimport\(\s*["']([^"']+)["']\s*\)""",
    re.MULTILINE)


def imports(path: Path) -> list[str]:
    """The specifiers of the modules ``path`` imports, as written."""
    return [next(group for group in match.groups() if group)
            for match in IMPORT.finditer(path.read_text())]


def module_graph() -> dict[str, list[str]]:
    """Each module of gateway/static by file name, and the files it imports."""
    graph = {}
    for path in sorted(STATIC.glob("*.js")):
        targets = []
        for specifier in imports(path):
            # The page has no import map: only files beside it load, by relative URL, and the
            # vendored modules its lock names (served by /ui/vendor/).
            if specifier.startswith("./vendor/"):
                assert vendored().get(specifier.removeprefix("./vendor/"), "").startswith(
                    "text/javascript"), f"{path.name} imports {specifier}, not a locked module"
                continue
            assert re.fullmatch(r"\./[a-z_]+\.js", specifier), (path.name, specifier)
            assert (STATIC / specifier[2:]).is_file(), f"{path.name} imports a missing {specifier}"
            targets.append(specifier[2:])
        graph[path.name] = targets
    return graph


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One circle per back edge a depth-first walk meets, each as its modules in order."""
    found: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        path.append(module)
        for target in graph[module]:
            if target in path:
                found.append([*path[path.index(target):], target])
            elif target not in done:
                visit(target)
        path.pop()
        done.add(module)

    for module in graph:
        if module not in done:
            visit(module)
    return found


def reachable(graph: dict[str, list[str]], start: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def describe(graph: dict[str, list[str]]) -> str:
    return "\n".join(f"  {module} -> {', '.join(targets) or '(nothing)'}"
                     for module, targets in graph.items())


def test_the_import_parser_reads_every_form(tmp_path: Path) -> None:
    module = tmp_path / "m.js"
    module.write_text('import { a, b }\n  from "./one.js";\nimport "./two.js";\n'
                      'export { c } from "./three.js";\nconst d = await import("./four.js");\n'
                      '// from "./not.js" in a comment of no import\n')
    assert imports(module) == ["./one.js", "./two.js", "./three.js", "./four.js"]


def test_the_cycle_finder_names_each_circle() -> None:
    assert cycles({"a.js": ["b.js"], "b.js": ["c.js"], "c.js": []}) == []
    assert cycles({"a.js": ["b.js"], "b.js": ["c.js"], "c.js": ["a.js"]}) == [
        ["a.js", "b.js", "c.js", "a.js"]]


def test_no_import_circle_among_the_ui_modules() -> None:
    graph = module_graph()
    assert ENTRY in graph
    found = cycles(graph)
    assert not found, ("import circles:\n" + "\n".join(" -> ".join(c) for c in found)
                       + "\nthe imports:\n" + describe(graph))


def test_every_module_loads_from_app_js_and_is_served() -> None:
    graph = module_graph()
    unreached = set(graph) - reachable(graph, ENTRY)
    assert not unreached, f"not imported from {ENTRY}: {sorted(unreached)}\n{describe(graph)}"
    served = {name for name in ASSETS if name.endswith(".js")}
    assert served == set(graph), (f"ASSETS (gateway/routers/ui.py) lacks "
                                  f"{sorted(set(graph) - served)}, names missing files "
                                  f"{sorted(served - set(graph))}")
    assert all(ASSETS[name].startswith("text/javascript") for name in graph)
    # index.html loads the entry alone; the browser follows its imports.
    page = (STATIC / "index.html").read_text()
    assert re.findall(r'<script[^>]*\bsrc="/ui/([^"]+)"', page) == [ENTRY]


def test_vendored_modules_import_nothing() -> None:
    """Loaded by URL with no import map, a vendored module must be whole in itself."""
    modules = [name for name in vendored() if name.endswith(".mjs")]
    assert modules
    for name in modules:
        assert imports(STATIC / "vendor" / name) == [], name
