"""The emulator's lifecycle, auth, error bodies, bases, seeded data shape and Python data API."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator, serve_forever
from asyncsearch.testing._requests import MAX_BODY_DEPTH

from .conftest import EMULATOR_KEY as KEY

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
PACKAGE = Path(__file__).resolve().parents[1] / "asyncsearch" / "testing"


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=200, n_jobs=50) as emulator:
        yield emulator


# ---------------------------------------------------------------- wire shapes from the spec


class Nullable:
    """A field the spec marks nullable, with the scalar type the emulator sends when set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner


NUMBER = (int, float)
USER = {"id": str, "name": Nullable(str), "pictureUrlCdn": Nullable(str)}
IMAGE = {"url": str, "width": Nullable(int), "height": Nullable(int), "mime": Nullable(str)}
FILE_REF = {"url": str, "size": Nullable(int), "mime": Nullable(str)}
CHUNK = {
    "text": str,
    "sequence": int,
    "pageNumber": int,
    "timeStart": NUMBER,
    "timeEnd": NUMBER,
    "score": NUMBER,
}
HIT = {
    "id": str,
    "kind": str,
    "mimeType": Nullable(str),
    "extension": Nullable(str),
    "name": Nullable(str),
    "description": Nullable(str),
    "size": Nullable(int),
    "url": str,
    "commentPinned": {
        "id": str,
        "content": str,
        "createdAt": str,
        "modifiedAt": str,
        "resourceId": str,
        "anonymousIdentity": {"displayName": Nullable(str), "sessionHash": Nullable(str)},
        "user": USER,
        "mentionedUsers": [USER],
    },
    "label": {"id": int, "hexColor": str},
    "parent": {"id": str, "name": Nullable(str)},
    "cover": IMAGE,
    "user": USER,
    "root": {
        "id": str,
        "type": str,
        "subtype": str,
        "isPrivate": bool,
        "folder": {
            "id": str,
            "name": Nullable(str),
            "isLocked": bool,
            "isPasswordProtected": bool,
            "user": USER,
        },
    },
    "stateProcessing": str,
    "originUrl": Nullable(str),
    "tags": [{"id": str, "name": str}],
    "chats": [
        {
            "id": str,
            "name": Nullable(str),
            "isPinned": bool,
            "createdAt": str,
            "modifiedAt": str,
            "agent": {"id": str},
        }
    ],
    "thumbnail": {"sm": str, "md": str, "lg": str, "xl": str, "original": str},
    "fileUrl": Nullable(str),
    "preferences": Nullable(str),
    "isPasswordProtected": bool,
    "isLocked": bool,
    "publishedAncestors": [{"resourceId": str, "accessToken": str}],
    "createdAt": str,
    "modifiedAt": str,
    "data": {
        "infected": bool,
        "documentPreview": {"html": Nullable(str)},
        "caption": Nullable(str),
        "keywords": [str],
        "attributes": {
            "document": {
                "pages": Nullable(int),
                "author": Nullable(str),
                "title": Nullable(str),
                "subject": Nullable(str),
                "keywords": Nullable(str),
                "producer": Nullable(str),
                "creator": Nullable(str),
                "security": Nullable(bool),
                "version": Nullable(str),
                "creationDate": Nullable(str),
                "modificationDate": Nullable(str),
                "documentType": str,
                "structured": Nullable(dict),
            },
            "dimensions": {"width": Nullable(int), "height": Nullable(int)},
            "cover": IMAGE,
        },
        "pdfRender": {"storagePath": str, "url": str},
    },
    "score": NUMBER,
    "chunks": [CHUNK],
    "embeddings": {"small3_512": [NUMBER], "clip2": [NUMBER]},
}
JOB = {
    "id": str,
    "workspaceId": str,
    "userId": str,
    "kind": str,
    "name": Nullable(str),
    "url": Nullable(str),
    "state": str,
    "createdAt": str,
    "extraction": {
        "common": {
            "mimeType": Nullable(str),
            "size": Nullable(int),
            "infected": bool,
            "caption": str,
            "keywords": [str],
            "thumbnail": str,
            "chunkCount": int,
        },
        "media": {
            "width": Nullable(int),
            "height": Nullable(int),
            "duration": Nullable(NUMBER),
            "codec": Nullable(str),
            "bitRate": Nullable(int),
            "frameRate": Nullable(NUMBER),
            "sampleRate": Nullable(int),
            "channels": Nullable(int),
            "color": {
                "profile": Nullable(str),
                "space": Nullable(str),
                "alphaChannel": Nullable(bool),
                "pixelFormat": Nullable(str),
            },
            "location": {"latitude": Nullable(NUMBER), "longitude": Nullable(NUMBER)},
            "device": {"maker": Nullable(str), "model": Nullable(str), "software": Nullable(str)},
            "dominantColors": [{"rgb": [int], "score": NUMBER}],
            "ocr": str,
            "screenshot": IMAGE,
            "transcript": FILE_REF,
        },
        "document": {
            "pages": int,
            "author": str,
            "title": str,
            "subject": str,
            "creator": str,
            "producer": str,
            "version": str,
            "security": bool,
            "creationDate": str,
            "modificationDate": str,
            "pdfRender": FILE_REF,
            "documentType": str,
            "structured": dict,
        },
        "web": {
            "title": str,
            "siteName": str,
            "description": str,
            "url": str,
            "image": IMAGE,
            "favicon": IMAGE,
            "html": FILE_REF,
            "reader": FILE_REF,
        },
    },
    "links": {"chunks": str, "download": str},
}
LOG_SUMMARY = {
    "id": str,
    "traceId": str,
    "attemptNumber": int,
    "status": str,
    "statusCode": Nullable(int),
    "errorMessage": Nullable(str),
    "firedAt": Nullable(str),
    "createdAt": str,
}
LOG_DETAIL = {**LOG_SUMMARY, "requestPayload": Nullable(str), "responseBody": Nullable(str)}


