"""The emulator's edges: memory bounded by bytes, connections that never finish a request,
the listen backlog, parser-level bad requests, and promises no other test guards."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import logging
import re
import select
import signal
import socket
import time
import uuid
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator, _emulator
from asyncsearch.testing._emulator import (
    IDLE_TIMEOUT,
    LISTEN_BACKLOG,
    MAX_LINE_BYTES,
    BoundedLog,
)

from .cli_helpers import cli_env, finish, start_cli
from .conftest import EMULATOR_KEY as KEY
from .helpers import TIME_SCALE

#: A bound on anything these tests wait for (a liveness bound, never a speed expectation).
WAIT = 20.0 * TIME_SCALE
#: A short idle_timeout, so that a test sees a stalled connection closed without a minute's wait.
SHORT = 0.3
IMAGE_CHARS = 600_000
IMAGE_PREFIX = "data:image/x-png;base64,"


def big_image_url(index: int) -> str:
    """A distinct data URL of IMAGE_CHARS characters (the spec's limit for search.image)."""
    n_bytes = (IMAGE_CHARS - len(IMAGE_PREFIX)) // 4 * 3
    data = index.to_bytes(8, "big") * (n_bytes // 8) + b"\0" * (n_bytes % 8)
    return IMAGE_PREFIX + base64.b64encode(data).decode("ascii")


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=20, n_jobs=2) as emulator:
        yield emulator


@pytest.fixture
async def http(emu: ServiceEmulator) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        emu.base_url,
        headers={"X-Api-Key": KEY},
        timeout=aiohttp.ClientTimeout(total=WAIT),
    ) as session:
        yield session


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded by WAIT); a close
    with bytes of ours still unread there arrives as a reset."""
    async with asyncio.timeout(WAIT):
        try:
            return await reader.read()
        except ConnectionResetError:
            return b""


# ------------------------------------------------------------------ memory, by bytes


async def test_the_search_history_keeps_a_digest_of_a_large_image_not_the_image(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    image = big_image_url(1)
    body = {"text": "invoice", "image": image, "pagination": {"pageSize": 2}}
    async with http.post("/v2/search", json=body) as response:
        assert response.status == 200, await response.text()
    kept = emu.search_history[-1].body
    assert kept["text"] == "invoice"
    assert kept["pagination"] == {"pageSize": 2}
    digest = hashlib.sha256(image.encode()).hexdigest()
    assert kept["image"] == f"<{len(image):,} characters, sha256 {digest}>"


async def test_the_search_history_keeps_a_long_string_in_a_list_as_its_digest(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    """Not only a body's top-level strings: one inside a list (here of a field the lenient mode
    ignores) is kept as its length and digest too, its short neighbours as they are."""
    long = "q" * 5_000
    body = {"text": "invoice", "labels": ["short", long, {"deeper": [long]}]}
    async with http.post("/v2/search", json=body) as response:
        assert response.status == 200, await response.text()
    kept = emu.search_history[-1].body
    shown = f"<5,000 characters, sha256 {hashlib.sha256(long.encode()).hexdigest()}>"
    assert kept == {"text": "invoice", "labels": ["short", shown, {"deeper": [shown]}]}


async def test_the_search_history_keeps_a_string_of_1024_characters_whole(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    """Only strings over 1,024 characters are replaced by their digest."""
    whole, over = "w" * 1_024, "o" * 1_025
    async with http.post("/v2/search", json={"text": "a", "whole": whole, "over": over}) as resp:
        assert resp.status == 200, await resp.text()
    kept = emu.search_history[-1].body
    assert kept["whole"] == whole
    assert kept["over"] == f"<1,025 characters, sha256 {hashlib.sha256(over.encode()).hexdigest()}>"


async def test_the_search_history_and_the_request_log_are_capped_by_bytes(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    history, log = emu.search_history, emu.stats.requests
    assert isinstance(history, BoundedLog)
    assert isinstance(log, BoundedLog)
    assert history.max_bytes == _emulator.MAX_SEARCH_HISTORY_BYTES
    assert log.max_bytes == _emulator.MAX_RECORDED_BYTES
    history.max_bytes, log.max_bytes = 4_000, 6_000
    for i in range(40):
        text = f"{i:03d} " + "x" * 200
        async with http.post("/v2/search", json={"text": text}) as response:
            assert response.status == 200
    history = list(emu.search_history)
    assert 0 < len(history) < 40
    assert history[-1].body["text"].startswith("039 ")  # the latest are kept
    assert sum(len(json.dumps(r.body)) for r in history) <= 4_000
    assert emu.stats.count() == 40  # counts stay exact
    assert 0 < len(emu.requests) < 40
    assert emu.requests[-1].endpoint == "search"


def _rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1)) * 1024


EXPORT_LINE = re.compile(
    r"export ASYNCSEARCH_BASE_URL=(?P<url>\S+) ASYNCSEARCH_API_KEY=(?P<key>\S+)"
)


async def _serve_banner(process: asyncio.subprocess.Process) -> str:
    """What ``asyncsearch serve`` printed, up to the last line of its banner."""
    assert process.stdout is not None
    banner = b""
    async with asyncio.timeout(WAIT):
        while b"Press Ctrl-C" not in banner:
            banner += await process.stdout.readline()
    return banner.decode()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from Linux's /proc")
@pytest.mark.timeout(300)
async def test_serve_holds_its_memory_after_300_distinct_image_searches() -> None:
    process = await start_cli("serve", "--port", "0", "--jobs", "0", env=cli_env())
    try:
        banner = await _serve_banner(process)
        found = EXPORT_LINE.search(banner)
        assert found is not None, banner
        start = _rss_bytes(process.pid)
        async with aiohttp.ClientSession(
            found["url"],
            headers={"X-Api-Key": found["key"], "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=120 * TIME_SCALE),
        ) as http:
            limit = asyncio.Semaphore(20)

            async def image_search(index: int) -> None:
                body = json.dumps({"image": big_image_url(index), "precision": 0})
                async with limit, http.post("/v2/search", data=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

            async with asyncio.timeout(240 * TIME_SCALE):
                await asyncio.gather(*(image_search(i) for i in range(300)))
        after = _rss_bytes(process.pid)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        served = await finish(process)
    assert served.code == 0, served.stderr
    grown = after - start
    print(f"serve RSS: {start / 2**20:.0f} MB at start, {after / 2**20:.0f} MB after")
    # 300 bodies of 600 KB kept would be 180 MB (the history kept each whole: 62 -> 560 MB).
    assert grown < 150 * 2**20, f"RSS grew by {grown / 2**20:.0f} MB"


# ------------------------------------------------- connections that never finish a request


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /v2/li", b"GET /v2/link?url=x:y HTTP/1.1\r\nHost: x\r\nX-Api-Ke"],
    ids=["nothing", "half a request line", "unfinished headers"],
)
async def test_a_connection_that_does_not_complete_a_request_is_closed(sent: bytes) -> None:
    async with ServiceEmulator(api_key=KEY, idle_timeout=SHORT) as emu:
        reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
        try:
            writer.write(sent)
            await writer.drain()
            assert await closed_by_server(reader) == b""
        finally:
            writer.close()


async def test_a_request_sent_a_byte_at_a_time_is_closed_all_the_same() -> None:
    """Each byte arriving does not push the deadline back (a slow-loris client)."""
    async with ServiceEmulator(api_key=KEY, idle_timeout=SHORT) as emu:
        reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
        request = b"GET /v2/link?url=x:y HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 100_000
        closed = asyncio.create_task(closed_by_server(reader))
        try:
            async with asyncio.timeout(WAIT):
                for byte in request:
                    if closed.done():
                        break
                    writer.write(bytes([byte]))
                    try:
                        await writer.drain()
                    except ConnectionError:
                        break
                    # The pace of the drip: a byte far more often than the allowance.
                    await asyncio.wait({closed}, timeout=SHORT / 10)
                assert await closed == b""
        finally:
            closed.cancel()
            writer.close()


async def test_half_a_body_is_a_json_408_and_the_connection_closed() -> None:
    async with ServiceEmulator(api_key=KEY, idle_timeout=SHORT) as emu:
        reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
        head = (
            "POST /v2/search HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + KEY + "\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        try:
            writer.write(head.encode() + b'{"text": ')
            await writer.drain()
            answer = await closed_by_server(reader)
        finally:
            writer.close()
    head_part, _, body = answer.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 408 "), answer
    assert re.search(rb"(?im)^X-Request-Id: [0-9a-f-]{36}$", head_part), answer
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def test_a_request_held_by_the_emulator_is_never_closed_as_idle() -> None:
    async with (
        ServiceEmulator(api_key=KEY, seed=7, n_resources=5, n_jobs=1, idle_timeout=SHORT) as emu,
        aiohttp.ClientSession(emu.base_url, headers={"X-Api-Key": KEY}) as http,
    ):
        emu.faults.hold("extract")
        job = emu.jobs()[0]["id"]
        held = asyncio.create_task(http.get(f"/v2/extract/{job}"))
        async with asyncio.timeout(WAIT):
            await emu.faults.wait_parked(1, "extract")
        # A connection opened after the held one is closed: the held one's allowance is over
        # too. A second such round leaves the loop time to act on a close of the held one.
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
            try:
                assert await closed_by_server(reader) == b""
            finally:
                writer.close()
        emu.faults.release("extract")
        async with asyncio.timeout(WAIT):
            response = await held
        assert response.status == 200
        response.release()


@pytest.mark.timeout(30)
async def test_a_keep_alive_connection_that_keeps_sending_is_never_closed() -> None:
    """A request every 0.3 s on one connection, with ``idle_timeout=2``: past the allowance
    (an idle connection opened after it is closed meanwhile) and a few looks more, every request
    went on that one connection."""
    opened: list[object] = []

    async def count(session: object, context: object, params: object) -> None:
        opened.append(params)

    tracing = aiohttp.TraceConfig()
    tracing.on_connection_create_end.append(count)
    async with (
        ServiceEmulator(api_key=KEY, seed=7, n_resources=5, n_jobs=1, idle_timeout=2) as emu,
        aiohttp.ClientSession(
            emu.base_url, headers={"X-Api-Key": KEY}, trace_configs=[tracing]
        ) as http,
    ):
        job = emu.jobs()[0]["id"]

        async def get() -> None:
            async with http.get(f"/v2/extract/{job}") as response:
                assert response.status == 200

        await get()
        # Opened after the kept connection, idle: once it is closed, the kept one has gone past
        # the allowance too, had its requests not counted.
        reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
        idle_closed = asyncio.create_task(closed_by_server(reader))
        try:
            async with asyncio.timeout(WAIT):
                while not idle_closed.done():
                    await asyncio.wait({idle_closed}, timeout=0.3)  # the client's own pace
                    await get()
                assert await idle_closed == b""
                for _ in range(4):  # a few looks of the sweeper more (one every 0.2 s)
                    await asyncio.sleep(0.3)
                    await get()
        finally:
            idle_closed.cancel()
            writer.close()
    assert len(opened) == 1


def test_the_default_bound_is_the_documented_60_seconds() -> None:
    emu = ServiceEmulator(api_key=KEY)
    assert emu.idle_timeout == IDLE_TIMEOUT
    # Found at the first sweep after it opens, closed at the first sweep past the allowance.
    assert IDLE_TIMEOUT * (1 + 2 / _emulator.SWEEPS_PER_IDLE_TIMEOUT) <= 60
    doc = " ".join((ServiceEmulator.__doc__ or "").split())
    assert "closed within 60 s" in doc
    assert f"idle_timeout={IDLE_TIMEOUT:g}" in doc


async def test_a_full_backlog_of_400_simultaneous_connects_is_taken(emu: ServiceEmulator) -> None:
    """400 clients connect at once while the emulator's loop is busy (here: blocked by this
    test, so nothing is accepted): with aiohttp's backlog of 128 the kernel drops the others'
    handshakes and they wait for a retransmission (a second or more) instead of connecting."""
    if _somaxconn() < 400:
        pytest.skip("the kernel caps listen backlogs below 400 (net.core.somaxconn)")
    assert LISTEN_BACKLOG >= 400
    # Blocking on purpose: the emulator's event loop must not run (and accept) meanwhile.
    _connect_400_without_accepting(emu.port)


def _somaxconn() -> int:
    """The kernel's cap on a listen backlog (0 where it cannot be read)."""
    path = Path("/proc/sys/net/core/somaxconn")
    return int(path.read_text()) if path.exists() else 0


