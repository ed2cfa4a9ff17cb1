"""No silent loss: huge rich outputs are capped in the kernel, and a broken output channel is
noticed, reported and re-established, on a real kernel in a real container."""

from __future__ import annotations

import asyncio

from kp_support import run_ok

from kernel_pool import Session
from kernel_pool.events import Execution

NOISE_PNG = """
import io, numpy as np
from PIL import Image
from IPython.display import Image as Shown, display
def noise_png(side):
    pixels = np.random.default_rng(7).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=0)
    return buffer.getvalue()
"""

FORGED_70MIB = """
kernel = get_ipython().kernel
kernel.session.send(kernel.iopub_socket, "stream",
                    {"name": "stdout", "text": "x" * (70 * 2**20)}, parent=kernel.get_parent())
print("after the forged message")
"""


async def assert_next_print_whole(session: Session) -> None:
    after = await session.execute("print('next', 'line', flush=True)\nprint(len(kept))")
    assert after.status == "ok", after.reason
    assert after.stdout == "next line\n3\n"
    assert not after.restarted


def assert_omitted(result: Execution, count: int, at_least: int) -> None:
    assert result.status == "ok", (result.reason, result.error)
    assert result.truncated
    assert len(result.outputs) == count
    for output in result.outputs:
        assert output.omitted is not None and output.omitted["image/png"] >= at_least
        assert list(output.data) == ["text/plain"]
        assert "omitted" in output.data["text/plain"]


async def test_display_of_48mib_png_is_omitted_and_session_keeps_working(
        session: Session) -> None:
    await run_ok(session, NOISE_PNG + "kept = [1, 2, 3]")
    result = await session.execute(
        "png = noise_png(4096)\nprint('before', len(png) > 48 * 2**20)\n"
        "display(Shown(data=png))\nprint('after')", timeout_s=110)
    assert_omitted(result, 1, 64 * 2**20)
    assert result.stdout == "before True\nafter\n"
    await assert_next_print_whole(session)


async def test_six_12mib_images_in_one_cell_are_omitted_and_session_keeps_working(
        session: Session) -> None:
    await run_ok(session, NOISE_PNG + "kept = [1, 2, 3]")
    result = await session.execute(
        "png = noise_png(2048)\nfor i in range(6):\n    display(Shown(data=png))\n"
        "    print('shown', i)", timeout_s=110)
    assert_omitted(result, 6, 16 * 2**20)
    assert result.stdout == "".join(f"shown {i}\n" for i in range(6))
    await assert_next_print_whole(session)


async def test_forged_oversize_message_is_reported_and_channel_recovers(
        session: Session) -> None:
    await run_ok(session, "kept = [1, 2, 3]")
    result = await session.execute(FORGED_70MIB, timeout_s=110)
    assert result.status != "ok"
    assert result.reason is not None and "output channel" in result.reason
    assert not result.restarted
    await assert_next_print_whole(session)


async def test_oversize_message_from_a_thread_after_the_cell_does_not_break_the_next(
        session: Session) -> None:
    await run_ok(session, "kept = [1, 2, 3]")
    await run_ok(session, "import threading, time\n"
                          "def late():\n    time.sleep(0.5)\n" +
                 "\n".join("    " + line for line in FORGED_70MIB.strip().splitlines()) +
                 "\nthreading.Thread(target=late).start()")
    await asyncio.sleep(3)  # the channel breaks while nothing runs
    await assert_next_print_whole(session)


async def test_kernel_death_after_a_channel_recovery_is_still_noticed(session: Session) -> None:
    await run_ok(session, "kept = [1, 2, 3]")
    broken = await session.execute(FORGED_70MIB, timeout_s=110)
    assert broken.status == "error" and not broken.restarted
    died = await session.execute("import os\nos._exit(3)", timeout_s=30)
    assert died.status == "died", died.reason
    assert died.restarted
    after = await session.execute("print('fresh', 'kernel', flush=True)")
    assert after.stdout == "fresh kernel\n"
