"""Run one of E2B's own test suites, unmodified, against replgate, and print its totals.

Not part of the normal suite (CI cannot reach E2B's repositories): run it by hand from a
checkout of E2B's repository at a path you give it::

    .venv/bin/python tests/conformance/run_e2b_suite.py code-interpreter PATH/code-interpreter
    .venv/bin/python tests/conformance/run_e2b_suite.py sdk PATH/E2B

``code-interpreter`` is ``e2b-dev/code-interpreter``'s ``python/tests``; ``sdk`` is
``e2b-dev/E2B``'s ``packages/python-sdk/tests``. The suite runs serially (E2B's own
``pytest.ini`` asks pytest-xdist for two workers; its other options are kept) with the SDKs of
``.venv`` (the versions in ``uv.lock``; ``--sdk-python`` names another virtualenv's Python,
holding an older SDK release and pytest's plugins), pointed at replgate by the README's
three variables.
Without ``--url``, a gateway is started as a default install starts (``replgate serve``, no
profiles, a state folder of its own, its first API key) and stopped after; with ``--url`` and
``--api-key``, the suite runs against that gateway.

Prints one line per test file (passed, failed, skipped) and the totals; for ``sdk``, also
the tests that reach a server (they take a sandbox or a build: ``e2b_reaching.py``, loaded
into the suite's pytest as a plugin that only records), per area. Writes pytest's JUnit XML
beside its log in the run folder it names. Arguments after ``--`` replace the
default target (``tests``) in pytest's command line (``-- tests/sync -k contexts``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SUITES = {
    "code-interpreter": "python",
    "sdk": "packages/python-sdk",
}
"""Where each suite's pytest project lies in its repository."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_gateway(state_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port = _free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("REPLGATE_")}
    env["REPLGATE_STATE_DIR"] = str(state_dir)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
            env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the gateway exited: see {log_path}")
        try:
            health = httpx.get(f"{url}/healthz", timeout=1).json()
            if health.get("pool", {}).get("idle", 0) >= 1:
                return process, url, (state_dir / "api_key").read_text().strip()
        except (httpx.HTTPError, ValueError, FileNotFoundError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the gateway was not ready in 600 s: see {log_path}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _outcome(case: ET.Element) -> str:
    outcome = "passed"
    for child in case:
        if child.tag in ("failure", "error"):
            outcome = "failed"
        elif child.tag == "skipped":
            outcome = "skipped"
    return outcome


def _totals(junit: Path) -> tuple[dict[str, Counter[str]], Counter[str]]:
    by_file: dict[str, Counter[str]] = defaultdict(Counter)
    for case in ET.parse(junit).iter("testcase"):
        by_file[case.get("classname", "?")][_outcome(case)] += 1
    return by_file, sum(by_file.values(), Counter())


def _outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome by its pytest node id (``tests/x/test_y.py::[Class::]test_z``)."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome = _outcome(case)
        parts = case.get("classname", "").split(".")
        # The module's path ends at its test_ part; a class follows it.
        cut = max((i for i, part in enumerate(parts) if part.startswith("test_")),
                  default=len(parts) - 1) + 1
        node = "/".join(parts[:cut]) + ".py"
        found["::".join([node, *parts[cut:], case.get("name", "")])] = outcome
    return found


def _print_areas(collected: Path, junit: Path) -> None:
    """The tests that reach a server, per area, and the figure without the areas of other
    issues (templates, network) and E2B's host names."""
    sys.path.insert(0, str(Path(__file__).parent))
    from e2b_reaching import area, reaching

    outcomes = _outcomes(junit)
    by_area: dict[str, Counter[str]] = defaultdict(Counter)
    for test_id in reaching(collected.read_text().splitlines()):
        by_area[area(test_id)][outcomes.get(test_id, "not run")] += 1
    print("Tests that reach a server, by area:")
    for name in sorted(by_area):
        counts = by_area[name]
        print(f"  {name}: {counts['passed']} of {sum(counts.values())} passed")
    kept = [c for name, c in by_area.items() if name not in ("templates", "network", "host names")]
    every = sum(by_area.values(), Counter())
    outside = sum(kept, Counter())
    print(f"  all: {every['passed']} of {sum(every.values())}; without templates, network and "
          f"host names: {outside['passed']} of {sum(outside.values())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("checkout", type=Path, help="a checkout of the suite's repository")
    parser.add_argument("--url", help="a running gateway (default: start one)")
    parser.add_argument("--api-key", help="its API key (with --url)")
    parser.add_argument("--sdk-python", type=Path,
                        help="the Python of a virtualenv holding another SDK release and "
                             "pytest's plugins, to run the suite with (default: .venv's)")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_intermixed_args()  # options after the suite and its checkout too

    project = args.checkout / SUITES[args.suite]
    if not (project / "tests").is_dir():
        raise SystemExit(f"{project / 'tests'} is not there: give the repository's checkout")
    run_dir = Path(tempfile.mkdtemp(prefix=f"e2b-{args.suite}-"))
    gateway = None
    if args.url:
        if not args.api_key:
            raise SystemExit("--url needs --api-key")
        url, key = args.url.rstrip("/"), args.api_key
    else:
        gateway, url, key = _start_gateway(run_dir / "state", run_dir / "gateway.log")
    env = {key_: value for key_, value in os.environ.items()
           if not key_.startswith(("E2B_", "REPLGATE_"))}
    env.update(E2B_API_URL=f"{url}/e2b", E2B_SANDBOX_URL=f"{url}/e2b/sandbox", E2B_API_KEY=key)
    junit, collected = run_dir / "junit.xml", run_dir / "collected.jsonl"
    plugin: list[str] = []
    if args.suite == "sdk":  # which tests reach a server (tests/conformance/e2b_reaching.py)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).parent), *filter(None, [env.get("PYTHONPATH")])])
        env["RG_REACHING_OUT"] = str(collected)
        plugin = ["-p", "e2b_reaching"]
    try:
        with open(run_dir / "pytest.log", "wb") as log:
            # pytest's own script, not `python -m pytest`: that would put the checkout's
            # folder first on sys.path, and its SDK sources would stand in for the installed SDK.
            subprocess.run(
                [str((args.sdk_python or Path(sys.executable)).with_name("pytest")), "-o",
                 "addopts=--import-mode=importlib", "-p", "no:cacheprovider", "-q", "-rfE",
                 # an offline unit test importing what this SDK release lacks must not stop
                 # the others from running
                 "--continue-on-collection-errors", *plugin,
                 f"--junitxml={junit}", *(args.pytest_args or ["tests"])],
                cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    finally:
        if gateway is not None:
            _stop(gateway)
            shutil.rmtree(run_dir / "state", ignore_errors=True)
    if not junit.exists():
        raise SystemExit(f"pytest wrote no report: see {run_dir / 'pytest.log'}")
    by_file, total = _totals(junit)
    for name in sorted(by_file):
        counts = by_file[name]
        print(f"{name}: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped")
    print(f"E2B {args.suite} suite against {url}: {total['passed']} of {sum(total.values())} "
          f"passed, {total['failed']} failed, {total['skipped']} skipped "
          f"(log and JUnit XML in {run_dir})")
    if collected.exists():
        _print_areas(collected, junit)
    return 0 if total["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
