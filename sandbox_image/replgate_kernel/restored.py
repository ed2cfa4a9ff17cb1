"""What a kernel restored from a template does first (the gateway runs it before anyone else
reaches the kernel): every copy of one template would otherwise share its state.

A template is a kernel booted once and checkpointed; each new sandbox gets a copy restored
from it. The copies start with the template's connection key, the template's random
generators and, in an empty ``/tmp``, without the private folders the template made there.
"""

import os
import random
import shutil
import sys

MATPLOTLIB_CONFIG = "/opt/replgate/mplconfig"


def after_restore(key: str) -> None:
    """Take ``key`` as the connection key (the reply to this request is signed with it),
    reseed the random generators, and make the private folders again."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    for name in ("IPYTHONDIR", "MPLCONFIGDIR"):
        path = os.environ.get(name)
        if path:
            os.makedirs(path, mode=0o700, exist_ok=True)
    target = os.environ.get("MPLCONFIGDIR")
    if target:
        shutil.copytree(MATPLOTLIB_CONFIG, target, dirs_exist_ok=True)
    from IPython import get_ipython

    get_ipython().kernel.session.key = key.encode()
