"""kernel_pool's public face: the names its package exports, and nothing public besides."""

from __future__ import annotations

from pathlib import Path

import kernel_pool

EXPORTED = [
    "ApprovalEvent", "BackendError", "CHART_MIME", "CapacityError", "ClearOutputEvent",
    "ClosedListener",
    "CommandDone", "CommandInputClosed", "CommandNotFound", "CommandResult", "CommandStatus",
    "ContextInfo", "ContextNotFound",
    "ContextStartFailed", "Denial", "DirWatch",
    "DisplayEvent", "DoneEvent",
    "EgressAttempt", "Entry", "ErrorEvent", "Event", "Execution", "ExecutionBuilder",
    "ExecutionError", "ExecutionHandle", "ExecutionIdTaken", "ExecutionStatus", "FileChange",
    "FileInfo", "FileMissing", "FileTooLarge", "Gate", "ImageError", "InvalidRequest",
    "KernelPool", "KernelPoolError", "KernelStartError", "KernelUnavailable", "Listener",
    "ExecutionQueue", "NetworkPolicy", "NoNodeAvailable", "NodeRecord", "NodeUnreachable",
    "NotDrainable",
    "Output",
    "OutputCaps", "OutputEvent", "PathOutsideWorkspace", "PauseInfo", "PayloadTooLarge",
    "PendingApprovalEvent", "PoolLimits", "PoolSettings", "Profile", "ProfileNotFound", "PtySize",
    "QueueFull", "ResourceUsage", "SandboxDiskFull", "SandboxEntry", "SandboxFileDenied",
    "SandboxFileError", "SandboxFileExists", "SandboxFileMissing", "SandboxFsAnswer",
    "SandboxFsRequest", "SandboxInfo", "SandboxUsage", "Session", "SessionClosed",
    "SessionHost", "SessionNotFound", "SessionPort", "SessionState",
    "SessionStatus", "SnapshotBudgetExceeded", "SnapshotError", "SnapshotNotFound",
    "SnapshotSaved", "StateDirFull", "StreamEvent", "TemplateBuildFailed",
    "TooManyCommands", "TooManyWatches", "Transfer", "TransferListener", "UnknownLanguage",
    "UnknownNode",
    "UpdateDisplayEvent", "WatchEvent",
    "WorkspaceError", "WorkspaceFull", "parse_size", "policy_beyond", "profile_bound",
    # Shared by both sides of the port (the gateway's RemoteSession holds executions at the
    # gate and checks languages as the node would; the E2B face sets a call's variables in
    # the kernel's language):
    "CommandEmit", "DEFAULT_CONTEXT", "check_env", "check_language", "env_code",
    "normalize_language", "refused_at_gate",
    # The bundle store, which the gateway opens for custom templates' images and uploads:
    "PART_SIZE", "BundleNotFound", "BundleStore", "BundleStoreError", "open_store",
]
PUBLIC_MODULES = {"__init__.py", "config.py", "events.py", "exceptions.py", "port.py",
                  "state.py"}


def test_all_lists_exactly_the_public_names_sorted() -> None:
    # isort's order, as ruff keeps it: constants, then classes, then functions
    assert kernel_pool.__all__ == sorted(kernel_pool.__all__, key=lambda name: (
        0 if name.isupper() else 1 if name[0].isupper() else 2, name))
    assert sorted(kernel_pool.__all__) == sorted(EXPORTED)


def test_every_exported_class_is_kernel_pools_own() -> None:
    for name in kernel_pool.__all__:
        value = getattr(kernel_pool, name)
        if isinstance(value, type):
            assert value.__module__.startswith("kernel_pool."), (name, value.__module__)
            assert value.__name__ == name


def test_unknown_name_raises_attribute_error() -> None:
    try:
        kernel_pool.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("kernel_pool.NoSuchThing resolved")


def test_package_modules_are_private_but_the_light_ones() -> None:
    package = Path(kernel_pool.__file__).parent
    public = {p.name for p in package.glob("*.py") if not p.name.startswith("_")}
    assert public | {"__init__.py"} == PUBLIC_MODULES
