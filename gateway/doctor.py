"""``replgate doctor`` and ``replgate image build``: the gateway's one adapter onto Docker.

It also lends :mod:`gateway.templates` the Docker backend's builder of custom templates'
images (``build_template_image``). ``diagnose`` says whether this machine can run the
configured profiles, one line per check.
It reads the same settings and policy file as ``replgate serve`` and asks the Docker engine
what it offers: that the engine answers, that each profile's image is there, that each
profile's runtime is registered as replgate needs it (for gVisor, the exact daemon.json line),
and whether pauses can keep a kernel's whole memory (CRIU and the engine's experimental mode)
and compress their snapshots (``zstd``); their absence is not a problem (pauses keep the
variables, stored uncompressed), so those lines never fail.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import docker
import docker.errors

from common.policy import PolicyError, load_policy
from common.settings import Settings
from kernel_pool.backends.docker import (
    BuiltImage,
    CheckpointSupport,
    ImageInfo,
    TemplateBuild,
    build_image,
    build_template_image,
    check_context,
    checkpoint_support,
    current_image,
    ensure_image,
    export_image,
    image_key,
    missing_runtime,
    remove_template_image,
    slim_image,
    templates_refusal,
)

__all__ = ["BuiltImage", "TemplateBuild", "build_sandbox_images", "build_template_image",
           "check_context", "diagnose", "ensure_image", "export_image", "image_key",
           "kernel_templates", "memory_pauses", "remove_template_image", "snapshot_compression"]
"""The builders of custom templates' images (:mod:`gateway.templates`) reach the engine through
this adapter too."""


def diagnose(settings: Settings) -> list[tuple[bool, str]]:
    """(ok, sentence) for each check, in order; stops at the first check the rest depend on."""
    try:
        pool = load_policy(settings.policy_file).pool_settings(settings.pool_settings())
    except PolicyError as exc:
        return [(False, str(exc))]
    try:
        client = docker.from_env()
        info = client.info()
    except docker.errors.DockerException as exc:
        return [(False, f"no Docker engine answers ({exc}); start one (./run.sh serve does) "
                        "or set DOCKER_HOST")]
    found = [(True, f"Docker engine {info.get('ServerVersion', '?')} answers; runtimes: "
                    f"{', '.join(sorted(info.get('Runtimes') or {}))}")]
    try:
        for profile in pool.profiles.values():
            try:
                client.images.get(profile.image)
                found.append((True, f"profile {profile.name}: image {profile.image} is there"))
            except docker.errors.ImageNotFound:
                slim = " --slim" if profile.image == slim_image() else ""
                found.append((False, f"profile {profile.name}: no image {profile.image}; "
                                     f"run `replgate image build{slim}`"))
            problem = missing_runtime(info.get("Runtimes") or {}, [profile])
            found.append((problem is None, problem or
                          f"profile {profile.name}: runtime {profile.runtime} is available"))
    finally:
        client.close()
    support = checkpoint_support(info)
    found.append((True, memory_pauses(support, pool.pause_with)))
    found.append((True, kernel_templates(support, pool.kernel_templates)))
    found.append((True, snapshot_compression(shutil.which("zstd"))))
    return found


def snapshot_compression(zstd: str | None) -> str:
    """The doctor's line on compressing pause snapshots with the host's ``zstd`` (never a
    problem: without it snapshots are stored as they are, larger on disk)."""
    if zstd is None:
        return ("pause snapshots: stored uncompressed, no zstd on PATH; install Debian's "
                "(sudo apt-get install zstd; ./run.sh does)")
    return f"pause snapshots: compressed as they stream, by {zstd} (zstd --fast=1, all cores)"


def kernel_templates(support: CheckpointSupport, wanted: bool) -> str:
    """The doctor's line on kernel templates (never a problem: without them kernels boot)."""
    if not wanted:
        return "kernel templates: off (REPLGATE_KERNEL_TEMPLATES=false), so kernels boot"
    refusal = templates_refusal(support)
    if refusal is not None:
        return f"kernel templates: not available, so kernels boot; {refusal}"
    return ("kernel templates: available; a runc profile's new kernels are restored from a "
            "kernel checkpointed with its imports done (about 0.2 s), not booted (about 1 s)")


def memory_pauses(support: CheckpointSupport, pause_with: str) -> str:
    """The doctor's line on memory pauses (never a problem: without them pauses keep the
    variables), saying what pauses keep with ``pause_with`` (REPLGATE_PAUSE_WITH)."""
    if support.available:
        keep = ("the variables, or the memory as well when the variables alone would lose "
                "something" if pause_with == "auto" else pause_with)
        return (f"memory pauses: available; {support.reason}; pauses keep {keep} "
                f"(REPLGATE_PAUSE_WITH={pause_with})")
    asked = " although REPLGATE_PAUSE_WITH=memory" if pause_with == "memory" else ""
    return f"memory pauses: not available, so pauses keep variables{asked}; {support.reason}"


def build_sandbox_images(
    settings: Settings, *, force: bool, slim: bool, log: Callable[[str], None]
) -> list[ImageInfo]:
    """Build (or find current) the sandbox images the profiles of the settings and the policy
    file name, and the slim one too when ``slim``: the default image unless the profiles name
    the slim one and not it (a slim install need not build R and the JDK); raises
    ``ImageError``."""
    try:
        pool = load_policy(settings.policy_file).pool_settings(settings.pool_settings())
    except PolicyError:
        pool = settings.pool_settings()  # serve says what is wrong with the file
    named = {p.image for p in pool.profiles.values()}
    slim = slim or slim_image() in named
    default = current_image() in named or not slim
    client = docker.from_env()
    try:
        built = []
        if default:
            built.append(build_image(client, state_dir=settings.state_dir, force=force, log=log))
        if slim:
            built.append(build_image(client, state_dir=settings.state_dir, slim=True,
                                     force=force, log=log))
        return built
    finally:
        client.close()
