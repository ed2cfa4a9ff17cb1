"""A pause's or resume's transfer of the session's variables: its progress, told to listeners.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio.to_thread

from kernel_pool._session_base import SessionBase
from kernel_pool.state import PauseInfo, Transfer

logger = logging.getLogger(__name__)

TRANSFER_REPORT_S = 0.05
"""How often a transfer's progress is told: a bar moves smoothly, a socket is not flooded."""


class SessionTransfers(SessionBase):
    """The progress of the snapshot stream a pause writes or a resume reads."""

    async def _transferring(self, operation: str, moving: Any) -> Any:
        """Await ``moving`` (a snapshot's stream) with :attr:`transfer` showing its progress:
        a pause's total is the sandbox's memory in use, a resume's the stored snapshot."""
        total = 0
        if operation == "pause":
            total = (await self.kernel.sandbox.usage()).memory_bytes or 0
        elif self.lifecycle is not None:
            stored = await anyio.to_thread.run_sync(
                self.lifecycle.snapshots.variables_only, self.id, PauseInfo())
            total = stored.image_bytes
        transfer = self.transfer = Transfer(operation=operation, total_bytes=total,
                                            execution_id=self._resuming_for)
        self._tell(transfer.model_copy())
        reporter = self._queue.spawn(self._report(transfer), f"transfer-{self.id}")
        try:
            result = await moving
        except BaseException:
            ended = transfer.model_copy(update={"state": "failed"})
            raise
        else:
            # Every byte moved; a pause's size is known only now: what the kernel wrote.
            size = max(transfer.done_bytes, result.raw_bytes if operation == "pause"
                       else transfer.total_bytes)
            ended = transfer.model_copy(update={"state": "done", "done_bytes": size,
                                                "total_bytes": size})
        finally:
            reporter.cancel()
            self.transfer = None
            self._tell(ended)
        return result

    async def _report(self, transfer: Transfer) -> None:
        """Tell the listeners ``transfer``'s progress while it advances (until cancelled)."""
        told = transfer.done_bytes
        while True:
            await asyncio.sleep(TRANSFER_REPORT_S)
            if transfer.done_bytes != told:
                told = transfer.done_bytes
                self._tell(transfer.model_copy())

    def _tell(self, transfer: Transfer) -> None:
        for listener in list(self.transfer_listeners):
            try:
                listener(self.as_port, transfer)
            except Exception:
                logger.exception("session transfer listener failed")

    def _progress(self, done: int) -> None:
        """A stream's progress (called from its worker thread: one attribute's store)."""
        transfer = self.transfer
        if transfer is not None:
            transfer.done_bytes = done
