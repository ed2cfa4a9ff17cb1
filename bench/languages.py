"""What other languages cost in a running session: R, JavaScript (Deno), Java and bash beside
Python.

    python -m bench.languages [--sessions 5] [--repeat 30] [--image slim]

On the default image (or the slim one: Python and bash), through kernel_pool in this process,
it measures:

- the first execution in each language in a session that already runs Python (that
  language's kernel starting in the sandbox), p50 and worst over ``--sessions`` sessions;
- a later ``1+1`` in each language against Python's, p50 and p95 over ``--repeat`` rounds with
  the languages interleaved;
- memory per idle context: each kernel's processes' resident memory (read in the sandbox's
  ``/proc``), and how much the sandbox's cgroup grew when it started (what the session's
  memory limit counts), beside Python's kernel.

The targets of issue 28 (first execution p50 <= 1.5 s for R and JavaScript, <= 0.5 s for
bash; a later ``1+1`` <= 2x Python's p50) are printed beside the figures (Java has none);
nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import docker

from kernel_pool import KernelPool, PoolSettings, Profile, Session
from kernel_pool._languages import offered
from kernel_pool.backends.docker import build_image

ONE_PLUS_ONE = {"python": "1+1", "r": "1+1", "javascript": "1+1", "bash": "echo $((1+1))",
                "java": "1+1"}
FIRST_TARGET_S = {"r": 1.5, "javascript": 1.5, "bash": 0.5}

PROCESSES = """
import json, os
found = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        with open(f'/proc/{pid}/status') as f:
            fields = dict(line.split(':', 1) for line in f if ':' in line)
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            command = f.read().replace(b'\\0', b' ').decode(errors='replace')
    except OSError:
        continue
    rss = int(fields.get('VmRSS', '0 kB').split()[0]) * 1024
    found[int(pid)] = {'ppid': int(fields['PPid']), 'rss': rss, 'command': command}
print(json.dumps(found))
"""
"""Every process of the sandbox: parent, resident bytes, command line."""

ROOTS = {"python": "-m replgate_kernel --", "bash": "-m replgate_kernel.bash",
         "r": "replgate_kernel/irkernel.R", "javascript": "deno jupyter", "java": "jjava.jar"}
"""How each language's kernel process reads in a command line (init.py's KERNELS; a relay's
holds its kernel's too)."""
LANGUAGES: tuple[str, ...] = ()
"""The languages measured beside Python: those the image offers (``main`` sets them)."""


def timed_ms(spent: list[float], share: float) -> float:
    ordered = sorted(spent)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000


async def run_ok(session: Session, code: str, language: str) -> float:
    """Seconds from submission to result, the execution required to be ok."""
    started = time.perf_counter()
    result = await session.submit(code, language=None if language == "python" else language
                                  ).result()
    took = time.perf_counter() - started
    assert result.status == "ok", (language, result.status, result.reason, result.error)
    return took


async def first_executions(pool: KernelPool, sessions: int) -> dict[str, list[float]]:
    spent: dict[str, list[float]] = {language: [] for language in LANGUAGES}
    for number in range(sessions):
        session = await pool.create_session()
        try:
            await run_ok(session, "1+1", "python")
            # A different first language each time: none always meets a sandbox at rest.
            turn = number % len(LANGUAGES)
            order = LANGUAGES[turn:] + LANGUAGES[:turn]
            for language in order:
                spent[language].append(await run_ok(session, ONE_PLUS_ONE[language], language))
        finally:
            await pool.delete_session(session.id)
    return spent


async def later_executions(session: Session, repeat: int) -> dict[str, list[float]]:
    spent: dict[str, list[float]] = {language: [] for language in ("python", *LANGUAGES)}
    for language in spent:  # started, and one more each: no first-run costs below
        await run_ok(session, ONE_PLUS_ONE[language], language)
    for _ in range(repeat):
        for language in spent:
            spent[language].append(await run_ok(session, ONE_PLUS_ONE[language], language))
    return spent