def check_shape(value: Any, shape: Any, path: str, nulls: dict[str, list[bool]]) -> None:
    """Assert ``value`` has exactly ``shape``; record per nullable path whether it was null."""
    if isinstance(shape, Nullable):
        nulls.setdefault(path, []).append(value is None)
        if value is not None:
            check_shape(value, shape.inner, path, nulls)
        return
    if isinstance(shape, dict):
        assert isinstance(value, dict), path
        assert set(value) == set(shape), (path, set(value) ^ set(shape))
        for key, sub in shape.items():
            check_shape(value[key], sub, f"{path}.{key}", nulls)
        return
    if isinstance(shape, list):
        assert isinstance(value, list), path
        for item in value:
            check_shape(item, shape[0], f"{path}[]", nulls)
        return
    if shape is dict:
        assert isinstance(value, dict), path
        return
    assert not isinstance(value, bool) or shape is bool, (path, value)
    assert isinstance(value, shape), (path, value, shape)


async def search(http: aiohttp.ClientSession, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    async with http.post("/v2/search", json=body, **kw) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "application/json"
        data: dict[str, Any] = await response.json()
        return data


async def all_hits(http: aiohttp.ClientSession, body: dict[str, Any]) -> list[dict[str, Any]]:
    hits: list[dict[str, Any]] = []
    page = 1
    while True:
        data = await search(http, {**body, "pagination": {"page": page, "pageSize": 100}})
        hits.extend(data["hits"])
        if not data["hasMore"]:
            return hits
        page += 1


# --------------------------------------------------------------------------- lifecycle


async def test_base_url_serves_on_a_free_loopback_port_until_stopped() -> None:
    emulator = ServiceEmulator(api_key=KEY)
    with pytest.raises(RuntimeError):
        _ = emulator.base_url
    await emulator.start()
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", emulator.base_url)
        assert emulator.port > 0
        with pytest.raises(RuntimeError):
            await emulator.start()
        async with (
            aiohttp.ClientSession(headers={"X-Api-Key": KEY}) as session,
            session.post(emulator.base_url + "/v2/search", json={}) as response,
        ):
            assert response.status == 200
            assert await response.json() == {"total": 0, "hasMore": False, "hits": []}
        url = emulator.base_url
    finally:
        await emulator.stop()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.post(url + "/v2/search", json={}):
                pass


async def test_two_emulators_get_different_ports_and_generated_keys() -> None:
    async with ServiceEmulator() as first, ServiceEmulator() as second:
        assert first.port != second.port
        assert first.api_key != second.api_key
        assert len(first.api_key) >= 24


async def test_serve_forever_reports_readiness_and_stops_when_cancelled() -> None:
    ready: asyncio.Queue[ServiceEmulator] = asyncio.Queue()
    task = asyncio.create_task(
        serve_forever(
            port=0, api_key=KEY, seed=1, n_resources=5, n_jobs=1, on_ready=ready.put_nowait
        )
    )
    try:
        async with asyncio.timeout(10):
            emulator = await ready.get()
        async with (
            aiohttp.ClientSession(headers={"X-Api-Key": KEY}) as session,
            session.post(emulator.base_url + "/v2/search", json={}) as response,
        ):
            assert (await response.json())["total"] == 5
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# -------------------------------------------------------------------------------- auth


ENDPOINT_REQUESTS = [
    ("POST", "/v2/search"),
    ("GET", "/v2/extract/{job}"),
    ("GET", "/v2/extract/{job}/webhook-logs"),
    ("GET", "/v2/extract/{job}/webhook-logs/{log}"),
    ("GET", "/v2/link?url=https%3A%2F%2Fwww.example.org%2Farticles%2Fharbor-sunset"),
    ("GET", "/_emulator/stats"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINT_REQUESTS)
@pytest.mark.parametrize("key", [None, "wrong-key", "test-key-but-longer", ""])
async def test_every_endpoint_refuses_a_missing_or_wrong_key_with_401(
    emu: ServiceEmulator, method: str, path: str, key: str | None
) -> None:
    job = next(j for j in emu.jobs() if emu.webhook_logs(j["id"]))
    log = emu.webhook_logs(job["id"])[0]
    headers = {} if key is None else {"X-Api-Key": key}
    async with (
        aiohttp.ClientSession(emu.base_url) as session,
        session.request(
            method, path.format(job=job["id"], log=log["id"]), headers=headers, json={}
        ) as response,
    ):
        assert response.status == 401
        body = await response.json()
    assert body["error"]["status"] == 401
    assert body["error"]["code"] == "unauthorized"
    assert KEY not in body["error"]["message"]


@pytest.mark.parametrize(("method", "path"), ENDPOINT_REQUESTS)
async def test_every_endpoint_accepts_the_right_key(
    http: aiohttp.ClientSession, emu: ServiceEmulator, method: str, path: str
) -> None:
    job = next(j for j in emu.jobs() if emu.webhook_logs(j["id"]))
    log = emu.webhook_logs(job["id"])[0]
    kwargs: dict[str, Any] = {"json": {}} if method == "POST" else {}
    async with http.request(
        method, path.format(job=job["id"], log=log["id"]), **kwargs
    ) as response:
        assert response.status == 200, await response.text()


# ------------------------------------------------------------------------- error bodies


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v2/nothing-here", 404, "not_found"),
        ("GET", "/v2/search", 405, "method_not_allowed"),
        ("DELETE", "/v2/extract/0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10", 405, "method_not_allowed"),
    ],
)
async def test_unknown_routes_and_methods_answer_with_the_json_error_body(
    http: aiohttp.ClientSession, method: str, path: str, status: int, code: str
) -> None:
    async with http.request(method, path) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        assert (status == 405) == ("Allow" in response.headers)
        body = await response.json()
    assert body == {
        "error": {
            "status": status,
            "code": code,
            "message": body["error"]["message"],
            "field": None,
        }
    }
    assert body["error"]["message"]


