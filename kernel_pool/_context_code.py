"""The code that sets a context's environment variables and working folder, in its language.

E2B's server does both by sending each kernel a snippet of its own language (its
``messaging.py``): per-call ``envs`` are set before the code and put back after it, a context
made with a ``cwd`` changes to it as its kernel starts. These are replgate's snippets: names and
values are quoted as string literals of the language (a value holding quotes, backslashes or
newlines stays one value, never code), and a per-call variable is put back to the value it had
before the call, or removed if it had none. Java has no way to change its own process's
environment: as E2B's server does, it gets system properties (``System.getProperty``), and
``user.dir`` for its folder.
"""

from __future__ import annotations

import json
import posixpath
import re

from kernel_pool.exceptions import InvalidRequest

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_CWD = 4096
SAVED = "__replgate_env"
"""The prefix of what holds a variable's value from before a call until it is put back."""


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` if every name and value can be set in any language's kernel, else
    :class:`InvalidRequest` saying which cannot."""
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise InvalidRequest(
                f"environment variable name {name!r} is not letters, digits and underscores "
                "(not starting with a digit), as every language's kernel needs")
        if "\x00" in value:
            raise InvalidRequest(f"the value of environment variable {name!r} contains a NUL "
                                 "character, which an environment cannot hold")
    return env


def check_cwd(cwd: str | None) -> str | None:
    """A context's working folder as asked (None: the workspace, where every kernel starts),
    normalized; :class:`InvalidRequest` for one no kernel could change to."""
    if cwd is None or cwd.strip() == "":
        return None
    if "\x00" in cwd or len(cwd) > MAX_CWD:
        raise InvalidRequest("cwd must be a folder's path, without NUL characters, at most "
                             f"{MAX_CWD} characters")
    normal = posixpath.normpath(cwd)
    return None if normal == "." else normal


# -- literals -------------------------------------------------------------------------------

def _python(text: str) -> str:
    return repr(text)


def _r(text: str) -> str:
    # JSON's escapes (\n, \", \\, \uXXXX for control characters) are R's too.
    return json.dumps(text, ensure_ascii=False)


_javascript = _r


def _escaped(text: str, specials: str, control: str) -> str:
    """``text`` with each of ``specials`` behind a backslash and each control character as
    ``control`` formats its code point."""
    return "".join("\\" + char if char in specials
                   else control.format(ord(char)) if ord(char) < 0x20 or ord(char) == 0x7F
                   else char for char in text)


def _bash(text: str) -> str:
    """An ANSI-C quoted word (``$'...'``): one word, whatever it holds, on one line."""
    return "$'" + _escaped(text, "\\'", "\\x{:02x}") + "'"


def _java(text: str) -> str:
    # Octal escapes, not \uXXXX: Java turns those into characters before it reads the
    # literal, so an escaped newline would end it.
    return '"' + _escaped(text, '\\"', "\\{:03o}") + '"'


# -- per-call variables ---------------------------------------------------------------------

def env_code(language: str, env: dict[str, str]) -> tuple[str, str] | None:
    """Code that sets ``env`` in a kernel of ``language`` (keeping the values it replaces),
    and code that puts them back after the call; None for a language without a way."""
    if not env:
        return None
    names = sorted(env)
    if language == "python":
        setup = (f"{SAVED} = {{k: __import__('os').environ.get(k) for k in {names!r}}}\n"
                 f"__import__('os').environ.update({dict(sorted(env.items()))!r})")
        restore = (f"for __replgate_k, __replgate_v in {SAVED}.items():\n"
                   "    if __replgate_v is None: __import__('os').environ.pop(__replgate_k, None)\n"
                   "    else: __import__('os').environ[__replgate_k] = __replgate_v\n"
                   f"del {SAVED}, __replgate_k, __replgate_v")
        return setup, restore
    if language == "r":
        listed = ", ".join(_r(k) for k in names)
        values = ", ".join(f"{_r(k)} = {_r(env[k])}" for k in names)
        setup = (f".{SAVED} <- Sys.getenv(c({listed}), unset = NA, names = TRUE)\n"
                 f"invisible(do.call(Sys.setenv, list({values})))")
        restore = (f"invisible(local({{\n  old <- .{SAVED}\n  kept <- !is.na(old)\n"
                   "  if (any(kept)) do.call(Sys.setenv, as.list(old[kept]))\n"
                   "  if (any(!kept)) Sys.unsetenv(names(old)[!kept])\n}))\n"
                   f"rm(.{SAVED})")
        return setup, restore
    if language == "javascript":
        key = f'globalThis[Symbol.for("{SAVED}")]'
        values = ", ".join(f"{_javascript(k)}: {_javascript(env[k])}" for k in names)
        setup = (f"{key} = Object.fromEntries({json.dumps(names)}.map((k) => "
                 "[k, Deno.env.get(k) ?? null]));\n"
                 f"for (const [k, v] of Object.entries({{{values}}})) Deno.env.set(k, v);\n"
                 "void 0")
        restore = (f"for (const [k, v] of Object.entries({key})) {{\n"
                   "  if (v === null) Deno.env.delete(k); else Deno.env.set(k, v);\n}\n"
                   f"delete {key};\nvoid 0")
        return setup, restore
    if language == "bash":
        sets, puts = [], []
        for i, name in enumerate(names):
            saved = f"{SAVED}_{i}"
            sets.append(f'if [ -n "${{{name}+x}}" ]; then {saved}=${name}; '
                         f"else unset {saved}; fi; export {name}={_bash(env[name])}")
            puts.append(f'if [ -n "${{{saved}+x}}" ]; then export {name}="${saved}"; '
                           f"else unset {name}; fi; unset {saved}")
        return "\n".join(sets), "\n".join(puts)
    if language == "java":
        sets, puts = [], []
        for name in names:
            key, saved = _java(name), _java(f"{SAVED}.{name}")
            # A Properties table holds objects: FALSE marks a property that was not set.
            sets.append(f"{{ Object o = System.getProperties().get({key}); "
                         f"System.getProperties().put({saved}, o == null ? Boolean.FALSE : o); "
                         f"System.setProperty({key}, {_java(env[name])}); }}")
            puts.append(f"{{ Object o = System.getProperties().remove({saved}); "
                           f"if (o instanceof String) System.setProperty({key}, (String) o); "
                           f"else System.clearProperty({key}); }}")
        return "\n".join(sets), "\n".join(puts)
    return None


# -- a context's start ----------------------------------------------------------------------

def start_code(language: str, cwd: str | None, env: dict[str, str]) -> str | None:
    """What a context's new kernel runs before its first execution: the change to its
    folder ``cwd`` (an error if it cannot), and for Java the session's variables as
    properties (other kernels have them in their environment); None when there is nothing."""
    parts = []
    if language == "java":
        parts += [f"System.setProperty({_java(k)}, {_java(v)});" for k, v in sorted(env.items())]
    if cwd is not None:
        parts.append(_cwd_code(language, cwd))
    return "\n".join(parts) or None


def _cwd_code(language: str, cwd: str) -> str:
    if language == "python":
        return f"__import__('os').chdir({_python(cwd)})"
    if language == "r":
        return f"invisible(setwd({_r(cwd)}))"
    if language == "javascript":
        return f"Deno.chdir({_javascript(cwd)})"
    if language == "bash":
        return f"cd -- {_bash(cwd)}"
    if language == "java":
        # As E2B's server does: the JVM cannot change its folder; user.dir names it.
        folder = f"new java.io.File({_java(cwd)})"
        return (f"{{ java.io.File d = {folder}.getAbsoluteFile().toPath().normalize().toFile(); "
                "if (!d.isDirectory()) "
                f"throw new IllegalArgumentException({_java('no such folder: ' + cwd)}); "
                'System.setProperty("user.dir", d.getPath()); }')
    raise InvalidRequest(f"a {language} context cannot be given a working folder")


FOLDER_CHECK = ('if [ ! -e "$1" ]; then echo missing; elif [ ! -d "$1" ]; then echo file; '
                'elif [ ! -x "$1" ]; then echo denied; fi')
"""A shell script that says why the folder ``$1`` cannot be a kernel's working folder (nothing
when it can)."""


def folder_refusal(cwd: str, said: str) -> str | None:
    """Why ``cwd`` cannot be a context's folder, from what :data:`FOLDER_CHECK` printed."""
    said = said.strip()
    if said == "missing":
        return (f"cwd {cwd!r} does not exist in the sandbox: create it first (the sandbox's "
                "system folders are read-only; the workspace, /home/user, and /tmp are writable)")
    if said == "file":
        return f"cwd {cwd!r} is not a folder"
    if said == "denied":
        return f"cwd {cwd!r} is not open to the sandbox's user (uid 1000)"
    return None