def tree_rss(processes: dict[str, dict[str, object]], marker: str) -> int:
    """Resident bytes of the process whose command holds ``marker`` (and whose parent's does
    not: a relay's child) and its descendants."""
    table = {int(pid): info for pid, info in processes.items()}
    held = {pid for pid, info in table.items() if marker in str(info["command"])}
    roots = [pid for pid in held if int(str(table[pid]["ppid"])) not in held]
    total, todo = 0, list(roots)
    while todo:
        pid = todo.pop()
        total += int(str(table[pid]["rss"]))
        todo.extend(child for child, info in table.items() if info["ppid"] == pid)
    return total


async def memory(pool: KernelPool) -> tuple[dict[str, int], dict[str, int]]:
    """Each kernel's resident bytes, and the cgroup's growth as each context started."""
    session = await pool.create_session()
    try:
        await run_ok(session, "1+1", "python")
        await asyncio.sleep(2)
        grown: dict[str, int] = {"python": (await session.usage()).memory_bytes}
        for language in LANGUAGES:
            before = (await session.usage()).memory_bytes
            await run_ok(session, ONE_PLUS_ONE[language], language)
            await asyncio.sleep(2)  # idle: its start's transient allocations settled
            grown[language] = (await session.usage()).memory_bytes - before
        listing = await session.execute(PROCESSES)
        assert listing.status == "ok", listing.error
        processes = json.loads(listing.stdout)
        rss = {language: tree_rss(processes, ROOTS[language])
               for language in ("python", *LANGUAGES)}
    finally:
        await pool.delete_session(session.id)
    return rss, grown


async def main(sessions: int, repeat: int, image: str) -> None:
    global LANGUAGES
    state = Path(tempfile.mkdtemp(prefix="rg-bench-", dir="/tmp"))
    client = docker.from_env()
    built = await asyncio.to_thread(build_image, client, state_dir=state / "images",
                                    slim=image == "slim", log=lambda _: None)
    LANGUAGES = tuple(language for language in offered(client.images.get(built.tag).labels)
                      if language in ONE_PLUS_ONE and language != "python")
    client.close()
    profile = Profile(name="default", image=image, memory="2g", min_idle=1,
                      default_timeout_s=120, max_timeout_s=120)
    pool = KernelPool(PoolSettings(state_dir=state, profiles={"default": profile},
                                   owner=f"bench-{secrets.token_hex(4)}"))
    await pool.start()
    try:
        first = await first_executions(pool, sessions)
        session = await pool.create_session()
        try:
            later = await later_executions(session, repeat)
        finally:
            await pool.delete_session(session.id)
        rss, grown = await memory(pool)
    finally:
        await pool.close()
        shutil.rmtree(state, ignore_errors=True)
    print(f"first execution in a language, in a running session ({sessions} sessions):")
    for language in LANGUAGES:
        p50, worst = statistics.median(first[language]), max(first[language])
        target = FIRST_TARGET_S.get(language)
        print(f"  {language:<10} p50 {p50 * 1000:7.0f} ms   worst {worst * 1000:7.0f} ms   "
              + (f"(target p50 <= {target * 1000:.0f} ms)" if target else "(no target)"))
    python_p50 = timed_ms(later["python"], 0.5)
    print(f"a later 1+1 ({repeat} rounds, languages interleaved):")
    for language, spent in later.items():
        p50, p95 = timed_ms(spent, 0.5), timed_ms(spent, 0.95)
        print(f"  {language:<10} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   "
              f"{p50 / python_p50:5.1f}x Python's p50 (target <= 2x)")
    print("memory of an idle context (its kernel's processes' RSS; the sandbox's cgroup growth "
          "when it started, page cache included):")
    for language in ("python", *LANGUAGES):
        growth = ("(the sandbox with Python alone)" if language == "python"
                  else f"cgroup +{grown[language] / 2**20:6.1f} MiB")
        print(f"  {language:<10} RSS {rss[language] / 2**20:6.1f} MiB   {growth}"
              + (f" {grown['python'] / 2**20:.1f} MiB" if language == "python" else ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--image", choices=("default", "slim"), default="default")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.sessions, arguments.repeat, arguments.image))
