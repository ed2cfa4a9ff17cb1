"""The SeaweedFS server the bundle tests run against (started in ``conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from kernel_pool.bundles import BundleInfo, Bundles

BUCKET = "bundles"
INFO = BundleInfo(paused_with="variables", image_digest="sha256:" + "0" * 64)
"""What the tests' bundles state about themselves."""


@dataclass
class SeaweedFS:
    s3_url: str
    filer_url: str

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
