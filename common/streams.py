"""A stream of bytes whose refusal comes before its first piece, for a streamed answer."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator


async def primed(chunks: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """``chunks`` with its first piece read now: a refusal it raises there (a missing file,
    one over a limit) is raised here, while the answer can still be an error; the rest is
    read as the answer is sent, and ``chunks`` closed after."""
    first = await anext(chunks)

    async def rest() -> AsyncIterator[bytes]:
        try:
            yield first
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    return rest()
