"""E2B's builder steps as a Dockerfile for replgate's template build (``gateway.templates``).

E2B's SDK sends no Dockerfile: its builder (``Template().from_image(...).run_cmd(...)``, and
``from_dockerfile``, which the SDK parses into steps itself) sends a base and steps. Each step
becomes one or more Dockerfile lines, and :class:`Translation` remembers which step each line is,
so a failed line is answered as E2B's failed step (``base``, the step's 1-based index, or
``finalize``: what replgate adds after the steps to make the image a sandbox).

Mapped so:

    RUN cmd [user]        RUN ["/bin/bash", "-c", cmd] (as ``user`` for that step only)
    COPY src dest [user]  COPY [--chown=user] ["e2b/<filesHash>/src", "dest"]: the files the
                          SDK uploaded for that hash (:mod:`._templates_files`), in the context;
                          a glob's matches are laid out in the context under ``e2b/s<step>/``,
                          copied as a folder, so that a symbolic link among them is copied as
                          the link (the engine's builder follows the links a glob matches, and
                          fails on one that leads out of the context, as E2B's may)
    ENV k v ...           ENV k="v" ...
    WORKDIR path          WORKDIR path
    USER name             USER name

E2B's user ``user`` is the sandbox's own user here (uid 1000). A step asked to run again
(``skip_cache()`` before it) is preceded by a ``LABEL`` naming the build, so that the engine's
layer cache misses from there on.
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gateway.e2b._errors import E2BError, unsupported
from gateway.e2b._templates_models import BuildStart, Step

BASE_STEP = "base"
FINALIZE_STEP = "finalize"
SANDBOX_USER = "1000:1000"
"""E2B's ``user``: the user code runs as in a sandbox (replgate's ``sandbox``, uid 1000)."""
CONTEXT_DIR = "e2b"
"""Where the uploaded files of each hash are in the build's context: ``e2b/<hash>/...``."""
_GLOB = re.compile(r"[*?\[]")


@dataclass
class Translation:
    """A Dockerfile, the E2B step of each of its lines, and what its COPYs read: (the folder
    of the context, the files hash, the glob of a glob's copy or None)."""

    lines: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    copies: list[tuple[str, str, str | None]] = field(default_factory=list)

    @property
    def hashes(self) -> list[str]:
        return list(dict.fromkeys(files_hash for _, files_hash, _ in self.copies))

    @property
    def dockerfile(self) -> str:
        return "\n".join(self.lines) + "\n"

    def add(self, step: str, line: str) -> None:
        self.lines.append(line)
        self.steps.append(step)

    def step_of(self, line: int | None) -> str:
        """E2B's step of a failed 1-based line; past the steps (or none): ``finalize``."""
        if line is None or not 1 <= line <= len(self.steps):
            return FINALIZE_STEP
        return self.steps[line - 1]


