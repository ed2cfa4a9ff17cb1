"""Drives one release of E2B's Python SDKs, unmodified, with their defaults, against replgate.

Run by ``test_sdk_releases.py`` with the Python of a virtualenv holding that release (its
requirements file beside this one) and E2B's three environment variables set, or, for a release
before 2.7, ``E2B_DOMAIN`` naming the domain whose host names the gateway answers: nothing else
points the SDK here. ``python drive.py core`` uses ``e2b``'s ``Sandbox``; with ``interpreter``
too, ``e2b_code_interpreter``'s; with ``killed``, a sandbox killed while a command runs. Prints
one JSON object of what each step saw; a step that raises ends the run with the traceback on
stderr.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from e2b import Sandbox

seen: dict[str, object] = {"e2b": version("e2b")}
sandboxes = [Sandbox.create()]  # the SDK's defaults: template "base", its timeout and flags
core = sandboxes[0]
seen["command"] = core.commands.run("echo ok").stdout
core.files.write("/home/user/a.txt", "written")
seen["file"] = core.files.read("/home/user/a.txt")
seen["running"] = core.is_running()

if "interpreter" in sys.argv[1:]:
    from e2b_code_interpreter import Sandbox as Interpreter

    seen["e2b-code-interpreter"] = version("e2b-code-interpreter")
    interpreter = Interpreter.create()
    sandboxes.append(interpreter)
    interpreter.run_code("x = 41")
    seen["run_code"] = interpreter.run_code("x + 1").text

if "killed" in sys.argv[1:]:  # a sandbox killed while a command runs: how the wait ends
    doomed = Sandbox.create()
    running = doomed.commands.run("sleep 60", background=True)
    doomed.kill()
    try:
        running.wait()
        seen["killed_mid_command"] = "returned"
    except Exception as exc:
        seen["killed_mid_command"] = f"{type(exc).__name__}: {exc}"

ids = {s.sandbox_id for s in sandboxes}
seen["listed"] = ids <= {s.sandbox_id for s in Sandbox.list().next_items()}
for sandbox in sandboxes:
    sandbox.kill()
seen["running_after_kill"] = any(s.is_running() for s in sandboxes)
print(json.dumps(seen))
