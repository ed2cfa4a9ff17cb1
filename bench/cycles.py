"""Pause/resume cycles on one session, and a chain of forks of forks, checked at every step
(issue 42, "Cycles"; the peers' failure class: a pause and resume that loses data from the
second cycle on).

    python -m bench --only cycles [--cycles 100] [--fork-chain 10]

A :class:`CycledSession` holds variables (random floats, a DataFrame of ints, strings, a
categorical and timestamps, a dict that grows), a file open for writing in the workspace,
workspace files written through the API, and, before a memory pause, a file open for writing
in ``/tmp``. Under the default ``REPLGATE_PAUSE_WITH=auto`` that file is what asks for a memory
pause (a variables snapshot would lose it); before a variables pause the session closes and
removes it, holding nothing a snapshot cannot keep. Every step compares what the session
reports (the variables' checksum, each open file's position, the ``/tmp`` file's bytes) with
what it reported before the pause, and every workspace file's bytes with what was written;
what the pause says it did not keep (``not_kept``: a memory image left on another node, a
``/tmp`` file under a variables pause) is expected back empty, as the API said. Anything else
raises :class:`CycleLost`. The tests (``tests/gateway/test_cycles.py``, and in cluster mode
``tests/node/test_cluster_bundles.py``) and the bench figure run the same checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench._measure import pct
from bench._peers import Replgate

SCRATCH = "/tmp/scratch.bin"
"""The file a memory cycle holds open in ``/tmp`` (which only a memory pause keeps)."""
HELD = "held/open.bin"
"""The workspace file the session holds open for writing across every pause."""
ROTATING = 3
"""Workspace files rewritten through the API, one per cycle in turn."""
EMPTY_SHA = hashlib.sha256(b"").hexdigest()

SETUP = f"""
import hashlib, json, os
import numpy as np, pandas as pd
rng = np.random.default_rng(42)
floats = rng.random(200_000)
frame = pd.DataFrame({{
    "n": rng.integers(0, 10**6, 20_000),
    "s": [f"row {{i}}" for i in range(20_000)],
    "c": pd.Categorical(rng.choice(["a", "b", "c"], 20_000)),
    "t": pd.date_range("2026-01-01", periods=20_000, freq="min"),
}})
state = {{"cycle": -1, "seen": []}}
def checksum():
    h = hashlib.sha256(floats.tobytes())
    h.update(pd.util.hash_pandas_object(frame).to_numpy().tobytes())
    h.update(repr(state).encode())
    return h.hexdigest()
def block(i):
    return hashlib.sha256(str(i).encode()).digest() * 64
def report():
    out = {{"sum": checksum(), "held": [held.closed, None if held.closed else held.tell()]}}
    if scratch is not None:
        data = open(scratch.name, "rb").read() if os.path.exists(scratch.name) else None
        out["scratch"] = [scratch.closed, None if scratch.closed else scratch.tell(),
                          None if data is None else hashlib.sha256(data).hexdigest()]
    return out
os.makedirs("{os.path.dirname(HELD)}", exist_ok=True)
held = open("{HELD}", "w+b")
scratch = None
print(json.dumps(report()))
"""

STEP = """
before = report()
state["cycle"] = {i}
state["seen"].append({i})
floats[{i} % floats.size] += 1.0
frame.iloc[{i} % len(frame), 0] += 1
held.write(block({i}))
held.flush()
if {memory}:
    if scratch is None:
        scratch = open("{scratch}", "wb")
    scratch.write(block({i}))
    scratch.flush()
elif scratch is not None:
    scratch.close()
    os.remove(scratch.name)
    scratch = None
