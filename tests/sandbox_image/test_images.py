"""PIL patched once it is imported, never imported for that (a fresh interpreter each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SANDBOX_IMAGE = Path(__file__).resolve().parents[2] / "sandbox_image"

CHECK = """
import io, sys
from replgate_kernel import images
shown = []
images._display = shown.append
images.install()
assert "PIL" not in sys.modules, "installing imported PIL"
from PIL import Image
image = Image.new("RGB", (2, 2))
image.save(io.BytesIO(), "PNG")
assert shown == [], "a file object's save displayed the image"
image.save(sys.argv[1])
assert shown == [image], shown
print("patched at import")
"""


def test_pil_is_patched_when_user_code_imports_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path / "x.png")],
                          cwd=SANDBOX_IMAGE, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "patched at import", done.stderr
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"
