"""What a piece of code does, as far as reading it can tell: calls, imports, strings, shell.

IPython's own syntax is taken out first, line by line (``!cmd``, ``x = !cmd``, ``%pip ...``,
``%time expr``, a ``%%bash`` cell), and the rest is parsed with :mod:`ast`; names are resolved
through the code's imports (``import subprocess as sp; sp.run`` is ``subprocess.run``, ``from os
import system; system()`` is ``os.system``), simple assignments (``f = os.system``),
``getattr(os, "system")``, ``__import__("subprocess")`` and ``importlib.import_module``.

This is a speed bump, not a boundary: code can always compute a name at run time
(``getattr(os, "sys" + "tem")`` after enough indirection). The container is the boundary.
Code that does not parse is let through: the kernel reports the SyntaxError.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

from common.policy import Rule

__all__ = ["Finding", "Match", "decide", "inspect_code", "match_rules"]

Kind = Literal["call", "import", "string", "shell"]

SHELL_LINE_MAGICS = {"pip": "pip", "conda": "conda", "mamba": "mamba", "uv": "uv",
                     "system": "", "sx": "", "sc": "", "bash": "", "sh": ""}
PYTHON_LINE_MAGICS = {"time", "timeit", "prun", "capture"}
SHELL_CELL_MAGICS = {"bash", "sh", "script", "system", "sx", "!", "zsh", "python2", "perl",
                     "ruby", "pypy", "python", "python3"}
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
_ASSIGNED_ESCAPE = re.compile(r"^([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*([!%].*)$")
_MAGIC = re.compile(r"^%+([\w!.-]+)\s*(.*)$", re.S)
_MAX_VALUE = 300


@dataclass(frozen=True)
class Finding:
    kind: Kind
    value: str
    line: int


@dataclass(frozen=True)
class Match:
    """A rule that matched, where and on what."""

    rule: str
    action: str
    message: str
    line: int
    matched: str
    """What matched, e.g. ``call os.system`` or ``shell pip install x``."""

    def as_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "action": self.action, "message": self.message,
                "line": self.line, "matched": self.matched}


# -- IPython syntax -----------------------------------------------------------------------------


def _magic(text: str, line: int, found: list[Finding]) -> str | None:
    """A ``%magic`` line: record what it does; the Python to analyse in its place, if any."""
    parsed = _MAGIC.match(text)
    if parsed is None:
        return None
    name, rest = parsed.group(1), parsed.group(2).strip()
    if name in SHELL_LINE_MAGICS:
        prefix = SHELL_LINE_MAGICS[name]
        found.append(Finding("shell", f"{prefix} {rest}".strip(), line))
        return None
    if name in PYTHON_LINE_MAGICS:
        return rest.split(None, 1)[1] if rest.startswith("-") and " " in rest else rest
    if rest:
        found.append(Finding("string", rest, line))  # %cd path, %run file.py, %load url...
    return None


def split_ipython(code: str) -> tuple[str, list[Finding]]:
    """The Python left once IPython's escapes are taken out (same line numbers), and them."""
    found: list[Finding] = []
    lines = code.split("\n")
    first = next((i for i, text in enumerate(lines) if text.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        head = lines[first].lstrip()[2:]
        name, _, argument = head.partition(" ")
        lines[first] = ""
        if name in SHELL_CELL_MAGICS:
            if argument.strip():
                found.append(Finding("shell", argument.strip(), first + 1))
            for number in range(first + 1, len(lines)):
                if lines[number].strip():
                    found.append(Finding("shell", lines[number].strip(), number + 1))
                lines[number] = ""
            return "\n".join(lines), found
        if name not in PYTHON_CELL_MAGICS:  # %%html, %%writefile path, ...: not Python
            if argument.strip():
                found.append(Finding("string", argument.strip(), first + 1))
            for number in range(first + 1, len(lines)):
                if lines[number].strip():
                    found.append(Finding("string", lines[number].strip(), number + 1))
            return "", found
    return _escape_lines(lines, found), found


def _escape(text: str, number: int, found: list[Finding]) -> str | None:
    """The line in place of an IPython escape starting a logical line (None: not one)."""
    stripped = text.lstrip()
    indent = text[: len(text) - len(stripped)]
    target = None
    assigned = _ASSIGNED_ESCAPE.match(stripped)
    if assigned:
        target, stripped = assigned.group(1), assigned.group(2)
    if stripped.startswith("!"):
        found.append(Finding("shell", stripped.lstrip("!").strip(), number + 1))
        python = None
    elif stripped.startswith("%"):
        python = _magic(stripped, number + 1, found)
    else:
        return None
    replacement = python if python else ("None" if target else "pass")
    return indent + (f"{target} = {replacement}" if target else replacement)


def _escape_lines(lines: list[str], found: list[Finding]) -> str:
    """Replace escapes where IPython sees them: only at the start of a logical line, not in a
    bracket, a backslash continuation or a multi-line string (tracked with ``tokenize``)."""
    out: list[str] = []
    produced = [False] * (len(lines) + 1)
    state: dict[str, int] = {"last": tokenize.NEWLINE, "depth": 0}

    def starts(k: int) -> bool:
        if k == 0:
            return True
        last = state["last"]
        return produced[k - 1] and (last == tokenize.NEWLINE or
                                    (last == tokenize.NL and state["depth"] == 0))

    def readline() -> str:
        k = len(out)
        if k >= len(lines):
            return ""
        text = lines[k]
        if starts(k):
            text = _escape(text, k, found) or text
        out.append(text)
        return text + "\n"

    try:
        for token in tokenize.generate_tokens(readline):
            produced[token.start[0] - 1] = produced[token.end[0] - 1] = True
            if token.type == tokenize.OP and token.string in "([{":
                state["depth"] += 1
            elif token.type == tokenize.OP and token.string in ")]}":
                state["depth"] = max(0, state["depth"] - 1)
            if token.type not in (tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                state["last"] = token.type
    except (tokenize.TokenError, SyntaxError):
        pass  # not valid Python even without the escapes: the kernel will say so
    for k in range(len(out), len(lines)):
        out.append(_escape(lines[k], k, found) or lines[k])
    return "\n".join(out)


# -- Python -------------------------------------------------------------------------------------


_GETATTR = {"getattr", "builtins.getattr"}
_IMPORTERS = {"__import__", "builtins.__import__", "importlib.import_module",
              "importlib.__import__"}
_IPYTHON_SHELL = {"get_ipython().system", "get_ipython().getoutput"}
_IPYTHON_MAGIC = {"get_ipython().run_line_magic", "get_ipython().run_cell_magic"}


def _text(node: ast.AST | None) -> str | None:
    """The string a constant expression builds (literals, ``+`` of them, constant f-strings)."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, bytes):
            return node.value.decode("latin-1")
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_text(value) for value in node.values]
        return "".join(p for p in parts if p is not None) if all(
            p is not None for p in parts) else None
    return None


class _Scanner:
    """Resolves names through the module's imports and aliases, and collects findings."""

    def __init__(self, tree: ast.AST) -> None:
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.stars: list[str] = []
        self.found: list[Finding] = []

    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            function = self.resolve(node.func)
            args = node.args
            if function in _GETATTR and len(args) >= 2:
                base, name = self.resolve(args[0]), _text(args[1])
                return f"{base}.{name}" if base and name else None
            if function in _IMPORTERS and args:
                return _text(args[0])
            if function == "get_ipython":
                return "get_ipython()"
        return None

    def _imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.found.append(Finding("import", alias.name, node.lineno))
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                for alias in node.names:
                    if alias.name == "*":
                        self.found.append(Finding("import", module, node.lineno))
                        self.stars.append(module)
                        continue
                    self.found.append(Finding("import", f"{module}.{alias.name}", node.lineno))
                    self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def _assignments(self) -> None:
        """``sp = subprocess``, ``f = os.system``, ``m = __import__("os")``: aliases too."""
        for _ in range(2):
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                    targets = (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if node.value is None or not all(isinstance(t, ast.Name) for t in targets):
                        continue
                    resolved = self.resolve(node.value)
                    if resolved and self._through_import(node.value):
                        for target in targets:
                            assert isinstance(target, ast.Name)
                            self.aliases[target.id] = resolved

    def _through_import(self, node: ast.AST) -> bool:
        """Does the expression's name start at an import (or an import call)?"""
        while isinstance(node, ast.Attribute):
            node = node.value
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        if isinstance(node, ast.Call):
            return self.resolve(node.func) in (*_GETATTR, *_IMPORTERS)
        return False

    def scan(self) -> list[Finding]:
        self._imports()
        self._assignments()
        for node in ast.walk(self.tree):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Call):
                self._call(node, line)
            elif isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load):
                if self._through_import(node):
                    name = self.resolve(node)
                    if name:
                        self.found.append(Finding("call", name, line))
            elif isinstance(node, ast.Constant | ast.BinOp | ast.JoinedStr):
                text = _text(node)
                if text:
                    self.found.append(Finding("string", text, line))
        return self.found

    def _call(self, node: ast.Call, line: int) -> None:
        name = self.resolve(node.func)
        if name is None:
            return
        self.found.append(Finding("call", name, line))
        if isinstance(node.func, ast.Name) and node.func.id not in self.aliases:
            for module in self.stars:
                self.found.append(Finding("call", f"{module}.{name}", line))
        if name in _IMPORTERS and node.args:
            imported = _text(node.args[0])
            if imported:
                self.found.append(Finding("import", imported, line))
        arguments = [_text(arg) for arg in node.args]
        if name in _IPYTHON_SHELL and arguments and arguments[0]:
            self.found.append(Finding("shell", arguments[0], line))
        if name in _IPYTHON_MAGIC and len(arguments) >= 2 and arguments[0]:
            body = "\n".join(a for a in arguments[1:] if a)
            prefix = "%%" if name.endswith("cell_magic") else "%"
            split = split_ipython(f"{prefix}{arguments[0]} {body}")[1]
            self.found.extend(Finding(f.kind, f.value, line) for f in split)


def inspect_code(code: str) -> list[Finding] | None:
    """Everything the code visibly does; None when it is not valid (IPython) Python."""
    try:
        tree = ast.parse(code)
        found: list[Finding] = []
    except SyntaxError:
        python, found = split_ipython(code)
        try:
            tree = ast.parse(python)
        except SyntaxError:
            return found or None
    except ValueError:  # null bytes
        return None
    return found + _Scanner(tree).scan()


# -- rules ------------------------------------------------------------------------------------


@cache
def _pattern(glob: str, fold: bool) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(glob), re.IGNORECASE | re.DOTALL if fold else re.DOTALL)


def _any(globs: Sequence[str], values: Iterable[str], fold: bool) -> bool:
    candidates = list(values)
    return any(_pattern(g, fold).match(v) for g in globs for v in candidates)


def _module_prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _hit(rule: Rule, finding: Finding) -> bool:
    value = finding.value
    if finding.kind == "call":
        return _any(rule.calls, [value], fold=False)
    if finding.kind == "import":
        return _any(rule.imports, _module_prefixes(value), fold=False)
    if finding.kind == "shell":
        command = " ".join(value.split())
        return _any(rule.shell, [command], fold=True) or _any(rule.strings, [command], fold=True)
    return _any(rule.strings, [value], fold=True)


def match_rules(rules: Sequence[Rule], findings: Sequence[Finding]) -> list[Match]:
    """For each rule, its first match (by line)."""
    ordered = sorted(findings, key=lambda f: f.line)
    matches = []
    for rule in rules:
        for finding in ordered:
            if _hit(rule, finding):
                shown = " ".join(finding.value.split())
                if len(shown) > _MAX_VALUE:
                    shown = shown[:_MAX_VALUE] + "..."
                matches.append(Match(rule=rule.id, action=rule.action, message=rule.message,
                                     line=finding.line, matched=f"{finding.kind} {shown}"))
                break
    return matches


def decide(rules: Sequence[Rule], code: str) -> tuple[str, list[Match]]:
    """``("deny" | "approve" | "allow", matches)``: any deny wins, then any approve."""
    if not rules:
        return "allow", []
    findings = inspect_code(code)
    if findings is None:
        return "allow", []
    matches = match_rules(rules, findings)
    actions = {match.action for match in matches}
    decision = "deny" if "deny" in actions else "approve" if "approve" in actions else "allow"
    return decision, matches
