"""PIL images show in the output, as in E2B's sandbox (its template's ``0003_images.py``).

``Image.save("plot.png")`` (to a path) also displays the image saved, and ``Image.show()``
displays it instead of starting a desktop viewer (a sandbox has no screen: with one of them
installed, ``xdg-open`` say, PIL's ``show`` reported success and nothing was shown).

PIL is patched once ``PIL.Image`` is imported, never imported for that: the kernel's launcher
imports it ahead of user code (``__main__.PREIMPORTS``), and an image without PIL, or a launcher
that stops importing it, loads it only when user code does.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

MODULE = "PIL.Image"


def install() -> None:
    """Patch PIL's ``Image`` now if it is loaded, else as soon as something imports it."""
    module = sys.modules.get(MODULE)
    if module is not None:
        _patch(module)
    else:
        sys.meta_path.insert(0, _AfterImport(MODULE, _patch))


def _patch(module: ModuleType) -> None:
    image = module.Image
    if getattr(image.save, "_replgate", False):
        return
    save = image.save

    def save_and_show(self: Any, fp: Any, format: Any = None, **params: Any) -> None:
        save(self, fp, format, **params)
        if isinstance(fp, str | os.PathLike):  # a file object is written, not shown
            _display(self)

    def show(self: Any, title: str | None = None) -> None:
        # PIL's own viewer for IPython converts the modes a PNG cannot hold (F, I, CMYK).
        from PIL import ImageShow

        ImageShow.IPythonViewer().show(self, title=title)

    save_and_show._replgate = True  # type: ignore[attr-defined]
    image.save = save_and_show
    image.show = show


def _display(image: Any) -> None:
    from IPython.display import display

    display(image)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``name`` is imported (and takes itself out)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        load = loader.exec_module
        then = self.then

        def exec_module(module: ModuleType) -> None:
            load(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
