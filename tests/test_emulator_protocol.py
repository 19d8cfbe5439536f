"""Every answer the emulator gives is JSON in its error shape with an X-Request-Id, even for
requests aiohttp's parser used to answer in plain text; what aiohttp still answers itself (before
the app can) is pinned down here too."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import uuid
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import asyncsearch
from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator, fake_image_data_url
from asyncsearch.testing._emulator import MAX_HEADERS, MAX_LINE_BYTES

from .conftest import EMULATOR_KEY as KEY

ANY_UUID = "0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10"
SEARCH = {"text": "invoice"}


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=50, n_jobs=0) as emulator:
        yield emulator


async def error_of(response: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    """Check an answer is a JSON error of this status with a request id; return its body."""
    text = await response.text()
    assert response.status == status, text
    assert response.content_type == "application/json", text
    uuid.UUID(response.headers["X-Request-Id"])
    body: dict[str, Any] = json.loads(text)
    assert body["error"]["status"] == status
    return body["error"]


# ------------------------------------------------------------------- content codings


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_body_that_is_not_what_its_content_encoding_says_is_a_json_400(
    http: aiohttp.ClientSession, coding: str
) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with http.post("/v2/search", data=b'{"text":"invoice"}', headers=headers) as response:
        error = await error_of(response, 400)
    assert f"not {coding} data" in error["message"]
    assert error["field"] == "Content-Encoding"


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # RFC 1950, what HTTP's deflate names
        ("deflate", lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS)),  # raw RFC 1951
        ("identity", lambda data: data),
    ],
)
async def test_compressed_bodies_are_searched_like_plain_ones(
    http: aiohttp.ClientSession, coding: str, encode: Any
) -> None:
    plain = json.dumps(SEARCH).encode()
    async with http.post("/v2/search", json=SEARCH) as response:
        expected = await response.json()
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with http.post("/v2/search", data=encode(plain), headers=headers) as response:
        assert response.status == 200, await response.text()
        got = await response.json()
    assert [h["id"] for h in got["hits"]] == [h["id"] for h in expected["hits"]]


async def test_a_gzip_body_over_the_cap_once_inflated_is_a_413(
    http: aiohttp.ClientSession,
) -> None:
    from asyncsearch.testing._requests import MAX_BODY_BYTES

    bomb = gzip.compress(b'{"text":"' + b" " * MAX_BODY_BYTES + b'"}')
    assert len(bomb) < MAX_BODY_BYTES // 100
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with http.post("/v2/search", data=bomb, headers=headers) as response:
        await error_of(response, 413)


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, br"])
async def test_an_unsupported_content_coding_is_a_json_415_naming_the_accepted_ones(
    http: aiohttp.ClientSession, coding: str
) -> None:
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with http.post("/v2/search", data=b'{"text":"x"}', headers=headers) as response:
        error = await error_of(response, 415)
        assert response.headers["Accept-Encoding"] == "gzip, deflate"
    assert error["field"] == "Content-Encoding"


# ---------------------------------------------------------------------------- methods


async def test_a_method_no_route_serves_is_a_json_501_and_a_misplaced_one_a_405(
    http: aiohttp.ClientSession,
) -> None:
    async with http.request("PROPFIND", "/v2/search") as response:
        error = await error_of(response, 501)
        assert response.headers["Allow"] == "POST"
    assert "PROPFIND" in error["message"]
    async with http.request("PATCH", "/v2/search") as response:
        await error_of(response, 405)
        assert response.headers["Allow"] == "POST"


async def test_a_method_llhttp_does_not_know_is_answered_by_aiohttp_before_the_app(
    http: aiohttp.ClientSession,
) -> None:
    # aiohttp's C parser (llhttp) refuses a method outside its list while parsing, with a
    # plain-text 400 that no application hook sees; its pure-Python parser
    # (AIOHTTP_NO_EXTENSIONS=1) lets it through to the emulator's JSON 501.
    async with http.request("FOO", "/v2/search") as response:
        if "X-Request-Id" in response.headers:
            await error_of(response, 501)
        else:
            assert response.status == 400
            assert response.content_type == "text/plain"


# ----------------------------------------------------------------------- header sizes


async def test_an_oversized_header_or_target_is_a_json_431_or_414(
    http: aiohttp.ClientSession,
) -> None:
    params = {"url": "https://example.com/a"}
    big = "a" * (MAX_LINE_BYTES + 1)
    async with http.get("/v2/link", params=params, headers={"X-Big": big}) as response:
        error = await error_of(response, 431)
    assert error["field"] == "X-Big"
    async with http.get("/v2/link", params=params, headers={"X-Big": big[:-1]}) as response:
        assert response.status == 200  # exactly at the limit
    async with http.get("/v2/link", params={"url": "https://example.com/" + big}) as response:
        await error_of(response, 414)
    many = {f"X-Extra-{i}": "1" for i in range(MAX_HEADERS + 1)}
    async with http.get("/v2/link", params=params, headers=many) as response:
        await error_of(response, 431)


async def test_a_header_far_over_the_limit_is_answered_by_aiohttp_before_the_app(
    http: aiohttp.ClientSession,
) -> None:
    # Past 8 times the limit aiohttp's parser refuses the request itself, in plain text.
    huge = "a" * (8 * MAX_LINE_BYTES + 1)
    async with http.get("/v2/link", params={"url": "x:y"}, headers={"X-Big": huge}) as response:
        assert response.status == 400
        assert response.content_type == "text/plain"
        assert "X-Request-Id" not in response.headers


# ----------------------------------------------------------------- duplicate headers


@pytest.mark.parametrize("keys", [(KEY, "wrong"), ("wrong", KEY), (KEY, KEY)])
async def test_two_api_keys_are_refused_whatever_their_order(
    emu: ServiceEmulator, keys: tuple[str, str]
) -> None:
    headers = [("X-Api-Key", keys[0]), ("X-Api-Key", keys[1])]
    async with (
        aiohttp.ClientSession(emu.base_url) as http,
        http.get("/v2/link", params={"url": "x:y"}, headers=headers) as response,
    ):
        error = await error_of(response, 401)
    assert "one X-Api-Key" in error["message"]
    assert KEY not in json.dumps(error)


async def test_two_base_ids_are_a_400(http: aiohttp.ClientSession) -> None:
    headers = [("X-Service-Base-Id", "a"), ("X-Service-Base-Id", "b")]
    async with http.post("/v2/search", json=SEARCH, headers=headers) as response:
        error = await error_of(response, 400)
    assert error["field"] == "X-Service-Base-Id"


# --------------------------------------------------------------------- image data URLs


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize(
    "url",
    [
        "data:text/plain;base64," + base64.b64encode(b"invoice").decode(),
        "data:;base64," + base64.b64encode(b"invoice").decode(),
        "data:application/pdf;base64,JVBERi0=",
    ],
)
async def test_an_image_must_have_an_image_media_type(strict: bool, url: str) -> None:
    async with (
        ServiceEmulator(api_key=KEY, seed=7, n_resources=50, n_jobs=0, strict=strict) as emu,
        aiohttp.ClientSession(emu.base_url, headers={"X-Api-Key": KEY}) as http,
        http.post("/v2/search", json={"image": url}) as response,
    ):
        error = await error_of(response, 422)
    assert error["field"] == "image"
    assert "image/<subtype>" in error["message"]


async def test_unpadded_base64_is_read_unless_strict() -> None:
    padded = fake_image_data_url("guitar concert")  # 14 bytes: base64 ends with "="
    assert padded.endswith("=")
    unpadded = padded.rstrip("=")
    for strict in (False, True):
        async with (
            ServiceEmulator(api_key=KEY, seed=7, n_resources=50, n_jobs=0, strict=strict) as emu,
            aiohttp.ClientSession(emu.base_url, headers={"X-Api-Key": KEY}) as http,
        ):
            async with http.post("/v2/search", json={"image": padded}) as response:
                expected = await response.json()
                assert response.status == 200
            async with http.post("/v2/search", json={"image": unpadded}) as response:
                if strict:
                    error = await error_of(response, 422)
                    assert "padded" in error["message"]
                else:
                    assert response.status == 200, await response.text()
                    assert await response.json() == expected


@pytest.mark.parametrize(
    "payload", ["QQ=", "QUJD=", "Q", "QQ==QQ==", "QQ===", "QQ*="], ids=lambda p: repr(p)
)
async def test_malformed_base64_is_a_422(http: aiohttp.ClientSession, payload: str) -> None:
    body = {"image": "data:image/png;base64," + payload}
    async with http.post("/v2/search", json=body) as response:
        if payload == "QQ=":  # a partial padding: read like the unpadded form
            assert response.status == 200
            return
        error = await error_of(response, 422)
    assert "base64" in error["message"]


# ---------------------------------------------------------------------- request ids


async def test_every_answer_carries_its_own_request_id(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    emu.faults.script("link", [503])
    ids: list[str] = []
    requests: list[tuple[str, str, dict[str, str]]] = [
        ("GET", "/v2/link?url=x:y", {}),  # 503 (the scripted fault)
        ("GET", "/v2/link?url=x:y", {}),  # 200
        ("GET", f"/v2/extract/{ANY_UUID}", {}),  # 404
        ("GET", "/v2/link?url=x:y", {"X-Api-Key": "wrong"}),  # 401
        ("GET", "/nowhere", {}),  # 404 without a route
        ("POST", "/v2/search", {"Content-Encoding": "br"}),  # 415
        ("GET", "/_emulator/stats", {}),  # a control endpoint
    ]
    statuses = []
    for method, path, headers in requests:
        async with http.request(method, path, headers=headers, data=b"{}") as response:
            statuses.append(response.status)
            assert response.content_type == "application/json"
            ids.append(response.headers["X-Request-Id"])
    assert statuses == [503, 200, 404, 401, 404, 415, 200]
    assert len({str(uuid.UUID(i)) for i in ids}) == len(ids)


async def test_a_faulted_slow_body_carries_a_request_id(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    emu.faults.script("link", ["slow"])
    async with http.get("/v2/link", params={"url": "x:y"}) as response:
        assert response.status == 200
        uuid.UUID(response.headers["X-Request-Id"])
        await response.read()


async def test_the_sdk_reads_the_emulator_s_request_ids(emu: ServiceEmulator) -> None:
    async with AsyncSearchClient(api_key=emu.api_key, base_url=emu.base_url) as client:
        first = await client.with_raw_response.search("invoice")
        second = await client.with_raw_response.link_preview("https://example.com/a")
        assert first.request_id is not None
        assert second.request_id is not None
        assert first.request_id != second.request_id
        uuid.UUID(first.request_id)
        with pytest.raises(asyncsearch.NotFoundError) as caught:
            await client.get_extraction(ANY_UUID)
    assert caught.value.request_id is not None
    uuid.UUID(caught.value.request_id)
    assert caught.value.request_id in str(caught.value)


# ---------------------------------------------------------------------- emulator bugs


async def test_an_emulator_failure_is_a_json_500_with_the_traceback_logged(
    emu: ServiceEmulator,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(base_id: str | None) -> Any:
        raise RuntimeError("a bug in the emulator")

    monkeypatch.setattr(emu.store, "base", broken)
    with caplog.at_level(logging.ERROR, logger="asyncsearch.testing"):
        async with http.post("/v2/search", json=SEARCH) as response:
            await error_of(response, 500)
    assert any(r.exc_info and "a bug in the emulator" in str(r.exc_info[1]) for r in caplog.records)


async def test_a_client_that_goes_away_mid_image_search_leaves_the_emulator_serving(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    body = {"image": "data:image/png;base64," + base64.b64encode(bytes(300_000)).decode()}
    emu.faults.hold("search")
    task = asyncio.create_task(http.post("/v2/search", json=body))
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(1, "search")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    emu.faults.release("search")
    async with http.post("/v2/search", json=body) as response:
        assert response.status == 200