@pytest.mark.parametrize("raw", [b"", b"{not json", b'{"text": "a"', b"\xff\xfe"])
async def test_malformed_json_is_a_400_bad_request(http: aiohttp.ClientSession, raw: bytes) -> None:
    async with http.post(
        "/v2/search", data=raw, headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"]["code"] == "bad_request"


# Routes that read a JSON body: the search, and control routes decoding theirs the same way.
BODY_ROUTES = [
    "/v2/search",
    "/_emulator/resources",
    "/_emulator/faults",
    "/_emulator/jobs/{job}/webhook-logs",
]


async def post_raw(
    http: aiohttp.ClientSession, emu: ServiceEmulator, raw: bytes
) -> list[tuple[str, int, str, dict[str, Any]]]:
    """POST ``raw`` to every route of ``BODY_ROUTES``; return (route, status, type, body)."""
    job = emu.jobs()[0]["id"]
    answers = []
    for route in BODY_ROUTES:
        async with http.post(
            route.format(job=job), data=raw, headers={"Content-Type": "application/json"}
        ) as response:
            body = await response.json() if response.content_type == "application/json" else {}
            answers.append((route, response.status, response.content_type, body))
    return answers


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"text": "\xff\xfe"}', id="in-a-string"),
        pytest.param(b'{"\xff": 1}', id="in-a-key"),
        pytest.param(b'{"text": "caf\xc3"}', id="cut-short"),
        pytest.param(b'{"text": "\xc0\xaf"}', id="overlong"),
        pytest.param(b'{"text": "\xed\xa0\x80"}', id="encoded-surrogate"),
        pytest.param(b'{"filters": {"kinds": ["\xe9t\xe9"]}}', id="latin-1-in-a-filter"),
        pytest.param(b"\xff\xff", id="raw-bytes"),
    ],
)
async def test_a_body_that_is_not_utf8_is_a_400_not_a_500(
    http: aiohttp.ClientSession, emu: ServiceEmulator, raw: bytes
) -> None:
    for route, status, content_type, body in await post_raw(http, emu, raw):
        assert (route, status, content_type) == (route, 400, "application/json")
        assert body["error"]["code"] == "bad_request"
        assert "UTF-8" in body["error"]["message"] or "JSON" in body["error"]["message"]
    await search(http, {})  # still serving


