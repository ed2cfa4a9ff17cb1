"""``create_app(settings)``: wires the routers; the lifespan owns the store and the pool."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI
from starlette.routing import Route

from common.keys import generate_api_key, parse_api_keys_setting
from common.metrics import Metrics
from common.policy import Policy, load_policy
from common.settings import Settings
from common.store import SessionRecord
from common.tracing import setup_tracing
from gateway import __version__, bodies, draining, e2b, errors
from gateway.adoption import take_back
from gateway.audit import AuditLog
from gateway.governance import Governance
from gateway.local import KEY_FILE
from gateway.mcp.service import mcp_endpoint
from gateway.routers import contexts, files, health, jupyter, nodes, sessions, ui, watch, ws
from gateway.routers import files_watch as folder_watch
from gateway.routers import governance as governance_routes
from gateway.routers import network as network_routes
from gateway.routers import secrets as secret_routes
from gateway.routers import snapshots as snapshot_routes
from gateway.routers import templates as template_routes
from gateway.routers import terminals as terminal_routes
from gateway.secrets import Secrets
from gateway.service import Gateway
from gateway.snapshots import Snapshots
from gateway.statelock import StartRefused
from gateway.store import Store
from gateway.templates import Templates
from kernel_pool import KernelPool, SandboxInfo, SessionHost, open_store
from node.placement import RemoteNodes
from node.records import SessionRecords
from node.registry import Registry
from node.tls import client_context

logger = logging.getLogger("replgate")


def _make_state_dir(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)


def _default_key(state_dir: Path) -> tuple[str, bool]:
    """The default tenant's key from its file, or a new one written there (and True)."""
    path = state_dir / KEY_FILE
    if path.is_file():
        return path.read_text().strip(), False
    key = generate_api_key()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key, True


async def ensure_api_keys(settings: Settings, store: Store) -> None:
    """Keys from REPLGATE_API_KEYS; without it, one key for tenant ``default`` (kept in a file)."""
    if settings.api_keys:
        for tenant, keys in parse_api_keys_setting(settings.api_keys).items():
            for key in keys:
                await store.add_api_key(tenant, key)
        return
    key, created = await anyio.to_thread.run_sync(_default_key, settings.state_dir)
    await store.add_api_key("default", key)
    path = settings.state_dir / KEY_FILE
    if created:
        print(f"replgate: created API key for tenant 'default' (kept in {path}):\n  {key}",
              flush=True)
    else:
        logger.info("API key for tenant 'default' is in %s", path)



Leftovers = tuple[KernelPool, list[SandboxInfo], dict[str, SessionRecord]]
"""The pool of one machine, a previous gateway's sandboxes in it, and the records of its
sessions."""


@asynccontextmanager
async def _session_host(settings: Settings, policy: Policy, store: Store,
                        secrets: Secrets) -> AsyncIterator[tuple[SessionHost, Leftovers | None]]:
    """This process's pool (one machine) with what a previous gateway left in it to take
    back, or the nodes of the shared database."""
    pool_settings = policy.pool_settings(settings.pool_settings())
    if not settings.hosts_sessions:
        assert settings.tls_ca and settings.tls_cert and settings.tls_key  # (create_app)
        nodes = RemoteNodes(pool_settings, Registry(
            store.database, heartbeat_timeout_s=settings.node_timeout_s),
            client_context(settings.tls_cert, settings.tls_key, settings.tls_ca,
                           check_hostname=settings.tls_check_node_names),
            SessionRecords(store), bundles=settings.bundle_store is not None,
            images=open_store(settings.bundle_store) if settings.bundle_store else None)
        if secrets.enabled:  # its nodes' sessions' brokers ask this gateway for them
            nodes.secret_answers.source = secrets.lookup_for
        followers = [asyncio.create_task(nodes.watch(settings.node_timeout_s / 2)),
                     asyncio.create_task(nodes.records.listen())]
        try:
            yield nodes, None
        finally:
            for task in followers:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await nodes.close()
        return
    # This gateway's own node, on a database others may share: what it ran when it was
    # killed is over.
    node = settings.pool.owner
    await store.mark_unfinished_as("interrupted", node=node)
    # Sessions a killed gateway left running are taken back; other containers it left
    # (warm kernels, deleted sessions) are removed.
    records = {r.sandbox.container_id: r for r in await store.list_sessions(node=node)
               if r.sandbox is not None}
    pool = KernelPool(pool_settings, address=f"{settings.host}:{settings.port}")
    if secrets.enabled:  # before any kernel: warm ones and those taken back broker too
        pool.secret_source = secrets.lookup_for
    if settings.bundle_store is not None:  # saved snapshots where every gateway reads them
        pool.keep_snapshots_in(settings.bundle_store, settings.bundle_key.get_secret_value()
                               if settings.bundle_key is not None else None)
    kept = await pool.start(keep=lambda info: info.container_id in records)
    try:
        yield pool, (pool, kept, records)
    finally:
        await pool.close()