print(json.dumps({{"before": before, "after": report()}}))
"""


class CycleLost(AssertionError):
    """A cycle (or a fork) lost or changed something it should have kept."""


def _block(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 64


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Cycle:
    """One pause and resume: which pause it was, how long each took, where it resumed."""

    index: int
    paused_with: str
    pause_s: float
    resume_s: float
    node: str | None = None
    not_kept: list[str] = field(default_factory=list)


@dataclass
class CycledSession:
    """A session of ``http``'s gateway and what it must hold (see the module's docstring)."""

    http: httpx.AsyncClient
    sid: str
    files: dict[str, bytes] = field(default_factory=dict)
    """Every workspace file's expected bytes, by path (the held file's among them)."""
    last: dict[str, Any] = field(default_factory=dict)
    """What the session reported at its last step."""
    scratch: bytes | None = None
    """The ``/tmp`` file's expected bytes while the session holds it open."""
    cycles: list[Cycle] = field(default_factory=list)

    async def execute(self, code: str) -> dict[str, Any]:
        answer = await self.http.post(f"/v1/sessions/{self.sid}/execute", json={"code": code})
        if answer.status_code != 200:
            raise CycleLost(f"session {self.sid}: execute answered {answer.status_code}: "
                            f"{answer.text}")
        result: dict[str, Any] = answer.json()
        if result["status"] != "ok" or result.get("restarted"):
            raise CycleLost(f"session {self.sid}: {result}")
        return result

    async def setup(self) -> None:
        """The variables, the held file and the workspace files."""
        for path, data in {"data/big.bin": os.urandom(2 << 20),
                           "data/nested/deep/small.txt": b"kept\n"}.items():
            await self.put(path, data)
        reported = json.loads((await self.execute(SETUP))["stdout"])
        self.files[HELD] = b""
        self.last = reported

    async def put(self, path: str, data: bytes) -> None:
        answer = await self.http.put(f"/v1/sessions/{self.sid}/files/{path}", content=data)
        if answer.status_code not in (200, 201):
            raise CycleLost(f"PUT {path}: {answer.status_code} {answer.text}")
        self.files[path] = data

    async def step(self, i: int, memory: bool) -> None:
        """Check that the session reports what it did at its last step, then change it: the
        variables, the held file, a workspace file, and the ``/tmp`` file held (``memory``)
        or dropped."""
        result = await self.execute(STEP.format(i=i, memory=memory, scratch=SCRATCH))
        reported = json.loads(result["stdout"])
        if reported["before"] != self.last:
            raise CycleLost(f"session {self.sid}, step {i}: it reports {reported['before']}, "
                            f"it held {self.last}")
        self.last = reported["after"]
        self.files[HELD] += _block(i)
        self.scratch = ((self.scratch or b"") + _block(i)) if memory else None
        expected = {"held": [False, len(self.files[HELD])]}
        if self.scratch is not None:
            expected["scratch"] = [False, len(self.scratch), _sha(self.scratch)]
        for key, value in expected.items():
            if self.last.get(key) != value:
                raise CycleLost(f"session {self.sid}, step {i}: {key} is {self.last.get(key)}, "
                                f"not {value}")
        await self.put(f"cycle/{i % ROTATING}.bin", os.urandom(64 << 10))

    def lost_scratch(self) -> None:
        """The pause said it did not keep the ``/tmp`` file: the file object comes back open
        on an empty file (the snapshot reopens it at its path, its position past the end)."""
        if self.scratch is not None and "scratch" in self.last:
            self.scratch = b""
            self.last["scratch"] = [False, 0, EMPTY_SHA]

    async def check_files(self) -> None:
        """Every workspace file's bytes as written, and no other file."""
        for path, data in self.files.items():
            answer = await self.http.get(f"/v1/sessions/{self.sid}/files/{path}")
            if answer.status_code != 200:
                raise CycleLost(f"session {self.sid}: {path} answered {answer.status_code}: "
                                f"{answer.text}")
            if answer.content != data:
                raise CycleLost(f"session {self.sid}: {path} holds "
                                f"{len(answer.content)} bytes, sha256 "
                                f"{_sha(answer.content)[:12]}, not {len(data)} bytes, "
                                f"{_sha(data)[:12]}")

    async def check(self) -> None:
        """What the session holds now is what it held at its last step (no change)."""
        reported = json.loads((await self.execute("print(json.dumps(report()))"))["stdout"])
        if reported != self.last:
            raise CycleLost(f"session {self.sid}: it reports {reported}, it held {self.last}")
        await self.check_files()

    async def cycle(self, i: int, memory: bool,
                    move: Callable[[CycledSession], Awaitable[None]] | None = None) -> Cycle:
        """One step (holding the ``/tmp`` file when ``memory``), a pause, ``move`` (while
        paused: say, drain its node so that it resumes on another), the files read while
        paused, a resume and the checks."""
        await self.step(i, memory)
        started = time.perf_counter()
        answer = await self.http.post(f"/v1/sessions/{self.sid}/pause")
        pause_s = time.perf_counter() - started
        if answer.status_code != 200:
            raise CycleLost(f"session {self.sid}: pause {i}: {answer.status_code} {answer.text}")
        paused = answer.json()
        if move is not None:
            await move(self)
            paused = (await self.http.get(f"/v1/sessions/{self.sid}")).json()
        await self.check_files()  # read while paused: its workspace, lent read-only
        not_kept = sorted(paused.get("not_kept") or {})
        if SCRATCH in not_kept:
            self.lost_scratch()
        started = time.perf_counter()
        answer = await self.http.post(f"/v1/sessions/{self.sid}/resume")
        resume_s = time.perf_counter() - started
        if answer.status_code != 200:
            raise CycleLost(f"session {self.sid}: resume {i}: {answer.status_code} "
                            f"{answer.text}")
        done = Cycle(i, paused["paused_with"], pause_s, resume_s, answer.json().get("node"),
                     not_kept)
        await self.check()
        self.cycles.append(done)
        return done

    async def fork(self) -> CycledSession:
        """A fork of this session, checked: the same variables and files (a fork keeps the
        variables: a ``/tmp`` file comes back empty), then changed by a step, this session
        unchanged by it."""
        answer = await self.http.post(f"/v1/sessions/{self.sid}/fork", json={"count": 1})
        if answer.status_code != 201:
            raise CycleLost(f"fork of {self.sid}: {answer.status_code} {answer.text}")
        child = CycledSession(self.http, answer.json()[0]["id"], files=dict(self.files),
                              last=json.loads(json.dumps(self.last)), scratch=self.scratch)
        child.lost_scratch()
        return child


