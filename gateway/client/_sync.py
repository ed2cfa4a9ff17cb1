"""The blocking face of the client, derived from the asynchronous one rather than copied.

:class:`Sandbox` restates no method: attribute access forwards to an :class:`AsyncSandbox`, and
each coroutine method found there runs to completion on a private event loop in a background
thread (one per sandbox). An attribute that has coroutine methods of its own (``files``) is
wrapped the same way, as is an object a method returns with coroutine methods (a background
command's handle), so whatever the async face gains, this face has too.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from ._async import AsyncSandbox
from ._errors import ReplgateError

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread until :meth:`stop`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replgate-client",
                                        daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and block until it is done."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            # Blocking the loop's own thread on the loop would wait forever.
            raise ReplgateError("A blocking Sandbox method was called from a run_code callback; "
                                "use AsyncSandbox with async callbacks for that.")
        if not self.running:
            coroutine.close()
            raise ReplgateError("This sandbox is closed; create or connect a new one.")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C while waiting must stop the work too, not leave it running unseen.
            future.cancel()
            raise

    @property
    def running(self) -> bool:
        """Whether the loop still runs (``False`` once stopped)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Cancel what is left on the loop, then stop and close it."""
        if not self.running:
            return
        asyncio.run_coroutine_threadsafe(_cancel_remaining(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _cancel_remaining() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class _Blocking:
    """``target`` with its coroutine methods turned into blocking calls on ``loop``."""

    def __init__(self, target: object, loop: _LoopThread) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)  # private names stay private, and no recursion in init
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):
            return self._blocking(value)
        if _has_coroutine_methods(value):
            return _Blocking(value, self._loop)
        return value

    def _blocking(self, method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            result = self._loop.run(method(*args, **kwargs))
            # what a method hands back with coroutine methods of its own (a background
            # command's handle) blocks the same way
            return _Blocking(result, self._loop) if _has_coroutine_methods(result) else result

        return call

    def __dir__(self) -> list[str]:
        public = (name for name in dir(self._target) if not name.startswith("_"))
        return sorted({*super().__dir__(), *public})

    def __repr__(self) -> str:
        return f"<blocking {self._target!r}>"


def _has_coroutine_methods(value: object) -> bool:
    cls = type(value)
    return any(inspect.iscoroutinefunction(getattr(cls, name, None))
               for name in dir(cls) if not name.startswith("_"))


class Sandbox(_Blocking):
    """The blocking sandbox: every method and attribute of :class:`AsyncSandbox`, as plain calls.

    ``Sandbox.create(...)`` and ``Sandbox.connect(...)`` take :class:`AsyncSandbox`'s
    arguments; ``sandbox.run_code(...)``, ``sandbox.files.read(...)`` and the rest block until
    done. Used as ``with``, the session is deleted on exit. Callbacks given to ``run_code`` run
    on the sandbox's background thread.
    """

    def __init__(self, sandbox: AsyncSandbox, loop: _LoopThread) -> None:
        """Drive ``sandbox`` on ``loop``; use :meth:`create` or :meth:`connect`."""
        super().__init__(sandbox, loop)
        self._sandbox = sandbox

    @classmethod
    def create(cls, **options: Any) -> Sandbox:
        """Start a new session; ``options`` are those of :meth:`AsyncSandbox.create`."""
        return cls._start(AsyncSandbox.create, **options)

    @classmethod
    def connect(cls, session_id: str, **options: Any) -> Sandbox:
        """Attach to an existing session; ``options`` are those of :meth:`AsyncSandbox.connect`."""
        return cls._start(AsyncSandbox.connect, session_id, **options)

    @classmethod
    def _start(cls, factory: Callable[..., Coroutine[Any, Any, AsyncSandbox]], *args: Any,
               **kwargs: Any) -> Sandbox:
        loop = _LoopThread()
        try:
            return cls(loop.run(factory(*args, **kwargs)), loop)
        except BaseException:
            loop.stop()
            raise

    def close(self) -> None:
        """Delete the session, close the connections and stop the background thread."""
        if not self._loop.running:
            return
        try:
            self._loop.run(self._sandbox.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._sandbox).replace("<AsyncSandbox", "<Sandbox", 1)