def create_app(settings: Settings, policy: Policy | None = None) -> FastAPI:
    """The gateway as an ASGI app; nothing starts until its lifespan runs.

    The policy file is read here unless ``policy`` is given, so a bad one fails at once
    (``PolicyError`` names the problem), and settings that cannot work together are refused
    (``StartRefused``), before the database is opened.
    """
    refusal = settings.serve_refusal()
    if refusal is not None:
        raise StartRefused(refusal)
    policy = policy or load_policy(settings.policy_file)
    tracing = setup_tracing()  # None unless the OTEL_* variables ask for traces

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(_make_state_dir, settings.state_dir)
        async with Store.open(settings.database) as store:
            if tracing is not None:
                tracing.instrument_engine(store.database.engine.sync_engine)
            await ensure_api_keys(settings, store)
            audit = await AuditLog.open(store)
            # What start-up made (modules, schemas, routes: some 250,000 objects) lives as long
            # as the process: out of the collector's sight, a full collection under load takes
            # about 45 ms instead of 170, during which no request is answered. (Frozen before
            # any session exists: a session's objects must stay collectable.)
            gc.freeze()
            governance = Governance(store, policy, approver_keys=settings.approver_keys,
                                    approval_timeout_s=settings.approval_timeout_s)
            secrets = Secrets(store, settings.secrets_key)
            async with _session_host(settings, policy, store, secrets) as (pool, leftovers):
                gateway = Gateway(settings, pool, store, audit, Metrics(pool), governance,
                                  tracing)
                app.state.templates = templates = Templates(  # (images: for nodes, other gateways)
                    gateway, images=open_store(settings.bundle_store) if settings.bundle_store
                    else None)
                await templates.open()  # the templates' profiles, before sessions of them
                if leftovers is not None:
                    await take_back(gateway, *leftovers)
                app.state.gateway = gateway
                app.state.snapshots = Snapshots(gateway)
                app.state.secrets = secrets
                await e2b.start(app, gateway)
                logger.info("replgate ready: %r, %r", pool, governance)
                # A gateway of nodes cannot tell their image's languages before a session
                # exists: the tools then say that the image decides.
                languages = await pool.languages("default")
                try:
                    async with mcp.run(languages):  # MCP sessions end (and their sessions go) first
                        yield
                finally:
                    await templates.close()
                    await gateway.drain()
                    await app.state.e2b.close()
                    await governance.close()
                    if tracing is not None:
                        await anyio.to_thread.run_sync(tracing.flush)

    app = FastAPI(title="replgate", version=__version__, lifespan=lifespan,
                  description="A hardened, persistent Python REPL for AI agents.")
    errors.install(app)
    bodies.install(app)
    draining.install(app)
    mcp = mcp_endpoint(settings)
    app.router.routes.append(Route("/mcp", mcp))  # MCP over streamable HTTP, same API keys
    for module in (health, sessions, contexts, files, ws, watch, jupyter, nodes, ui):
        app.include_router(module.router)
    app.include_router(governance_routes.router)  # /v1/approvals, /v1/sessions/{id}/egress
    app.include_router(network_routes.router)  # /v1/sessions/{id}/network
    app.include_router(snapshot_routes.router)  # /v1/snapshots, /v1/sessions/{id}/snapshots
    app.include_router(secret_routes.router)  # /v1/secrets: write-only, never read back
    app.include_router(template_routes.router)  # /v1/templates: custom templates, built here
    app.include_router(terminal_routes.router)  # /v1/sessions/{id}/terminal, command input
    app.include_router(folder_watch.router)  # /v1/sessions/{id}/files/watch
    e2b.install(app, settings.e2b_domain)  # /e2b and /e2b/sandbox: E2B's SDKs, unmodified
    if tracing is not None:
        tracing.instrument_app(app)
    return app