async def fork_chain(root: CycledSession, length: int, first: int,
                     delete: Callable[[str], Awaitable[object]]) -> list[float]:
    """``length`` forks, each of the one before (the first of ``root``), each checked against
    its parent, changed (step ``first + k``), and its parent checked unchanged afterwards;
    each parent but ``root`` is deleted once its child is checked. The seconds of each fork
    request and its copy's first step."""
    times: list[float] = []
    parent = root
    for k in range(length):
        started = time.perf_counter()
        child = await parent.fork()
        await child.step(first + k, memory=False)
        times.append(time.perf_counter() - started)
        await child.check_files()
        await parent.check()
        if parent is not root:
            await delete(parent.sid)
        parent = child
    await delete(parent.sid)
    return times


def slope_growth(values: list[float]) -> tuple[float, float]:
    """The trend of ``values`` taken in order: (the Theil-Sen line's value at the last one
    over its value at the first, its slope per step).

    The median of every pairwise slope, not the medians of a few at each end: a chain of 10
    forks gave its last 3 against its first 3 as 1.38 and 0.75 in two runs of the same code
    (a fork whose kernel the warm pool was still refilling took twice the others, and one of
    3 moves a median), while a chain of 30 showed no trend (0.3 ms a fork). The line shrugs
    off up to 29% of the values far from it, and it is fitted to every value: one slow fork
    no longer decides the figure, and a chain that grows fork by fork still shows it whole.
    """
    if len(values) < 2:
        return 1.0, 0.0
    slope = statistics.median((values[j] - values[i]) / (j - i)
                              for i in range(len(values)) for j in range(i + 1, len(values)))
    start = statistics.median(value - slope * k for k, value in enumerate(values))
    end = start + slope * (len(values) - 1)
    return (round(end / start, 2) if start > 0 else 1.0), slope


