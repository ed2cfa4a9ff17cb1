"""Files of a session's workspace: a write's answer (a listing's entry is kernel_pool's
FileInfo).
"""

from __future__ import annotations

from pydantic import BaseModel


class FileWritten(BaseModel):
    path: str
    size: int
