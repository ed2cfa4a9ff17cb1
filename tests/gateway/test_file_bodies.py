"""The files API's bodies: gzip uploads inflated under the upload cap, downloads gzipped when
the client takes it and the file compresses."""

from __future__ import annotations

import gzip
import os
import zlib

import httpx

from tests.conftest import GatewayProcess


def test_a_gzip_upload_is_inflated_and_a_download_gzipped_on_request(
        alpha: httpx.Client, session_id: str) -> None:
    text = b"a line that compresses well\n" * 4000
    put = alpha.put(f"/v1/sessions/{session_id}/files/gz/text.txt", content=gzip.compress(text),
                    headers={"Content-Encoding": "gzip"})
    assert put.status_code == 201, put.text
    assert put.json() == {"path": "gz/text.txt", "size": len(text)}
    raw = alpha.get(f"/v1/sessions/{session_id}/files/gz/text.txt",
                    headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip" and raw.content == text  # httpx inflates
    assert int(raw.headers["content-length"]) < len(text) // 10
    plain = alpha.get(f"/v1/sessions/{session_id}/files/gz/text.txt",
                      headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in plain.headers and plain.content == text
    noise = os.urandom(200_000)  # does not compress: sent as it is
    alpha.put(f"/v1/sessions/{session_id}/files/gz/noise.bin", content=noise)
    got = alpha.get(f"/v1/sessions/{session_id}/files/gz/noise.bin",
                    headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in got.headers and got.content == noise


def test_a_gzip_bomb_or_a_broken_body_is_refused(alpha: httpx.Client, session_id: str,
                                                 gateway: GatewayProcess) -> None:
    limit = int(gateway.env.get("REPLGATE_MAX_UPLOAD_BYTES", 100 * 2**20))
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(squeeze.compress(b"\x00" * 2**20) for _ in range(limit // 2**20 + 1))
    bomb += squeeze.flush()
    answer = alpha.put(f"/v1/sessions/{session_id}/files/bomb.bin", content=bomb,
                       headers={"Content-Encoding": "gzip"})
    assert answer.status_code == 413, answer.text
    assert answer.json()["detail"] == f"upload is over the limit of {limit} bytes"
    for body, encoding, sentence in (
            (b"plain text", "gzip", "not valid gzip"),
            (gzip.compress(b"x" * 1000)[:-12], "gzip", "cut short"),
            (b"x", "br", "Content-Encoding 'br' is not accepted")):
        answer = alpha.put(f"/v1/sessions/{session_id}/files/bad.bin", content=body,
                           headers={"Content-Encoding": encoding})
        assert answer.status_code == 400 and sentence in answer.json()["detail"], answer.text
    listed = {f["path"] for f in alpha.get(f"/v1/sessions/{session_id}/files").json()}
    assert not {"bomb.bin", "bad.bin"} & listed