def summarise(cycles: list[Cycle], fork_s: list[float]) -> dict[str, Any]:
    """p50 and p99 of pause and resume by what each pause kept, and the growth: the median of
    the last 10 of each against the first 10's (of fewer, halves; 1.0 when nothing grows);
    the fork chain's, from its trend over every fork (:func:`slope_growth`: a chain is 10
    forks, too few for medians of each end)."""
    out: dict[str, Any] = {"cycles": len(cycles)}
    for mode in sorted({c.paused_with for c in cycles}):
        mine = [c for c in cycles if c.paused_with == mode]
        for what in ("pause", "resume"):
            values = [getattr(c, f"{what}_s") * 1000 for c in mine]
            window = min(10, max(1, len(values) // 2))
            out[f"{mode}_{what}"] = {
                "p50": round(pct(values, 0.5), 1), "p99": round(pct(values, 0.99), 1),
                "n": len(values),
                "growth": round(statistics.median(values[-window:])
                                / statistics.median(values[:window]), 2)}
    if fork_s:
        growth, slope = slope_growth(fork_s)
        out["fork_chain"] = {"forks": len(fork_s), "ms": [round(s * 1000) for s in fork_s],
                             "p50": round(pct([s * 1000 for s in fork_s], 0.5), 1),
                             "growth": growth, "ms_per_fork": round(slope * 1000, 1)}
    return out


async def cycles(count: int, chain: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The figure: ``count`` cycles on one session of a gateway of its own (default settings:
    ``auto`` pauses), then a chain of ``chain`` forks of forks; :func:`summarise`'s figures,
    and ``lost``: the first thing a cycle lost or changed, or None."""
    rg = Replgate(min_idle=1, max_kernels=8)
    session: CycledSession | None = None
    forks: list[float] = []
    lost = None
    try:
        await rg.wait_template()
        await rg.wait_idle(1)
        session = CycledSession(rg.http, await rg.create_session())
        await session.setup()
        for i in range(count):
            done = await session.cycle(i, memory=i % 2 == 1)
            if i % 10 == 9:
                log(f"cycle {i + 1}: {done.paused_with} pause {done.pause_s * 1000:.0f} ms, "
                    f"resume {done.resume_s * 1000:.0f} ms")
        await session.step(count, memory=False)
        forks = await fork_chain(session, chain, count + 1, rg.delete_session)
    except CycleLost as exc:
        lost = str(exc)
        log(f"LOST: {lost}")
    finally:
        await rg.stop()
    out = summarise(session.cycles if session else [], forks)
    out["lost"] = lost
    return out


GROWTH_NOISE = 0.3
"""How far above 1.0 the last cycles' median may stand from the first's on this machine (below
it is no growth: the machine got quieter during the run)."""


def cycle_targets(results: dict[str, Any]) -> list[tuple[str, float | None, str, bool | None]]:
    """(target, value, goal, met) of the cycles figure, if it ran: nothing lost, and each
    median of the last cycles against the first's no more than the noise over 1.0."""
    figure = results.get("cycles")
    if not isinstance(figure, dict) or "cycles" not in figure:
        return []
    out: list[tuple[str, float | None, str, bool | None]] = [
        (f"cycles: {figure['cycles']} pause/resume cycles, nothing lost",
         float(figure["cycles"]), "every cycle", figure.get("lost") is None)]
    for key, value in figure.items():
        if isinstance(value, dict) and "growth" in value:
            growth = value["growth"]
            out.append((f"cycles: {key.replace('_', ' ')}, growth (last / first medians)", growth,
                        f"1.0 (<= {1 + GROWTH_NOISE:g})", growth <= 1 + GROWTH_NOISE))
    return out
