"""Custom templates (issue 44): how long a build takes, and how fast a session of a template
starts, beside the default profile's.

    python -m bench --only templates [--quick]

Two gateways of this checkout: ``warm`` (a template's profile keeps a warm kernel after a
create, as installed) and ``cold`` (``REPLGATE_TEMPLATE_WARM_S=0`` and no warm default kernel:
every session starts from its profile's kernel template). The template is FROM the sandbox image,
adds a PyPI package and a step whose text changes per run. Figures: the build without the layer
cache (``skip_cache``), the rebuild with a warm cache and one changed step, each to ``ready``
(the sandbox layer and the kernel check included); then session starts (the create's answer)
of the template and of the default profile, from a warm kernel and from a kernel template.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench._measure import pct
from bench._peers import Replgate

TARGET_WARM_MS = 10.0
TARGET_TEMPLATE_MS = 400.0
TARGET_REBUILD_S = 10.0


def _dockerfile(image: str, marker: str) -> str:
    return (f"FROM {image}\n"
            "USER root\n"
            "RUN pip install --no-cache-dir --disable-pip-version-check tomli_w==1.0.0\n"
            f"RUN echo {marker} > /opt/marker\n")


async def _build(rg: Replgate, name: str, dockerfile: str, skip_cache: bool) -> dict[str, Any]:
    """The template once ready, and the seconds from the request to ``ready``."""
    started = time.perf_counter()
    answer = await rg.http.post("/v1/templates", json={
        "name": name, "dockerfile": dockerfile, "skip_cache": skip_cache})
    answer.raise_for_status()
    template_id = answer.json()["id"]
    while True:
        info: dict[str, Any] = (await rg.http.get(f"/v1/templates/{template_id}")).json()
        if info["status"] != "building":
            break
        await asyncio.sleep(0.05)
    if info["status"] != "ready":
        raise RuntimeError(f"template build failed: {info['error']}")
    info["seconds"] = round(time.perf_counter() - started, 2)
    return info


async def _create_ms(rg: Replgate, profile: str) -> float:
    started = time.perf_counter()
    answer = await rg.http.post("/v1/sessions", json={"profile": profile})
    elapsed = (time.perf_counter() - started) * 1000
    answer.raise_for_status()
    await rg.delete_session(answer.json()["id"])
    return elapsed


async def _starts(rg: Replgate, profile: str, repeats: int,
                  ready: Callable[[], Any]) -> list[float]:
    found = []
    for _ in range(repeats):
        await ready()
        found.append(await _create_ms(rg, profile))
    return found


async def _kernel_template(rg: Replgate, profile: str, timeout_s: float = 300) -> None:
    """Wait until the profile's kernel template is on disk (its first start makes it)."""
    await rg.delete_session(await _session(rg, profile))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((rg.state / "templates").glob(f"{profile}-*/template.json")):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no kernel template of {profile} within {timeout_s:g} s")


async def _session(rg: Replgate, profile: str) -> str:
    answer = await rg.http.post("/v1/sessions", json={"profile": profile})
    answer.raise_for_status()
    return str(answer.json()["id"])


async def _delete(rg: Replgate, template: dict[str, Any], timeout_s: float = 120) -> None:
    """Delete the template and wait until its images are gone (they go once no container of
    them is left), so a run leaves none behind."""
    await rg.http.delete(f"/v1/templates/{template['id']}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            "docker", "image", "inspect", template["image"], stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        if await proc.wait() != 0:
            return
        await asyncio.sleep(1)


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 1), "p90": round(pct(values, 90), 1),
            "n": len(values)}


async def templates(quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    repeats = 5 if quick else 20
    warm = Replgate(min_idle=1, max_kernels=8)
    cold = Replgate(min_idle=0, max_kernels=4, settings={"REPLGATE_TEMPLATE_WARM_S": "0"})
    try:
        await asyncio.gather(warm.wait_template(), cold.wait_template())
        marker = secrets.token_hex(6)
        log("template build without the layer cache")
        first = await _build(warm, "bench", _dockerfile(Replgate.image, marker), True)
        log(f"  {first['seconds']} s; rebuild with one changed step")
        again = await _build(warm, "bench", _dockerfile(Replgate.image, marker + "b"), False)
        log(f"  {again['seconds']} s; session starts")
        profile = again["profile"]

        async def template_warm() -> None:
            await warm.wait_idle(2)  # the default's and the template's

        async def default_warm() -> None:
            await warm.wait_idle(2)

        await _create_ms(warm, profile)  # the first create asks for its warm kernel
        template_starts = await _starts(warm, profile, repeats, template_warm)
        default_starts = await _starts(warm, "default", repeats, default_warm)

        built = await _build(cold, "bench", _dockerfile(Replgate.image, marker + "b"), False)
        await _kernel_template(cold, built["profile"])

        async def nothing() -> None:
            await cold.wait_idle(0)

        template_cold = await _starts(cold, built["profile"], repeats, nothing)
        default_cold = await _starts(cold, "default", repeats, nothing)
        await asyncio.gather(_delete(warm, again), _delete(cold, built))
    finally:
        await asyncio.gather(warm.stop(), cold.stop())
    result = {
        "build_uncached_s": first["seconds"], "rebuild_one_step_s": again["seconds"],
        "image_bytes": again["image_size"],
        "start_warm_ms": {"template": _summary(template_starts),
                          "default": _summary(default_starts)},
        "start_from_kernel_template_ms": {"template": _summary(template_cold),
                                          "default": _summary(default_cold)},
    }
    result["verdicts"] = [
        f"rebuild with one changed step {again['seconds']} s (target <= {TARGET_REBUILD_S:g} s)",
        f"template session start, warm: p50 {result['start_warm_ms']['template']['p50']} ms "
        f"(default {result['start_warm_ms']['default']['p50']} ms; target <= "
        f"{TARGET_WARM_MS:g} ms)",
        f"template session start from its kernel template: p50 "
        f"{result['start_from_kernel_template_ms']['template']['p50']} ms (default "
        f"{result['start_from_kernel_template_ms']['default']['p50']} ms; target <= "
        f"{TARGET_TEMPLATE_MS:g} ms)",
    ]
    return result
