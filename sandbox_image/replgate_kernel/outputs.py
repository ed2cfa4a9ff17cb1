"""The per-output cap, applied before a rich output leaves the kernel.

A display, result or display update whose MIME bundle is over the cap is replaced by a short
``text/plain`` notice, and the sizes of what was left out travel beside it as ``omitted``
(``{mime: bytes}``) in the message's content. An image of tens of megabytes thus never reaches
the kernel's output channel, where one message over the host's size limit would cut the channel
and lose every output after it. The host applies the same cap again: code in the kernel can
undo this one, and the host trusts nothing the kernel sends.
"""

import json

OPTION = "--max-output-bytes"
"""The launcher's argument carrying the cap (given by the host; not an environment variable, so
the session's environment stays only what it asked for)."""
RICH_TYPES = frozenset({"display_data", "execute_result", "update_display_data"})


def take_option(argv: list[str]) -> int | None:
    """Remove ``--max-output-bytes=N`` from ``argv`` (ipykernel refuses unknown options); N."""
    for index, arg in enumerate(argv):
        if arg.startswith(OPTION + "="):
            del argv[index]
            value = arg.split("=", 1)[1]
            return int(value) if value.isdigit() and int(value) > 0 else None
    return None


def _size(value: object) -> int:
    """Bytes of one MIME value as it travels: base64 text for bytes, JSON for the rest."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return (len(value) + 2) // 3 * 4
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return len(str(value))


def cap_content(content: dict, max_bytes: int) -> dict:  # type: ignore[type-arg]
    """``content`` itself when its bundle fits, else a copy with the notice and ``omitted``."""
    data = content.get("data")
    if not isinstance(data, dict):
        return content
    sizes = {str(mime): _size(value) for mime, value in data.items()}
    metadata = content.get("metadata")
    total = sum(sizes.values()) + (_size(metadata) if metadata else 0)
    if total <= max_bytes:
        return content
    listed = ", ".join(f"{mime}: {size} bytes" for mime, size in sizes.items())
    notice = (f"[replgate: output of {total} bytes omitted ({listed}); the limit is {max_bytes} "
              "bytes per output (REPLGATE_MAX_OUTPUT_BYTES); save large results to a file "
              "instead]")
    return {**content, "data": {"text/plain": notice}, "metadata": {}, "omitted": sizes}


def install(max_bytes: int) -> None:
    """Cap every rich output the kernel's message session sends (display hook, publisher,
    and code calling ``session.send`` itself)."""
    from jupyter_client.session import Session

    send = Session.send

    def capped_send(self, stream, msg_or_type, content=None, *args, **kwargs):  # type: ignore
        if isinstance(msg_or_type, dict):
            msg_type = msg_or_type.get("msg_type") or (msg_or_type.get("header") or {}).get(
                "msg_type")
            if msg_type in RICH_TYPES and isinstance(msg_or_type.get("content"), dict):
                capped = cap_content(msg_or_type["content"], max_bytes)
                if capped is not msg_or_type["content"]:
                    msg_or_type = {**msg_or_type, "content": capped}
        elif msg_or_type in RICH_TYPES and isinstance(content, dict):
            content = cap_content(content, max_bytes)
        return send(self, stream, msg_or_type, content, *args, **kwargs)

    Session.send = capped_send  # type: ignore[method-assign]