def nested_arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(nested_arrays(1000), id="arrays"),
        pytest.param(nested_objects(1000), id="objects"),
        pytest.param('[{"a":' * 500 + "1" + "}]" * 500, id="arrays-and-objects"),
        pytest.param(nested_arrays(100_000), id="arrays-100000"),
        pytest.param(
            '{"text": "invoice", "filters": {"a": DEEP}}'.replace("DEEP", nested_arrays(1000)),
            id="in-an-unknown-filter",
        ),
        pytest.param(
            '{"text": "invoice", "filters": {"kinds": DEEP}}'.replace("DEEP", nested_arrays(1000)),
            id="in-kinds",
        ),
        pytest.param('{"queries": [DEEP]}'.replace("DEEP", nested_objects(1000)), id="in-queries"),
        pytest.param(
            '{"sort": {"field": "name", "x": DEEP}}'.replace("DEEP", nested_objects(1000)),
            id="in-sort",
        ),
        # Shallow enough to decode, deep enough to break copying or encoding afterwards.
        pytest.param(
            '{"text": "invoice", "x": DEEP}'.replace("DEEP", nested_arrays(500)),
            id="decodable-500",
        ),
        pytest.param(
            '{"resource": {"data": {"attributes": {"document": {"structured": DEEP}}}}}'.replace(
                "DEEP", nested_objects(500)
            ),
            id="decodable-500-in-a-resource",
        ),
    ],
)
async def test_a_body_nested_too_deep_is_a_400_not_a_500(
    http: aiohttp.ClientSession, emu: ServiceEmulator, text: str
) -> None:
    for route, status, content_type, body in await post_raw(http, emu, text.encode()):
        assert (route, status, content_type) == (route, 400, "application/json")
        assert body["error"]["code"] == "bad_request"
        assert str(MAX_BODY_DEPTH) in body["error"]["message"]
    await search(http, {})  # still serving


async def test_a_body_nested_exactly_as_deep_as_allowed_is_taken(
    http: aiohttp.ClientSession,
) -> None:
    # Five levels of wrappers (body, resource, data, attributes, document) hold structured.
    structured = json.loads(nested_objects(MAX_BODY_DEPTH - 5))
    for extra, status in ((0, 201), (1, 400)):
        value = [structured] if extra else structured
        async with http.post(
            "/_emulator/resources",
            json={"resource": {"data": {"attributes": {"document": {"structured": value}}}}},
        ) as response:
            assert response.status == status, await response.text()
            resource = await response.json()
        if status == 201:
            assert resource["data"]["attributes"]["document"]["structured"] == structured
    for depth, status in ((MAX_BODY_DEPTH - 1, 200), (MAX_BODY_DEPTH, 400)):
        raw = '{"text": "invoice", "x": DEEP}'.replace("DEEP", nested_arrays(depth)).encode()
        async with http.post("/v2/search", data=raw) as response:
            assert response.status == status, await response.text()