def _connect_400_without_accepting(port: int) -> None:
    sockets = []
    try:
        poller = select.poll()
        for _ in range(400):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
            poller.register(sock, select.POLLOUT)
        pending = {sock.fileno() for sock in sockets}
        deadline = time.monotonic() + WAIT / 2
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(100):
                pending.discard(fd)
                poller.unregister(fd)
        assert not pending, f"{len(pending)} of 400 connects did not complete"
        assert all(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


# ------------------------------------------------------- parser-level bad requests

BAD_REQUESTS = {
    "a NUL in a header value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "Content-Length with chunked": (
        b"POST /v2/search HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "a bad chunk size": (
        b"POST /v2/search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n"
    ),
    "a garbage request line": b"\x16\x03\x01 hello\r\n\r\n",
    "an HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "a method llhttp does not know": b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("data", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
async def test_a_parser_level_bad_request_logs_one_line_not_a_traceback(
    emu: ServiceEmulator, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await closed_by_server(reader)
    finally:
        writer.close()
    # aiohttp answers these itself (see the README): plain text, before the app.
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n"), answer
    assert b"text/plain" in answer
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "asyncsearch"))]
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    assert record.exc_info is None
    assert record.exc_text is None
    message = record.getMessage()
    assert "\n" not in message
    assert message.startswith("bad request from 127.0.0.1"), message


