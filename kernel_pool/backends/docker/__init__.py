"""The Docker backend: hardened containers (:class:`DockerBackend`) and the sandbox images.

Registered under the ``replgate.backends`` entry point ``docker``; runs each profile under
runc or gVisor (``missing_runtime`` says what the engine lacks for that); ``checkpoint_support``
says whether this host can checkpoint a sandbox's processes (CRIU), ``templates_refusal``
why kernels cannot be restored from templates here; the only module of
kernel_pool that imports the Docker SDK (with the image builders beside it: the sandbox
images', and custom templates' images).
"""

from kernel_pool._sandbox_image import current_image, slim_image
from kernel_pool.backends.docker._backend import DockerBackend
from kernel_pool.backends.docker._criu import CheckpointSupport, checkpoint_support
from kernel_pool.backends.docker._docker import (
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_SANDBOX,
    container_name,
)
from kernel_pool.backends.docker._gvisor import ENGINE_RUNTIMES, GVISOR_ARGS, missing_runtime
from kernel_pool.backends.docker._image import (
    ImageInfo,
    build_image,
    read_image_info,
)
from kernel_pool.backends.docker._image_transfer import ensure_image, export_image, image_key
from kernel_pool.backends.docker._sandbox import DockerSandbox
from kernel_pool.backends.docker._template import refusal as templates_refusal
from kernel_pool.backends.docker._user_image import (
    BuiltImage,
    TemplateBuild,
    build_template_image,
    check_context,
    remove_template_image,
)

__all__ = [
    "ENGINE_RUNTIMES",
    "GVISOR_ARGS",
    "LABEL_OWNER",
    "LABEL_PROFILE",
    "LABEL_SANDBOX",
    "BuiltImage",
    "CheckpointSupport",
    "DockerBackend",
    "DockerSandbox",
    "ImageInfo",
    "TemplateBuild",
    "build_image",
    "build_template_image",
    "check_context",
    "checkpoint_support",
    "container_name",
    "current_image",
    "ensure_image",
    "export_image",
    "image_key",
    "missing_runtime",
    "read_image_info",
    "remove_template_image",
    "slim_image",
    "templates_refusal",
]
