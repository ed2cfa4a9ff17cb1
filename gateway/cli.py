"""``replgate``: the command line (serve, node, mcp, image, audit)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import local
from gateway.process_tuning import tune_process

if TYPE_CHECKING:  # imported where used: `replgate --help` needs only the core packages
    from common.policy import Policy
    from common.settings import Settings


class _JsonFormatter(logging.Formatter):
    def __init__(self, ids: Callable[[], dict[str, str]] | None = None) -> None:
        super().__init__()
        self._ids = ids
        """The current span's trace and span ids, when traces are exported: a line leads to
        its trace."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "level": record.levelname,
                "logger": record.name, "message": record.getMessage()}
        if self._ids is not None:
            line.update(self._ids())
        return json.dumps(line)


def configure_logging(settings: Settings) -> None:
    from gateway.redaction import DropFrames, RedactSecrets

    ids = None
    if settings.log_json:
        from common.tracing import log_ids, tracing_asked

        ids = log_ids if tracing_asked(os.environ) else None
    handler = logging.StreamHandler()
    handler.addFilter(RedactSecrets())
    handler.addFilter(DropFrames())  # (a node channel's frames carry secrets' values)
    handler.setFormatter(_JsonFormatter(ids) if settings.log_json else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())


@contextlib.contextmanager
def _claimed(state_dir: Path, host: str, port: int, *,
             record: bool) -> Iterator[socket.socket]:
    """The state directory's lock, then the port, before anything else (even the slow
    imports): a second process on this state directory, or one whose port is taken, must leave
    the running one alone. ``record``: the address goes in the lock, where clients of this
    machine find the gateway. ``StartRefused`` says why not."""
    from gateway.statelock import StateLock, bind_socket, socket_url

    lock = StateLock.acquire(state_dir)
    try:
        sock = bind_socket(host, port)
    except BaseException:
        lock.release()
        raise
    try:
        if record:
            lock.record_address(socket_url(sock))
        yield sock
    finally:
        sock.close()
        lock.release()


def _settings(**overrides: Any) -> Settings:
    """The settings, or the command's end with one line naming what to change (status 2)."""
    from common.settings_load import SettingsError, load_settings

    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> int:
    from common.policy import PolicyError, load_policy
    from gateway.statelock import StartRefused

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    settings = _settings(**overrides)
    # Said before the slow imports (seconds): settings that cannot work together, the policy.
    refusal = settings.serve_refusal()
    try:
        policy = load_policy(settings.policy_file)
    except PolicyError as exc:
        refusal = refusal or str(exc)
    if refusal is not None:
        print(f"replgate: {refusal}", file=sys.stderr)
        return 2
    try:
        with _claimed(settings.state_dir, settings.host, settings.port, record=True) as sock:
            return _run_gateway(settings, policy, sock)
    except StartRefused as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 1


def _run_gateway(settings: Settings, policy: Policy, sock: socket.socket) -> int:
    from common.database import DatabaseError
    from common.startup import serve_guarded
    from common.tracing import TracingConfigError
    from gateway.app import create_app
    from gateway.statelock import StartRefused, socket_url
    from kernel_pool import BackendError

    configure_logging(settings)
    tune_process()
    logging.getLogger("replgate").info("starting on %s (pid %d)", socket_url(sock), os.getpid())
    try:
        app = create_app(settings, policy)
    except TracingConfigError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 2
    # No permessage-deflate: compressing each small event frame costs more CPU and latency
    # than it saves on the local or LAN links agents use (and PNGs do not compress).
    refused = serve_guarded(
        app, (StartRefused, DatabaseError, BackendError), sock, log_config=None,
        ws_max_size=16 * 1024 * 1024, ws_per_message_deflate=False,
        timeout_graceful_shutdown=15, timeout_keep_alive=settings.http_keep_alive_s)
    if refused is not None:
        print(f"replgate: {refused}", file=sys.stderr)
        return 2
    return 0