async def test_serve_prints_no_traceback_for_a_bad_request() -> None:
    process = await start_cli("serve", "--port", "0", "--jobs", "0", env=cli_env())
    try:
        banner = await _serve_banner(process)
        url = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert url is not None, banner
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.group(1)))
        try:
            writer.write(BAD_REQUESTS["a NUL in a header value"])
            await writer.drain()
            assert (await closed_by_server(reader)).startswith(b"HTTP/1.0 400")
        finally:
            writer.close()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        served = await finish(process)
    assert served.code == 0
    assert "Traceback" not in served.stderr
    lines = served.stderr.splitlines()
    assert len(lines) == 1, served.stderr
    assert "bad request from 127.0.0.1: Invalid header value char" in lines[0], served.stderr


# ------------------------------------------------------------ headers, codings


async def test_an_empty_base_id_header_is_the_same_as_none(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    job = emu.jobs()[0]["id"]
    async with http.get(f"/v2/extract/{job}", headers={"X-Service-Base-Id": ""}) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["id"] == job
    assert emu.requests[-1].base_id is None


async def test_a_header_name_over_the_limit_is_a_json_431(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    name = "X-" + "n" * (MAX_LINE_BYTES - 1)
    assert len(name) == MAX_LINE_BYTES + 1
    params = {"url": "https://example.com/a"}
    async with http.get("/v2/link", params=params, headers={name: "v"}) as response:
        assert response.status == 431, await response.text()
        assert response.content_type == "application/json"
        uuid.UUID(response.headers["X-Request-Id"])
    async with http.get("/v2/link", params=params, headers={name[:-1]: "v"}) as response:
        assert response.status == 200  # exactly at the limit


async def test_two_content_codings_are_undone_last_first(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    plain = json.dumps({"text": "invoice", "pagination": {"pageSize": 3}}).encode()
    # Content-Encoding lists codings in the order they were applied: deflate, then gzip.
    body = gzip.compress(zlib.compress(plain))
    headers = {"Content-Type": "application/json", "Content-Encoding": "deflate, gzip"}
    async with http.post("/v2/search", data=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        got: dict[str, Any] = await response.json()
    async with http.post(
        "/v2/search", data=plain, headers={"Content-Type": "application/json"}
    ) as r:
        assert [hit["id"] for hit in got["hits"]] == [hit["id"] for hit in (await r.json())["hits"]]
    assert emu.search_history[-1].body == json.loads(plain)