async def test_an_empty_base_header_names_no_base(http: aiohttp.ClientSession) -> None:
    # The spec only says the header is an optional string: empty, it is as if not sent.
    async with http.post("/v2/search", json={}, headers={"X-Service-Base-Id": " "}) as response:
        assert response.status == 200, await response.text()
        empty = await response.json()
    async with http.post("/v2/search", json={}) as response:
        assert empty == await response.json()


# --------------------------------------------------------------------------------- bases


async def test_data_is_scoped_per_base(http: aiohttp.ClientSession, emu: ServiceEmulator) -> None:
    in_base = emu.add_resource(name="Quokka field notes", base_id="base-a")
    job = emu.add_job(base_id="base-a", name="Quokka extraction")
    workspace = await search(http, {"text": "quokka"})
    base_a = await search(http, {"text": "quokka"}, headers={"X-Service-Base-Id": "base-a"})
    base_b = await search(http, {}, headers={"X-Service-Base-Id": "base-b"})
    assert workspace["total"] == 0
    assert [h["id"] for h in base_a["hits"]] == [in_base["id"]]
    assert base_b == {"total": 0, "hasMore": False, "hits": []}
    everything = await search(http, {}, headers={"X-Service-Base-Id": "base-a"})
    assert everything["total"] == 1  # the workspace's seeded resources are not in the base
    async with http.get(f"/v2/extract/{job['id']}") as response:
        assert response.status == 404
    async with http.get(
        f"/v2/extract/{job['id']}", headers={"X-Service-Base-Id": "base-a"}
    ) as response:
        assert response.status == 200
        assert (await response.json())["name"] == "Quokka extraction"