def _node(args: argparse.Namespace) -> int:
    from gateway.statelock import StartRefused

    host, port = _host_port(args.listen or f"0.0.0.0:{_host_port(args.advertise)[1]}")
    settings = _settings()
    try:
        with _claimed(settings.state_dir, host, port, record=False) as sock:
            from node.agent import run_node
            from node.identity import default_node_id

            if args.id is None:  # (read and kept under the state folder's lock)
                args.id = default_node_id(settings.state_dir)

            configure_logging(settings)
            tune_process()
            logging.getLogger("replgate").info(
                "node %s on %s:%d (pid %d), advertised as %s", args.id, host, port,
                os.getpid(), args.advertise)
            run_node(settings, node_id=args.id, advertise=args.advertise, sock=sock)
            return 0
    except StartRefused as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 2


def _cluster(args: argparse.Namespace) -> int:
    import signal
    import tempfile

    from node.local import LocalCluster

    database_url = args.database_url or os.environ.get("REPLGATE_DATABASE_URL")
    if not database_url:
        print("replgate cluster: no database: pass --database-url postgresql://... or set "
              "REPLGATE_DATABASE_URL (./run.sh cluster starts a local PostgreSQL)",
              file=sys.stderr)
        return 2
    folder = Path(args.dir or tempfile.mkdtemp(prefix="replgate-cluster-"))
    cluster = LocalCluster(folder, database_url, nodes=args.nodes, gateways=args.gateways,
                           gateway_port=args.port, node_port=args.node_port,
                           env={"REPLGATE_KEEP_SESSIONS_ON_STOP": "false"})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        cluster.start()
        print(f"replgate cluster: {args.nodes} nodes and {args.gateways} gateways, state and "
              f"logs in {folder}", flush=True)
        for url in cluster.urls:
            print(f"  gateway {url}", flush=True)
        print(f"  API key (tenant 'default'): {cluster.api_key}\n"
              "Ctrl-C stops them all.", flush=True)
        signal.pause()
    except (KeyboardInterrupt, SystemExit):
        pass
    except RuntimeError as exc:
        print(f"replgate cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    return 0


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"replgate: {value!r} is not HOST:PORT (e.g. 10.0.0.5:7070)")
    return host.strip("[]"), int(port)


def _mcp(args: argparse.Namespace) -> int:
    import anyio

    from gateway.mcp import run_stdio

    # stdout carries the protocol: logs go to stderr, which MCP clients show or keep.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="replgate mcp: %(levelname)s %(name)s: %(message)s")
    api_key = local.api_key()
    if not api_key:
        print("replgate mcp: no API key: set REPLGATE_API_KEY to a key of the gateway "
              "(`replgate serve` prints the one it creates, and keeps it in "
              f"{local.state_dir() / local.KEY_FILE})", file=sys.stderr)
        return 2
    anyio.run(lambda: run_stdio(base_url=args.url, api_key=api_key))
    return 0


def _image_build(args: argparse.Namespace) -> int:
    from gateway.doctor import build_sandbox_images
    from kernel_pool import KernelPoolError

    try:
        built = build_sandbox_images(
            _settings(), force=args.force, slim=args.slim,
            log=lambda line: print(f"[replgate] {line}", file=sys.stderr))
    except KernelPoolError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 1
    for info in built:
        print(f"{info.tag} {info.id} (base {info.base})")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from gateway.doctor import diagnose

    results = diagnose(_settings())
    for ok, sentence in results:
        print(f"{'ok     ' if ok else 'PROBLEM'} {sentence}")
    return 0 if all(ok for ok, _ in results) else 1