def _one_line(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        raise E2BError(400, f"{what} must be one line: {value!r}")
    return value


def _user(name: str) -> str:
    return SANDBOX_USER if name == "user" else _one_line(name, "a user")


def _env_value(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{_one_line(escaped, "an environment value")}"'


def _relative(src: str) -> str:
    path = PurePosixPath(src)
    if path.is_absolute() or ".." in path.parts:
        raise E2BError(400, f"a copy's source must be relative and inside the context: {src!r}")
    return str(path)


Links = dict[str, list[tuple[str, str]]]
"""Per files hash, the symbolic links of its archive that lead out of it: (name, target)."""


def _as(out: Translation, step: str, user: str | None, current: str, line: str) -> None:
    """``line`` as ``user`` (the build's current user after it)."""
    if user is not None and user != current:
        out.add(step, f"USER {user}")
    out.add(step, line)
    if user is not None and user != current:
        out.add(step, f"USER {current}")


def translate(start: BuildStart, base_image: str, base_user: str, build_id: str,
              links: Links | None = None) -> Translation:
    """The Dockerfile of ``start``'s steps on ``base_image`` (whose configured user is
    ``base_user``); ``build_id`` is written into the cache-busting label of a forced step.
    ``links`` (:func:`outward_links`) are made by a RUN after their copy: the context cannot
    hold them (the build refuses a context whose links lead out of it), E2B copies them."""
    out = Translation()
    out.add(BASE_STEP, f"FROM {_one_line(base_image, 'an image name')}")
    current = base_user or "root"
    forced = False
    for index, step in enumerate(start.steps, start=1):
        name = str(index)
        if step.force and not forced:
            forced = True
            out.add(name, f"LABEL replgate.e2b.force={json.dumps(build_id)}")
        kind = step.type.upper()
        args = step.args
        if kind == "RUN" and args:
            user = _user(args[1]) if len(args) > 1 and args[1] else None
            _as(out, name, user, current, "RUN " + json.dumps(["/bin/bash", "-c", args[0]]))
        elif kind == "COPY" and len(args) >= 2:
            out.add(name, _copy(index, step, current, out))
            for path, target in _links_of(step, (links or {}).get(step.files_hash or "", [])):
                _as(out, name, "root", current, "RUN " + json.dumps([
                    "/bin/sh", "-c", 'mkdir -p "$(dirname "$1")" && ln -sfn "$0" "$1"',
                    target, path]))
        elif kind == "ENV" and args and len(args) % 2 == 0:
            pairs = (f"{_one_line(k, 'a variable name')}={_env_value(v)}"
                     for k, v in zip(args[::2], args[1::2], strict=True))
            out.add(name, "ENV " + " ".join(pairs))
        elif kind == "WORKDIR" and len(args) == 1:
            out.add(name, f"WORKDIR {_one_line(args[0], 'a workdir')}")
        elif kind == "USER" and len(args) == 1:
            current = _user(args[0])
            out.add(name, f"USER {current}")
        else:
            raise E2BError(400, f"step {index} ({step.type} {args!r}) is not a builder step "
                                "replgate knows (COPY, ENV, RUN, WORKDIR, USER)")
    return out


def _copy(index: int, step: Step, current: str, out: Translation) -> str:
    """The COPY line of a step; its files are owned by its user, else the build's current
    user (root's own stay root's, as the engine makes them)."""
    src, dest, *rest = step.args
    user = rest[0] if rest else ""
    mode = rest[1] if len(rest) > 1 else ""
    if mode:
        raise unsupported("a copy's mode", "the engine's builder here cannot set it: chmod in "
                                           "a run_cmd after the copy")
    if step.files_hash is None or not re.fullmatch(r"[0-9a-f]{64}", step.files_hash):
        raise E2BError(400, f"the copy of {src!r} names no files hash (filesHash)")
    src = _relative(src)
    if _GLOB.search(src):
        folder = f"s{index}"
        out.copies.append((folder, step.files_hash, src))
        source = f"{CONTEXT_DIR}/{folder}/"
        dest = dest if dest.endswith("/") else dest + "/"  # several files: into a folder
    else:
        out.copies.append((step.files_hash, step.files_hash, None))
        source = f"{CONTEXT_DIR}/{step.files_hash}/{src}"
    owner = _user(user) if user else current
    chown = f"--chown={owner} " if owner not in ("root", "0", "0:0") else ""
    return f"COPY {chown}" + json.dumps([source, _one_line(dest, "a destination")])


def _links_of(step: Step, links: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Where each of ``links`` lands in the image by the copy ``step``: (path, target)."""
    src, dest = _relative(step.args[0]), step.args[1]
    landed = []
    for name, target in links:
        if _GLOB.search(src):
            below = _matched(PurePosixPath(name), PurePosixPath(src))
            if below is not None:
                landed.append((f"{dest.rstrip('/')}/{below}", target))
        elif name == src:
            base = PurePosixPath(name).name
            landed.append((f"{dest}{base}" if dest.endswith("/") else dest, target))
        elif name.startswith(src + "/"):
            landed.append((f"{dest.rstrip('/')}/{name.removeprefix(src + '/')}", target))
    return landed


def _outward(member: tarfile.TarInfo) -> bool:
    """Whether a symbolic link leads out of its archive (absolute, or up past its top)."""
    if not member.issym():
        return False
    target = PurePosixPath(member.linkname)
    if target.is_absolute():
        return True
    depth = len(PurePosixPath(member.name).parts) - 1
    for part in target.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def outward_links(hashes: Iterable[str], path_of: Callable[[str], Path]) -> Links:
    """The links of each uploaded archive that lead out of it (run in a thread)."""
    found: Links = {}
    for files_hash in hashes:
        with tarfile.open(path_of(files_hash), mode="r:*") as part:
            found[files_hash] = [(m.name, m.linkname) for m in part.getmembers()
                                 if _outward(m)]
    return found


def _matched(name: PurePosixPath, glob: PurePosixPath) -> PurePosixPath | None:
    """The part of ``name`` below what ``glob`` matched (``.`` for the match itself), or None
    when it is not a match nor below one (``*`` does not cross ``/``, as in a Dockerfile)."""
    depth = len(glob.parts)
    if len(name.parts) < depth or not all(
            fnmatch.fnmatchcase(part, pattern)
            for part, pattern in zip(name.parts[:depth], glob.parts, strict=False)):
        return None
    return PurePosixPath(name.parts[depth - 1], *name.parts[depth:])


def context(copies: Iterable[tuple[str, str, str | None]],
            path_of: Callable[[str], Path]) -> bytes:
    """One tar of the uploaded archives (each a tar, gzipped or not) the ``copies`` of a
    :class:`Translation` read, each under ``e2b/<folder>/`` (a glob's: its matches only, at
    the folder's top). Members that would leave their folder are refused (run in a thread)."""
    buffer = io.BytesIO()
    done: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w") as whole:
        for folder, files_hash, glob in copies:
            if folder in done:
                continue
            done.add(folder)
            with tarfile.open(path_of(files_hash), mode="r:*") as part:
                for member in part.getmembers():
                    name = PurePosixPath(member.name)
                    if name.is_absolute() or ".." in name.parts:
                        raise E2BError(400, f"the upload {files_hash} holds {member.name!r}, "
                                            "outside its folder")
                    if _outward(member):
                        continue  # made by a RUN after its copy (translate)
                    if member.islnk():
                        raise E2BError(400, f"the upload {files_hash} holds a hard link "
                                            f"({member.name!r}): not accepted")
                    if glob is not None:
                        below = _matched(name, PurePosixPath(glob))
                        if below is None:
                            continue
                        name = below
                    data = part.extractfile(member) if member.isfile() else None
                    member.name = f"{CONTEXT_DIR}/{folder}/{name}"
                    whole.addfile(member, data)
    return buffer.getvalue()