async def test_a_base_can_be_seeded_on_its_own(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    emu.seed(n_resources=12, n_jobs=3, seed=99, base_id="seeded")
    data = await search(http, {}, headers={"X-Service-Base-Id": "seeded"})
    assert data["total"] == 12
    assert len(emu.jobs("seeded")) == 3
    assert len(emu.resources()) == 200


# ---------------------------------------------------------------------- seeded data


async def test_seeded_hits_carry_every_spec_field_with_a_realistic_mix_of_nulls(
    http: aiohttp.ClientSession,
) -> None:
    hits = await all_hits(http, {"text": "report notes team review", "precision": 0.0})
    hits += await all_hits(http, {"precision": 0.0})
    assert len(hits) > 200
    nulls: dict[str, list[bool]] = {}
    for hit in hits:
        check_shape(hit, HIT, "hit", nulls)
        assert len(hit["embeddings"]["small3_512"]) == 512
        assert len(hit["embeddings"]["clip2"]) == 768
        assert UUID.match(hit["id"])
        for stamp in (hit["createdAt"], hit["modifiedAt"], hit["commentPinned"]["createdAt"]):
            assert TIMESTAMP.match(stamp)
    for path, seen in nulls.items():
        assert not all(seen), f"{path} is never set"
        assert any(seen), f"{path} is never null"
    chunked = [h for h in hits if h["chunks"]]
    assert chunked, "a text search quotes matching chunks"
    kinds = {h["kind"] for h in hits}
    assert {"document", "default", "image"} <= kinds


async def test_seeded_jobs_and_webhook_logs_carry_every_spec_field(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    nulls: dict[str, list[bool]] = {}
    statuses: set[str] = set()
    states: set[str] = set()
    attempts: list[int] = []
    for job in emu.jobs():
        async with http.get(f"/v2/extract/{job['id']}") as response:
            assert response.status == 200
            wire = await response.json()
        check_shape(wire, JOB, "job", nulls)
        states.add(wire["state"])
        for key in ("id", "workspaceId", "userId"):
            assert UUID.match(wire[key]), key
        assert TIMESTAMP.match(wire["createdAt"])
        async with http.get(f"/v2/extract/{job['id']}/webhook-logs") as response:
            assert response.status == 200
            listing = await response.json()
        assert set(listing) == {"items"}
        for item in listing["items"]:
            check_shape(item, LOG_SUMMARY, "log", nulls)
            async with http.get(f"/v2/extract/{job['id']}/webhook-logs/{item['id']}") as response:
                assert response.status == 200
                detail = await response.json()
            check_shape(detail, LOG_DETAIL, "log", nulls)
            assert {k: detail[k] for k in LOG_SUMMARY} == item
            assert UUID.match(item["id"])
            assert UUID.match(item["traceId"])
            assert TIMESTAMP.match(item["createdAt"])
            statuses.add(item["status"])
            attempts.append(item["attemptNumber"])
    for path, seen in nulls.items():
        assert not all(seen), f"{path} is never set"
        assert any(seen), f"{path} is never null"
    assert {"pending", "done"} <= states
    assert {"pending", "success", "failed"} <= statuses
    assert max(attempts) >= 3


async def test_the_same_seed_gives_identical_data_and_answers() -> None:
    body = {"text": "budget invoice", "pagination": {"pageSize": 5}}
    answers = []
    for _ in range(2):
        async with (
            ServiceEmulator(api_key=KEY, seed=11, n_resources=60, n_jobs=10) as emulator,
            aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as session,
            session.post("/v2/search", json=body) as response,
        ):
            answers.append(
                (
                    await response.read(),
                    emulator.resources(),
                    emulator.jobs(),
                    emulator.workspace_id,
                )
            )
    assert answers[0] == answers[1]
    other = ServiceEmulator(api_key=KEY, seed=12, n_resources=60, n_jobs=10)
    assert other.resources() != answers[0][1]
    assert other.workspace_id != answers[0][3]


def test_the_same_seed_gives_identical_data_in_another_process() -> None:
    # String hashing is randomised per process; seeded data must not depend on it.
    code = (
        "from asyncsearch.testing import ServiceEmulator\n"
        "import hashlib, json\n"
        "e = ServiceEmulator(seed=5, n_resources=30, n_jobs=5)\n"
        "blob = json.dumps([e.resources(), e.jobs(), [e.webhook_logs(j['id']) for j in e.jobs()]],"
        " sort_keys=True)\n"
        "print(hashlib.sha256(blob.encode()).hexdigest())\n"
    )
    root = str(PACKAGE.parents[1])
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            cwd=root,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": root},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(digests) == 1
    assert len(next(iter(digests))) == 64


def test_without_a_seed_the_store_is_empty() -> None:
    emulator = ServiceEmulator()
    assert emulator.resources() == []
    assert emulator.jobs() == []
    assert emulator.page_urls == []


# --------------------------------------------------------------------------- data API


def test_add_resource_fills_every_field_from_a_minimal_one() -> None:
    emulator = ServiceEmulator(api_key=KEY)
    resource = emulator.add_resource(
        name="Budget", label={"id": 3}, tags=["finance", {"name": "q3"}], chats=[{"name": "Ask"}]
    )
    nulls: dict[str, list[bool]] = {}
    extra = {"score": 0.5, "chunks": [], "embeddings": {"small3_512": [], "clip2": []}}
    check_shape({**resource, **extra}, HIT, "hit", nulls)
    assert resource["label"] == {"id": 3, "hexColor": "#00000000"}
    assert [t["name"] for t in resource["tags"]] == ["finance", "q3"]
    again = emulator.add_resource(name="Other", tags=["finance"])
    assert again["tags"][0]["id"] == resource["tags"][0]["id"], "tag ids are stable per name"
    assert resource["chats"][0]["name"] == "Ask"
    assert UUID.match(resource["chats"][0]["id"])
    assert UUID.match(resource["id"])
    assert TIMESTAMP.match(resource["createdAt"])


def test_add_resource_refuses_unknown_fields_unless_told_otherwise() -> None:
    emulator = ServiceEmulator()
    with pytest.raises(ValueError, match="created_at"):
        emulator.add_resource(created_at="2024-01-01T00:00:00.000Z")
    with pytest.raises(ValueError, match=r"label\.colour"):
        emulator.add_resource(label={"colour": "red"})
    with pytest.raises(ValueError, match="score"):
        emulator.add_resource(score=1.0)
    loose = emulator.add_resource({"futureField": 1}, strict=False)
    assert loose["futureField"] == 1
    first = emulator.add_resource(id="0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10")
    with pytest.raises(ValueError, match="already exists"):
        emulator.add_resource(id=first["id"])


def test_add_job_and_logs_fill_every_field_and_number_attempts() -> None:
    emulator = ServiceEmulator()
    job = emulator.add_job(state="done", extraction={"common": {"caption": "A cat"}})
    nulls: dict[str, list[bool]] = {}
    check_shape(job, JOB, "job", nulls)
    assert job["extraction"]["common"]["caption"] == "A cat"
    assert job["workspaceId"] == emulator.workspace_id
    first = emulator.add_webhook_log(job["id"], status="failed", statusCode=503)
    second = emulator.add_webhook_log(job["id"])
    check_shape(first, LOG_DETAIL, "log", nulls)
    assert (first["attemptNumber"], second["attemptNumber"]) == (1, 2)
    assert (first["status"], first["statusCode"]) == ("failed", 503)
    with pytest.raises(KeyError):
        emulator.add_webhook_log("0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10")
    with pytest.raises(ValueError, match=r"extraction\.common\.captoin"):
        emulator.add_job(extraction={"common": {"captoin": "typo"}})
    free = emulator.add_job(extraction={"document": {"structured": {"anything": [1, 2]}}})
    assert free["extraction"]["document"]["structured"] == {"anything": [1, 2]}


def test_returned_items_are_copies() -> None:
    emulator = ServiceEmulator()
    resource = emulator.add_resource(name="Original")
    resource["name"] = "Changed"
    assert emulator.resource(resource["id"])["name"] == "Original"
    emulator.resources()[0]["name"] = "Changed"
    assert emulator.resource(resource["id"])["name"] == "Original"


# ------------------------------------------------------------------------ HTTP control API


async def test_data_can_be_added_over_http(http: aiohttp.ClientSession) -> None:
    async with http.post(
        "/_emulator/resources",
        json={"resource": {"name": "Axolotl care guide"}, "text": "axolotl water temperature"},
        headers={"X-Service-Base-Id": "remote"},
    ) as response:
        assert response.status == 201
        resource = await response.json()
    data = await search(http, {"text": "axolotl"}, headers={"X-Service-Base-Id": "remote"})
    assert [h["id"] for h in data["hits"]] == [resource["id"]]
    async with http.post("/_emulator/jobs", json={"job": {"state": "pending"}}) as response:
        assert response.status == 201
        job = await response.json()
    async with http.post(
        f"/_emulator/jobs/{job['id']}/webhook-logs", json={"log": {"status": "failed"}}
    ) as response:
        assert response.status == 201
    async with http.get(f"/v2/extract/{job['id']}/webhook-logs") as response:
        assert [i["status"] for i in (await response.json())["items"]] == ["failed"]
    async with http.post(
        "/_emulator/pages", json={"url": "https://x.example.org/", "html": "<title>X</title>"}
    ) as response:
        assert response.status == 201
    async with http.get("/v2/link", params={"url": "https://x.example.org/"}) as response:
        assert (await response.json())["title"] == "X"
    async with http.post("/_emulator/resources", json={"resource": {"nmae": "typo"}}) as response:
        assert response.status == 422
    async with http.post(
        "/_emulator/seed",
        json={"nResources": 4, "nJobs": 0, "seed": 3},
        headers={"X-Service-Base-Id": "remote-seeded"},
    ) as response:
        assert response.status == 201
        assert await response.json() == {"resources": 4}


# ---------------------------------------------------------------------- import rules


def test_the_emulator_imports_nothing_from_the_sdk() -> None:
    # The emulator writes the wire format itself, so an SDK decoding mistake cannot hide.
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1, f"{path.name} imports from outside the package"
                    continue
                names = [node.module or ""]
            for name in names:
                assert not name.startswith("asyncsearch") or name.startswith(
                    "asyncsearch.testing"
                ), f"{path.name} imports {name}"
    plugin = (PACKAGE / "pytest_plugin.py").read_text()
    assert 'import_module("asyncsearch")' in plugin  # the client is imported lazily only


def test_importing_the_package_does_not_import_the_emulator() -> None:
    code = "import sys, asyncsearch; print(sorted(m for m in sys.modules if 'testing' in m))"
    root = str(PACKAGE.parents[1])
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=root,
        env={"PYTHONPATH": root},
    )
    assert "asyncsearch.testing" not in result.stdout