async def _with_audit(action: str, target: str | None) -> int:
    from common.database import DatabaseError
    from gateway.audit import AuditLog
    from gateway.store import Store

    settings = _settings()
    if settings.database_url is None and not settings.db_path.is_file():
        print(f"replgate: no database at {settings.db_path}; set REPLGATE_STATE_DIR or "
              "REPLGATE_DATABASE_URL", file=sys.stderr)
        return 2
    try:
        store = await Store.open(settings.database)
    except DatabaseError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 2
    async with store:
        audit = await AuditLog.open(store)
        if action == "verify":
            result = await audit.verify()
            print(f"{'ok' if result.ok else 'TAMPERED'}: {result.records} records")
            for problem in result.problems:
                print(f"  {problem}")
            return 0 if result.ok else 1
        count = await audit.export(target if target and target != "-" else sys.stdout)
        print(f"exported {count} records", file=sys.stderr)
        return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replgate", description="A hardened, persistent Python REPL for AI agents. "
        "Settings come from REPLGATE_* environment variables (see docs/configuration.md).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway (HTTP, WebSocket, Jupyter API)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.set_defaults(func=_serve)

    node = commands.add_parser(
        "node", help="run sessions for the gateways of a shared database (many machines)",
        description="Run this machine's sandboxes for gateways: registered in "
        "REPLGATE_DATABASE_URL, reached over mutual TLS (REPLGATE_TLS_CA, REPLGATE_TLS_CERT, "
        "REPLGATE_TLS_KEY). See docs/cluster.md.")
    node.add_argument("--advertise", required=True, metavar="HOST:PORT",
                      help="the address gateways reach this node on")
    node.add_argument("--listen", metavar="HOST:PORT",
                      help="the address to bind (default: all addresses, the advertised port)")
    node.add_argument("--id", help="this node's id, unique among the nodes (default: the host "
                                   "name and a suffix drawn once and kept in the state folder)")
    node.set_defaults(func=_node)

    cluster = commands.add_parser(
        "cluster", help="many machines on this one: nodes and gateways in processes of their own",
        description="Start `replgate node` and `replgate serve` processes on this machine, on "
        "one PostgreSQL database, with mutual TLS between them (certificates made for them), "
        "and stop them all on Ctrl-C. See docs/cluster.md.")
    cluster.add_argument("--nodes", type=int, default=3)
    cluster.add_argument("--gateways", type=int, default=2)
    cluster.add_argument("--port", type=int, default=8000, help="the first gateway's port "
                         "(the next ones follow)")
    cluster.add_argument("--node-port", type=int, default=7070, help="the first node's port")
    cluster.add_argument("--database-url", help="postgresql://... (default: "
                         "REPLGATE_DATABASE_URL)")
    cluster.add_argument("--dir", help="where state, certificates and logs go (default: a new "
                         "temporary folder)")
    cluster.set_defaults(func=_cluster)

    mcp = commands.add_parser(
        "mcp", help="an MCP server on stdio: a persistent sandboxed Python session as tools",
        description="Serve MCP over stdio (for Claude Desktop, Cursor, ...): one persistent "
        "session on a running gateway, reached at REPLGATE_URL (default http://127.0.0.1:8000) "
        "with REPLGATE_API_KEY (default: the key `replgate serve` created on this machine). The "
        "gateway also serves MCP over streamable HTTP at /mcp.")
    mcp.add_argument("--url", help="the gateway's address (default: REPLGATE_URL)")
    mcp.set_defaults(func=_mcp)

    image = commands.add_parser("image", help="build the sandbox images")
    image_commands = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    build = image_commands.add_parser(
        "build", help="build the sandbox images the profiles name unless up to date (the "
        "default image, with every language, unless every profile names the slim one)")
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    build.add_argument("--slim", action="store_true",
                       help="also build the slim image (Python and bash only), as when a "
                       "profile names it")
    # The default image is what --polyglot once added: scripts that pass it still work.
    build.add_argument("--polyglot", action="store_true", help=argparse.SUPPRESS)
    build.set_defaults(func=_image_build)

    doctor = commands.add_parser(
        "doctor", help="check that the engine can run every profile (image, runtime)")
    doctor.set_defaults(func=_doctor)

    audit = commands.add_parser("audit", help="check or export the audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    verify = audit_commands.add_parser("verify", help="detect edited, deleted or reordered records")
    verify.set_defaults(func=lambda a: asyncio.run(_with_audit("verify", None)))
    export = audit_commands.add_parser("export", help="write the log as JSON lines")
    export.add_argument("--output", "-o", default="-", help="file to write (default stdout)")
    export.set_defaults(func=lambda a: asyncio.run(_with_audit("export", a.output)))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status = int(args.func(args))
    # Ends at once: the collector's last walk over the app's objects took seconds, for nothing.
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(main())
