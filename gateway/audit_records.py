"""What the audit log keeps of an execution, and how it is hashed.

Records are built only from structured fields (:meth:`AuditRecord.for_execution`), never by
parsing what the user's code printed, so no output can forge or end a record. Each is stored
as its canonical JSON (:func:`canonical_json`) and chained with ``sha256(prev_hash +
record_json)`` (:func:`chain_hash`) by :class:`gateway.audit.AuditLog`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common.store import utc_now
from kernel_pool import CommandResult, Execution

__all__ = ["AuditRecord", "canonical_json", "chain_hash"]


def canonical_json(value: Any) -> str:
    """The one JSON text of ``value`` that is hashed: sorted keys, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(text: str) -> str:
    # surrogatepass: code may hold a lone surrogate (from a JSON escape) and must still hash.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def chain_hash(prev_hash: str, record_json: str) -> str:
    """``sha256(prev_hash + record_json)``, hex."""
    return _sha256(prev_hash + record_json)


class AuditRecord(BaseModel):
    """What the audit log keeps of one execution."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: str = Field(default_factory=utc_now)
    tenant: str
    session_id: str
    execution_id: str
    execution_count: int | None
    code: str
    code_sha256: str
    status: str
    duration_ms: float
    cpu_time_ms: float | None = None
    peak_memory_bytes: int | None = None
    stdout_chars: int
    stderr_chars: int
    output_count: int
    output_bytes: int
    """Size in bytes of the canonical JSON that ``output_sha256`` covers."""
    output_sha256: str
    """sha256 of the canonical JSON of ``{"stdout", "stderr", "outputs", "error"}``."""
    image: str | None = None
    """The sandbox image's tag or digest."""
    limits: dict[str, Any] = Field(default_factory=dict)
    """The profile's limits the code ran under."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Room for later fields (policy decisions, approvals) without a schema change."""

    @classmethod
    def for_execution(
        cls,
        execution: Execution,
        *,
        code: str,
        tenant: str,
        session_id: str,
        execution_id: str,
        image: str | None = None,
        limits: Mapping[str, Any] | None = None,
        time: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> AuditRecord:
        """The record of one finished execution, from its aggregate and the code it ran."""
        shown = canonical_json({
            "stdout": execution.stdout,
            "stderr": execution.stderr,
            "outputs": [output.model_dump(mode="json") for output in execution.outputs],
            "error": None if execution.error is None else execution.error.model_dump(mode="json"),
        })
        return cls(
            time=time or utc_now(),
            tenant=tenant,
            session_id=session_id,
            execution_id=execution_id,
            execution_count=execution.execution_count,
            code=code,
            code_sha256=_sha256(code),
            status=execution.status.value,
            duration_ms=execution.duration_ms,
            cpu_time_ms=execution.metrics.cpu_time_ms,
            peak_memory_bytes=execution.metrics.peak_memory_bytes,
            stdout_chars=len(execution.stdout),
            stderr_chars=len(execution.stderr),
            output_count=len(execution.outputs),
            output_bytes=len(shown.encode("ascii")),
            output_sha256=_sha256(shown),
            image=image,
            limits=dict(limits or {}),
            extra=dict(extra or {}),
        )

    @classmethod
    def for_command(cls, result: CommandResult, *, command: str, tenant: str,
                    session_id: str, image: str | None = None,
                    limits: Mapping[str, Any] | None = None) -> AuditRecord:
        """The record of one finished shell command (``extra.kind == "command"``)."""
        shown = canonical_json({"stdout": result.stdout, "stderr": result.stderr,
                                "exit_code": result.exit_code})
        return cls(
            tenant=tenant, session_id=session_id, execution_id=result.id,
            execution_count=None, code=command, code_sha256=_sha256(command),
            status=result.status.value, duration_ms=result.duration_ms,
            stdout_chars=len(result.stdout), stderr_chars=len(result.stderr), output_count=0,
            output_bytes=len(shown.encode("ascii")), output_sha256=_sha256(shown), image=image,
            limits=dict(limits or {}),
            extra={"kind": "command", "exit_code": result.exit_code})

    def canonical(self) -> str:
        """This record's canonical JSON, as stored and hashed."""
        return canonical_json(self.model_dump(mode="json"))
