"""No silent loss: huge rich outputs are capped in the kernel, and a broken output channel is
noticed, reported and re-established, on a real kernel in a real container."""

from __future__ import annotations

import asyncio

import pytest
from kp_support import run_ok

from kernel_pool import Session

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


HUGE_DISPLAYS = {
    # name: (pixels per side, images in one cell): stored uncompressed, base64 adds a third
    "one_48mib_png": (4096, 1),
    "six_12mib_pngs": (2048, 6),
}


@pytest.mark.parametrize("name", list(HUGE_DISPLAYS))
async def test_huge_displays_are_omitted_and_the_session_keeps_working(
        session: Session, name: str) -> None:
    side, count = HUGE_DISPLAYS[name]
    await run_ok(session, NOISE_PNG + "kept = [1, 2, 3]")
    result = await session.execute(
        f"png = noise_png({side})\nprint('raw', len(png) >= {side * side * 3})\n"
        f"for i in range({count}):\n    display(Shown(data=png))\n    print('shown', i)",
        timeout_s=110)
    assert result.status == "ok", (result.reason, result.error)
    assert result.truncated
    assert result.stdout == "raw True\n" + "".join(f"shown {i}\n" for i in range(count))
    assert len(result.outputs) == count
    for output in result.outputs:
        assert output.omitted is not None
        assert output.omitted["image/png"] >= side * side * 3 * 4 // 3
        assert list(output.data) == ["text/plain"]
        # the kernel's notice (the host's own cap would have said it differently)
        assert "REPLGATE_MAX_OUTPUT_BYTES" in output.data["text/plain"]
    await assert_next_print_whole(session)


async def test_kernel_gets_the_profiles_cap_on_its_command_line(session: Session) -> None:
    printed = await run_ok(session, "import sys\nprint(open('/proc/self/cmdline').read()"
                                    ".split(chr(0))[1:], sys.argv)")
    cap = session.profile.caps.display_bytes
    assert f"--max-output-bytes={cap}" in printed
    assert "--max-output-bytes" not in printed.split("] [")[1]  # taken out of sys.argv


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


async def test_huge_display_update_is_omitted_in_place(session: Session) -> None:
    await run_ok(session, NOISE_PNG + "kept = [1, 2, 3]")
    result = await session.execute(
        "handle = display('small', display_id=True)\n"
        "handle.update(Shown(data=noise_png(2048)))\nprint('updated')", timeout_s=110)
    assert result.status == "ok", (result.reason, result.error)
    assert result.truncated and result.stdout == "updated\n"
    [output] = result.outputs
    assert output.omitted is not None and output.omitted["image/png"] > 16 * 2**20
    assert "omitted" in output.data["text/plain"]
    await assert_next_print_whole(session)


async def test_a_request_channel_whose_replies_stop_coming_is_made_again(
        session: Session) -> None:
    """A start that hears the kernel run its kernel_info requests (their status on iopub) but
    gets no reply makes that channel's socket again, rather than waiting out its minute: here
    the replies are lost by the host (its reader gone), the way a CI run once lost them."""
    await run_ok(session, "kept = [1, 2, 3]")
    kernel = session.kernel
    lost = kernel._readers["shell"]
    lost.cancel()
    await asyncio.wait([lost])
    async with asyncio.timeout(20):
        await kernel._wait_ready("shell", watched=True)
    assert kernel._readers["shell"] is not lost
    await assert_next_print_whole(session)
