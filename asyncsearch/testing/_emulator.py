"""The emulator: an aiohttp.web application serving the spec's endpoints from in-memory data."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import logging
import re
import secrets
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Self, TypeVar
from urllib.parse import urlsplit

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from . import _search
from ._bodies import content_codings, decode_content, decode_json, too_large
from ._embed import decode_data_url
from ._errors import EmulatorHTTPError, error_body, not_found, refused_as_422, validation_error
from ._faults import ENDPOINTS, FaultDecision, Faults, check_endpoint
from ._images import fingerprint, recognised
from ._linkpreview import parse_preview, synthetic_preview
from ._requests import MAX_BODY_BYTES, check_uuid, parse_search
from ._search import ImageQuery, SearchRequest
from ._seed import seed_base, seed_pages
from ._store import JobRecord, Store, Workspace, normalize_page_url, random_uuid, stable_uuid

__all__ = [
    "BoundedLog",
    "EmulatorStats",
    "RecordedRequest",
    "SearchRecord",
    "ServiceEmulator",
    "serve_forever",
]

API_KEY_HEADER = "X-Api-Key"
#: Sent with every answer of the emulator, a new UUID each time.
REQUEST_ID_HEADER = "X-Request-Id"
#: The longest request target, header name and header value, and the most headers, the
#: emulator answers (431 or 414 beyond, in JSON). aiohttp's parser, whose defaults these are,
#: is given _PARSER_LIMIT_FACTOR times more, so that its plain-text 400 comes only far beyond.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 128
_PARSER_LIMIT_FACTOR = 8
#: Bodies longer than this are decoded one at a time, one per turn of the event loop.
LARGE_BODY_BYTES = 64 * 1024
# Methods of RFC 9110 (and PATCH): one of them on a route that does not serve it is a 405;
# any other method is a 501, since the emulator implements none.
_KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
_log = logging.getLogger("asyncsearch.testing")
_P = ParamSpec("_P")
_T = TypeVar("_T")
# Only the latest requests and searches are kept (counts stay exact), capped by count and by
# bytes, so that a long-running server stays small whatever it is sent: a search history capped
# by count alone kept 10,000 whole bodies, up to 6 GB of 600 KB images.
MAX_RECORDED_REQUESTS = 100_000
MAX_RECORDED_BYTES = 16 * 1024 * 1024
MAX_SEARCH_HISTORY = 10_000
MAX_SEARCH_HISTORY_BYTES = 16 * 1024 * 1024
#: A string of a kept search body longer than this is kept as its length and SHA-256 digest.
MAX_KEPT_STRING = 1024
#: What a kept request costs beyond its strings (the object and its fields), in bytes.
_RECORD_OVERHEAD = 200
BASE_HEADER = "X-Service-Base-Id"
#: A connection is closed once it has gone this long without a request being handled: idle, or
#: still sending a request line and headers (a byte at a time or not at all); a body that has
#: not all arrived this long after its headers is answered 408. See ServiceEmulator.
IDLE_TIMEOUT = 50.0
#: Connections are looked at this many times per idle_timeout: one is found at most one look
#: after it opens and closed at the first look past its allowance, so within
#: IDLE_TIMEOUT * (1 + 2 / SWEEPS_PER_IDLE_TIMEOUT) = 60 s of its last request (or opening).
SWEEPS_PER_IDLE_TIMEOUT = 10
#: Connections the kernel completes while the emulator is busy before it accepts them
#: (aiohttp's 128 made 400 clients connecting at once wait a second for a retransmission).
LISTEN_BACKLOG = 1024
_server_log = logging.getLogger("asyncsearch.testing.server")
# RFC 3986: a URI starts with a scheme and a colon (the rest is not checked, so the lenient
# mode accepts every URL the strict mode does).
_URI_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:", re.ASCII)
# RFC 3986 (appendix A) for a URI with an authority: "scheme://", [userinfo "@"] host
# [":" port], a path of "/" segments, ["?" query], ["#" fragment]. Each part allows its own
# characters or a "%" and two hex digits, and "[" "]" only around an IP literal host: no
# space, control character, non-ASCII character or other character left unencoded.
_PCT = r"%[0-9A-Fa-f]{2}"
_UNRESERVED_SUB_DELIMS = r"-A-Za-z0-9._~!$&'()*+,;="  # "-" first, to be no range
_PCHAR = rf"(?:[{_UNRESERVED_SUB_DELIMS}:@]|{_PCT})"
_URI_WITH_AUTHORITY_RE = re.compile(
    rf"""
    [A-Za-z][A-Za-z0-9+.-]*://
    (?:(?:[{_UNRESERVED_SUB_DELIMS}:]|{_PCT})*@)?
    (?:\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\.[{_UNRESERVED_SUB_DELIMS}:]+)\]
      |(?:[{_UNRESERVED_SUB_DELIMS}]|{_PCT})*)
    (?::[0-9]*)?
    (?:/{_PCHAR}*)*
    (?:\?(?:{_PCHAR}|[/?])*)?
    (?:\#(?:{_PCHAR}|[/?])*)?
    """,
    re.ASCII | re.VERBOSE,
)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _BadRequestOnOneLine(logging.Filter):
    """aiohttp logs a request its parser refuses (a NUL in a header, a bad chunk size, an
    HTTP/2 preface) with a traceback, or at DEBUG for an unknown method: one WARNING line
    instead, since the emulator's console is read by whoever sent the request."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            reason = str(exc.message).strip().splitlines()[0].rstrip(":") or type(exc).__name__
            record.msg = "bad request from %s: %s (%s %s, answered by aiohttp's parser)"
            record.args = (remote, reason, exc.code, type(exc).__name__)
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        return True


_server_log.addFilter(_BadRequestOnOneLine())


class BoundedLog(deque[_T]):
    """The latest items, at most ``max_items`` of them and ``max_bytes`` bytes (as ``size_of``
    counts each item), the oldest dropped first; the latest item is always kept."""

    def __init__(self, *, max_items: int, max_bytes: int, size_of: Callable[[_T], int]) -> None:
        super().__init__()
        self.max_items = max_items
        self.max_bytes = max_bytes
        #: The bytes held now, as ``size_of`` counts them.
        self.bytes = 0
        self._size_of = size_of
        self._sizes: deque[int] = deque()

    def append(self, item: _T, /) -> None:
        size = self._size_of(item)
        super().append(item)
        self._sizes.append(size)
        self.bytes += size
        while len(self) > 1 and (len(self) > self.max_items or self.bytes > self.max_bytes):
            self.popleft()

    def popleft(self) -> _T:
        item = super().popleft()
        self.bytes -= self._sizes.popleft()
        return item

    def pop(self) -> _T:  # type: ignore[override]  # deque.pop takes no index
        item = super().pop()
        self.bytes -= self._sizes.pop()
        return item

    def clear(self) -> None:
        super().clear()
        self._sizes.clear()
        self.bytes = 0


def _kept(value: Any) -> Any:
    """A JSON value with every string over ``MAX_KEPT_STRING`` characters replaced by its
    length and SHA-256 digest: what the search history keeps of a body."""
    if isinstance(value, str) and len(value) > MAX_KEPT_STRING:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
        return f"<{len(value):,} characters, sha256 {digest}>"
    if isinstance(value, dict):
        return {key: _kept(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_kept(item) for item in value]
    return value


def _search_record_size(record: SearchRecord) -> int:
    return len(msgspec.json.encode(record.body)) + len(record.base_id or "") + _RECORD_OVERHEAD


def _request_record_size(record: RecordedRequest) -> int:
    strings = (record.method, record.path, record.endpoint, record.base_id or "", record.query)
    return sum(len(text) for text in strings) + _RECORD_OVERHEAD


def _search_history() -> BoundedLog[SearchRecord]:
    return BoundedLog(
        max_items=MAX_SEARCH_HISTORY,
        max_bytes=MAX_SEARCH_HISTORY_BYTES,
        size_of=_search_record_size,
    )


def _request_log() -> BoundedLog[RecordedRequest]:
    return BoundedLog(
        max_items=MAX_RECORDED_REQUESTS,
        max_bytes=MAX_RECORDED_BYTES,
        size_of=_request_record_size,
    )


@dataclass(slots=True)
class RecordedRequest:
    """One request the emulator received on a service endpoint.

    Args:
        endpoint: The endpoint's name (``search``, ``extract``, ...).
        method: The HTTP method.
        path: The URL path.
        query: The query parameters.
        status: The status answered.
        base_id: The ``X-Service-Base-Id`` sent, or ``None``.
    """

    method: str
    path: str
    endpoint: str
    base_id: str | None
    query: str
    status: int | None = None  # None while running, and for dropped connections


@dataclass(frozen=True, slots=True)
class SearchRecord:
    """A search stored in the search history (searches with ``incognito: true`` are not).

    ``body`` is the body as sent, except that a string over 1,024 characters (an image) is
    kept as ``"<600,000 characters, sha256 HEX>"``: the history stays small.

    Args:
        body: The search's body, as described above.
        base_id: The ``X-Service-Base-Id`` sent, or ``None``.
    """

    base_id: str | None
    body: dict[str, Any]


@dataclass(slots=True)
class EmulatorStats:
    """Counters of the service endpoints' requests, for assertions in tests.

    ``counts`` maps endpoint name -> requests received (faulted ones included);
    ``max_in_flight`` is the most requests handled at the same time over all endpoints, and
    ``max_in_flight_by_endpoint`` the same per endpoint.

    Args:
        requests: The latest requests received (``RecordedRequest``), bounded.
        counts: Requests received per endpoint name.
        in_flight: Requests being handled now.
        max_in_flight: The most requests handled at once.
        in_flight_by_endpoint: Requests being handled now, per endpoint.
        max_in_flight_by_endpoint: The most requests handled at once, per endpoint.
        last_search_ms: How long the last search took to compute, in milliseconds.
    """

    requests: deque[RecordedRequest] = field(default_factory=_request_log)
    counts: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    in_flight_by_endpoint: Counter[str] = field(default_factory=Counter)
    max_in_flight_by_endpoint: dict[str, int] = field(default_factory=dict)
    last_search_ms: float | None = None

    def count(self, endpoint: str | None = None) -> int:
        """Return how many requests an endpoint (or all of them, for None) received.

        Args:
            endpoint: The endpoint's name; ``None``: all of them.
        """
        return sum(self.counts.values()) if endpoint is None else self.counts[endpoint]

    def reset(self) -> None:
        """Forget every request and maximum (requests still running stay counted in flight)."""
        self.requests.clear()
        self.counts.clear()
        self.max_in_flight = self.in_flight
        self.max_in_flight_by_endpoint = {
            name: n for name, n in self.in_flight_by_endpoint.items() if n
        }
        self.last_search_ms = None

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as JSON-ready data (for ``GET /_emulator/stats``)."""
        return {
            "counts": dict(self.counts),
            "total": self.count(),
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "inFlightByEndpoint": {k: v for k, v in self.in_flight_by_endpoint.items() if v},
            "maxInFlightByEndpoint": dict(self.max_in_flight_by_endpoint),
            "lastSearchMs": self.last_search_ms,
        }

    def _enter(self, record: RecordedRequest) -> None:
        endpoint = record.endpoint
        self.requests.append(record)
        self.counts[endpoint] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.in_flight_by_endpoint[endpoint] += 1
        self.max_in_flight_by_endpoint[endpoint] = max(
            self.max_in_flight_by_endpoint.get(endpoint, 0), self.in_flight_by_endpoint[endpoint]
        )

    def _leave(self, endpoint: str) -> None:
        self.in_flight -= 1
        self.in_flight_by_endpoint[endpoint] -= 1


def _json(
    payload: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(payload),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error(exc: EmulatorHTTPError) -> web.Response:
    response = _json(exc.body(), exc.status, exc.headers)
    if exc.status == 408:
        # The rest of the body may still come: the connection cannot carry another request.
        response.force_close()
    return response


def _query_endpoint(request: web.Request) -> str | None:
    """The ``endpoint`` query parameter of a control request, checked (None: every endpoint)."""
    endpoint = request.query.get("endpoint")
    with refused_as_422(field="endpoint"):
        return endpoint if endpoint is None else check_endpoint(endpoint)


def _check_params(request: web.Request, allowed: Iterable[str], strict: bool) -> None:
    # The spec lists each endpoint's parameters but not what happens to others: a tolerant
    # server ignores them; the strict mode refuses them so that typos are caught.
    unknown = sorted(set(request.query) - set(allowed))
    if unknown and strict:
        raise validation_error(f"unknown query parameter {unknown[0]}", unknown[0])


def render_markdown(job: Mapping[str, Any]) -> str:
    """Return the Markdown text ``format=markdown`` puts in ``extraction.common.caption``."""
    extraction = job.get("extraction") or {}
    common = extraction.get("common") or {}
    document = extraction.get("document") or {}
    web_data = extraction.get("web") or {}
    media = extraction.get("media") or {}
    title = document.get("title") or web_data.get("title") or job.get("name")
    lines = [f"# {title or 'Extraction ' + str(job.get('id'))}", ""]
    if common.get("caption"):
        lines += [str(common["caption"]), ""]
    keywords = common.get("keywords") or []
    if keywords:
        lines += ["**Keywords:** " + ", ".join(str(k) for k in keywords), ""]
    if media.get("ocr"):
        lines += ["## Text found in the image", "", str(media["ocr"]), ""]
    if web_data.get("url"):
        lines += [f"[Source]({web_data['url']})", ""]
    return "\n".join(lines).rstrip() + "\n"


class ServiceEmulator:
    """A local, in-memory stand-in for the search and extraction service, over real HTTP.

    Use ``async with ServiceEmulator(api_key="test-key", seed=7) as emu:`` and point a client
    at ``emu.base_url`` with ``emu.api_key``. With ``seed`` None the store starts empty; with a
    seed the workspace (no base header) gets ``n_resources`` resources and ``n_jobs`` jobs and a
    few link preview pages (``emu.page_urls``). ``first_page`` is the number of the first page
    of search results; ``use_numpy`` forces (True/False) or auto-detects (None) the numpy path.
    ``strict=False`` (the default) accepts what the spec leaves open the way a tolerant server
    would (unknown fields and query parameters ignored, unknown sort values and out-of-range
    paging fall back or are clamped, any URI previewed); ``strict=True`` refuses those with a
    422. Both refuse what the spec fixes (its limits, the UUID pattern, the enums it names).

    Connections: ``idle_timeout=50`` seconds. A connection that goes that long without a
    request being handled (idle, or still sending its request line and headers, however slowly)
    is closed within 60 s (``idle_timeout * 1.2``: connections are looked at every tenth of it);
    a request the emulator is handling (parked at a gate, slow) is never cut. A body that has
    not all arrived ``idle_timeout`` after its headers is answered 408 and the connection
    closed. The listen backlog is 1,024 connections (aiohttp's default is 128).

    Memory is bounded by bytes: ``search_history`` keeps the latest 10,000 searches and at
    most 16 MiB of them, each with strings over 1,024 characters (images) kept as their length
    and SHA-256 digest; ``requests`` keeps the latest 100,000 requests and at most 16 MiB.
    Nothing else grows with the requests served (the data added, and the previews of added
    pages, grow only with what is added).

    Args:
        api_key: The key the emulator accepts; ``None``: a random one (``emu.api_key``).
        host: The address to listen on (loopback by default).
        port: The port; 0: a free one (``emu.base_url`` tells which).
        seed: The seed of the data made at start; ``None``: an empty store.
        n_resources: How many resources a seed makes.
        n_jobs: How many extraction jobs a seed makes.
        first_page: The number of the first page of search results.
        fault_seed: The seed of the fault draws; ``None``: ``seed`` (or 0).
        use_numpy: Force (``True``/``False``) or auto-detect (``None``) the numpy path.
        strict: Refuse with a 422 what the spec leaves open (see above).
        idle_timeout: Seconds a connection may stay without a request handled.
        shutdown_timeout: Seconds ``stop()`` gives the requests in flight.
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        seed: int | None = None,
        n_resources: int = 200,
        n_jobs: int = 50,
        host: str = "127.0.0.1",
        port: int = 0,
        first_page: int = 1,
        use_numpy: bool | None = None,
        fault_seed: int | None = None,
        shutdown_timeout: float = 1.0,
        strict: bool = False,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        if api_key == "":
            raise ValueError("api_key must not be empty (None generates one)")
        if not 0 < idle_timeout < float("inf"):
            raise ValueError(
                f"idle_timeout must be a positive number of seconds, got {idle_timeout}"
            )
        self.idle_timeout = idle_timeout
        if use_numpy and not _search.HAVE_NUMPY:
            raise ValueError("use_numpy=True needs numpy installed")
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(24)
        self.host = host
        self.first_page = first_page
        self.use_numpy = use_numpy
        self.strict = strict
        self.workspace_id = (
            stable_uuid("workspace", str(seed)) if seed is not None else random_uuid()
        )
        self.store = Store(Workspace(self.workspace_id))
        self.faults = Faults(fault_seed if fault_seed is not None else (seed or 0))
        self.stats = EmulatorStats()
        self.search_history: deque[SearchRecord] = _search_history()
        self.page_urls: list[str] = []
        self._requested_port = port
        self._port: int | None = None
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._idle_sweeper: asyncio.Task[None] | None = None
        # Per connection (its transport): requests the app is handling now, and since when it
        # has had none (set when its first look finds it, or when its last request ends).
        self._busy: Counter[object] = Counter()
        self._idle_since: dict[object, float] = {}
        # One thread for work that releases the GIL (inflating bodies, Pillow's decoders).
        # Work that holds it (JSON, base64) stays on the loop: in a thread it would make the
        # loop wait for the GIL after each of its socket calls, for up to the switch interval.
        self._worker: ThreadPoolExecutor | None = None
        self._large_body_turn: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.app = self._make_app()
        if seed is not None:
            self.seed(n_resources=n_resources, n_jobs=n_jobs, seed=seed)
            self.page_urls = seed_pages(self.store)

    # ------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start serving on ``host:port`` (port 0 picks a free port); see ``base_url``."""
        if self._runner is not None:
            raise RuntimeError("the emulator is already running")
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout,
            # aiohttp's own keep-alive close, after a response; _close_idle_connections also
            # closes what it never covers: connections that have not finished a request.
            keepalive_timeout=self.idle_timeout,
            logger=_server_log,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._requested_port, backlog=LISTEN_BACKLOG)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        server = runner.server
        assert server is not None  # set up above
        self._idle_sweeper = asyncio.create_task(
            self._close_idle_connections(server), name="asyncsearch.emulator.idle_sweeper"
        )

    async def stop(self) -> None:
        """Stop serving and close every connection; the data is kept for another start()."""
        runner, self._runner = self._runner, None
        sweeper, self._idle_sweeper = self._idle_sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        if runner is not None:
            await runner.cleanup()
        self._busy.clear()
        self._idle_since.clear()
        self._port = None

    async def _close_idle_connections(self, server: web.Server) -> None:
        """Close every connection that has gone ``idle_timeout`` without a request in the app.

        aiohttp starts no timer before a request line and headers have arrived, so a client
        that sends nothing, half a request line, or a header a byte at a time would hold its
        connection forever. Looked at SWEEPS_PER_IDLE_TIMEOUT times per idle_timeout, through
        aiohttp's public ``Server.connections``; a request in the app (parked at a gate, slow)
        is never cut.
        """
        loop = asyncio.get_running_loop()
        interval = self.idle_timeout / SWEEPS_PER_IDLE_TIMEOUT
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            open_now: set[object] = set()
            for handler in server.connections:
                transport = handler.transport
                if transport is None:
                    continue
                open_now.add(transport)
                if self._busy[transport]:
                    continue
                since = self._idle_since.setdefault(transport, now)
                if now - since < self.idle_timeout:
                    continue
                if transport.is_closing():
                    # Closed at an earlier look but still flushing to a client that does not
                    # read: drop it.
                    transport.abort()
                else:
                    transport.close()
            for gone in self._idle_since.keys() - open_now:
                del self._idle_since[gone]
            for gone in [t for t, n in self._busy.items() if not n or t not in open_now]:
                del self._busy[gone]

    @property
    def port(self) -> int:
        """Return the TCP port being served; raise RuntimeError when not running."""
        if self._port is None:
            raise RuntimeError("the emulator is not running; use 'async with' or start()")
        return self._port

    @property
    def base_url(self) -> str:
        """Return the URL to give a client, e.g. ``http://127.0.0.1:41234``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Return the service requests received so far, oldest first, as a list.

        A copy of ``stats.requests`` (the latest 100,000, at most 16 MiB): index and slice it
        freely (``emu.requests[:2]``, ``emu.requests[-1]``).
        """
        return list(self.stats.requests)

    # -------------------------------------------------------------- data API

    def add_resource(
        self,
        resource: Mapping[str, Any] | None = None,
        /,
        *,
        base_id: str | None = None,
        text: str | None = None,
        chunks: Sequence[str | Mapping[str, Any]] | None = None,
        ancestors: Iterable[str] | None = None,
        image: bytes | str | None = None,
        strict: bool = True,
        **fields: Any,
    ) -> dict[str, Any]:
        """Store a resource and return it complete, as search hits carry it (minus hit fields).

        Fields use wire names (``mimeType``, ``createdAt``); nested objects merge with the
        defaults. ``text`` (split into chunks of 40 words) or ``chunks`` (texts or chunk dicts)
        is the searchable content. ``tags`` may be names: each gets an id stable per name.
        ``ancestors`` are the ids ``filters.ancestorIds`` matches (default: parent, root folder,
        root). ``image`` (bytes or a base64 data URL) is the resource's picture: an image search
        with the same bytes finds it with score 1.0, and with Pillow installed a re-encoded or
        resized copy finds it too. Raises ValueError for an unknown field (unless
        ``strict=False``), a duplicate id or an image that is not a base64 data URL of an
        ``image/`` media type.

        Args:
            resource: The resource's fields, in wire names.
            base_id: The base to add it to; ``None``: the workspace.
            text: The searchable text, split into chunks of 40 words.
            chunks: The searchable chunks instead (texts or chunk dicts).
            ancestors: The ids ``filters.ancestorIds`` matches.
            image: The resource's picture (bytes or a base64 data URL).
            strict: Refuse a field the spec does not show.
            **fields: More fields, in wire names (over ``resource``).

        Returns:
            The resource as stored.
        """
        given = {**(resource or {}), **fields}
        return self.store.add_resource(
            given,
            base_id=base_id,
            text=text,
            chunks=chunks,
            ancestors=ancestors,
            image=image,
            strict=strict,
        )

    def add_job(
        self,
        job: Mapping[str, Any] | None = None,
        /,
        *,
        base_id: str | None = None,
        next_states: Iterable[str] = (),
        strict: bool = True,
        **fields: Any,
    ) -> dict[str, Any]:
        """Store an extraction job and return it complete.

        ``next_states`` scripts the job's progress: each GET of the job answers with the
        current state and then moves to the next one, e.g. ``add_job(state="pending",
        next_states=["processing", "done"])`` reads pending, processing, done, done, ...

        Args:
            job: The job's fields, in wire names.
            base_id: The base to add it to; ``None``: the workspace.
            next_states: The states the job moves through, one per GET.
            strict: Refuse a field the spec does not show.
            **fields: More fields, in wire names (over ``job``).

        Returns:
            The job as stored.
        """
        given = {**(job or {}), **fields}
        return self.store.add_job(given, base_id=base_id, next_states=next_states, strict=strict)

    def set_job_state(self, job_id: str, state: str, *, base_id: str | None = None) -> None:
        """Set a job's state now (dropping any scripted next states); KeyError when unknown.

        Args:
            job_id: The job's id.
            state: Its new state.
            base_id: The job's base; ``None``: the workspace.
        """
        record = self.store.job(job_id, base_id)
        record.wire["state"] = state
        record.next_states.clear()

    def add_webhook_log(
        self,
        job_id: str,
        log: Mapping[str, Any] | None = None,
        /,
        *,
        base_id: str | None = None,
        strict: bool = True,
        **fields: Any,
    ) -> dict[str, Any]:
        """Store a webhook log (detail form) for a job and return it; KeyError when no job.

        ``attemptNumber`` defaults to one more than the job's log count.

        Args:
            job_id: The job's id.
            log: The log's fields, in wire names.
            base_id: The job's base; ``None``: the workspace.
            strict: Refuse a field the spec does not show.
            **fields: More fields, in wire names (over ``log``).

        Returns:
            The log as stored.
        """
        given = {**(log or {}), **fields}
        return self.store.add_webhook_log(job_id, given, base_id=base_id, strict=strict)

    def add_page(self, url: str, html: str) -> None:
        """Register the HTML ``GET /v2/link?url=`` parses for ``url`` (shared by all bases).

        Args:
            url: The URL previewed.
            html: The page's HTML.
        """
        self.store.add_page(url, html)

    def seed(
        self,
        n_resources: int = 200,
        n_jobs: int = 50,
        seed: int = 0,
        base_id: str | None = None,
    ) -> None:
        """Add deterministic realistic resources and jobs (with webhook logs) to a base.

        Args:
            n_resources: How many resources to add.
            n_jobs: How many jobs to add.
            seed: The seed of the data.
            base_id: The base to add them to; ``None``: the workspace.
        """
        seed_base(self.store, n_resources=n_resources, n_jobs=n_jobs, seed=seed, base_id=base_id)

    def resources(self, base_id: str | None = None) -> list[dict[str, Any]]:
        """Return copies of a base's resources, in insertion order.

        Args:
            base_id: The base; ``None``: the workspace.
        """
        return [copy.deepcopy(d.wire) for d in self.store.base(base_id).index.docs]

    def resource(self, resource_id: str, base_id: str | None = None) -> dict[str, Any]:
        """Return a copy of one resource; KeyError when the base has none with this id.

        Args:
            resource_id: The resource's id.
            base_id: The base; ``None``: the workspace.
        """
        return copy.deepcopy(self.store.base(base_id).index.by_id[resource_id].wire)

    def resource_chunks(self, resource_id: str, base_id: str | None = None) -> list[dict[str, Any]]:
        """Return copies of a resource's text chunks (what text search matches).

        Args:
            resource_id: The resource's id.
            base_id: The base; ``None``: the workspace.
        """
        return copy.deepcopy(self.store.base(base_id).index.by_id[resource_id].chunks)

    def jobs(self, base_id: str | None = None) -> list[dict[str, Any]]:
        """Return copies of a base's extraction jobs, in insertion order.

        Args:
            base_id: The base; ``None``: the workspace.
        """
        return [copy.deepcopy(r.wire) for r in self.store.base(base_id).jobs.values()]

    def job(self, job_id: str, base_id: str | None = None) -> dict[str, Any]:
        """Return a copy of one extraction job; KeyError when unknown.

        Args:
            job_id: The job's id.
            base_id: The base; ``None``: the workspace.
        """
        return copy.deepcopy(self.store.job(job_id, base_id).wire)

    def webhook_logs(self, job_id: str, base_id: str | None = None) -> list[dict[str, Any]]:
        """Return copies of a job's webhook logs (detail form), in insertion order.

        Args:
            job_id: The job's id.
            base_id: The base; ``None``: the workspace.
        """
        return [copy.deepcopy(v) for v in self.store.job(job_id, base_id).logs.values()]

    # ------------------------------------------------------------ the app

    def _make_app(self) -> web.Application:
        # The largest body the spec's limits allow (see _requests.MAX_BODY_BYTES); 413 beyond,
        # decided by _json_body itself: aiohttp releases disagree on whether a body of exactly
        # client_max_size bytes passes, so aiohttp's own cap only bounds memory, a little above.
        app = web.Application(
            middlewares=[self._middleware],
            client_max_size=MAX_BODY_BYTES + 64 * 1024,
            handler_args={
                # The emulator decodes gzip and deflate itself (see _bodies), to answer a body
                # that is not what its Content-Encoding says, or an unknown coding, in JSON.
                "auto_decompress": False,
                "max_line_size": MAX_LINE_BYTES * _PARSER_LIMIT_FACTOR,
                "max_field_size": MAX_LINE_BYTES * _PARSER_LIMIT_FACTOR,
                "max_headers": MAX_HEADERS * _PARSER_LIMIT_FACTOR,
            },
        )
        app[EMULATOR_KEY] = self
        app.on_response_prepare.append(self._add_request_id)
        app.on_cleanup.append(self._stop_worker)
        routes = [
            web.post("/v2/search", self._search, name="search"),
            web.get("/v2/extract/{jobId}", self._extract, name="extract"),
            web.get("/v2/link", self._link, name="link"),
            web.get("/v2/extract/{jobId}/webhook-logs", self._webhook_logs, name="webhook_logs"),
            web.get(
                "/v2/extract/{jobId}/webhook-logs/{logId}", self._webhook_log, name="webhook_log"
            ),
            web.get("/_emulator/faults", self._control_faults_get),
            web.post("/_emulator/faults", self._control_faults_set),
            web.delete("/_emulator/faults", self._control_faults_clear),
            web.post("/_emulator/faults/script", self._control_faults_script),
            web.get("/_emulator/faults/gate", self._control_gate_get),
            web.post("/_emulator/faults/gate", self._control_gate_hold),
            web.delete("/_emulator/faults/gate", self._control_gate_release),
            web.get("/_emulator/stats", self._control_stats),
            web.post("/_emulator/stats/reset", self._control_stats_reset),
            web.post("/_emulator/resources", self._control_add_resource),
            web.post("/_emulator/jobs", self._control_add_job),
            web.post("/_emulator/jobs/{jobId}/webhook-logs", self._control_add_webhook_log),
            web.post("/_emulator/pages", self._control_add_page),
            web.post("/_emulator/seed", self._control_seed),
        ]
        app.add_routes(routes)
        app.add_routes(self._listing_routes())
        return app

    @staticmethod
    async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
        # Every answer the app prepares passes here, errors and faults included; only what
        # aiohttp's parser refuses before routing (see _check_protocol) does not.
        response.headers[REQUEST_ID_HEADER] = str(uuid.uuid4())

    async def _stop_worker(self, app: web.Application) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            # A job already running finishes in its thread; nobody waits for its result.
            worker.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, func: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run work that releases the GIL in the emulator's worker thread."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="asyncsearch.emulator.worker")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, lambda: func(*args, **kwargs))

    @web.middleware
    async def _middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        # While the app handles a request its connection is never closed as idle.
        transport = request.transport
        self._busy[transport] += 1
        try:
            return await self._handle(request, handler)
        finally:
            self._busy[transport] -= 1
            self._idle_since[transport] = asyncio.get_running_loop().time()

    async def _handle(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        refused = self._check_protocol(request)
        if refused is not None:
            return _error(refused)
        name = request.match_info.route.name
        if name not in ENDPOINTS:
            return await self._answer(request, handler)
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            endpoint=name,
            base_id=request.headers.get(BASE_HEADER) or None,
            query=request.query_string,
        )
        self.stats._enter(record)
        try:
            await self.faults.pass_gate(name)
            decision = self.faults.decide(name)
            if decision.latency > 0:
                await asyncio.sleep(decision.latency)
            if decision.action == "drop":
                transport = request.transport
                if transport is not None:
                    transport.close()
                # Nothing reaches the client: aiohttp fails to write this to the closed
                # transport and drops the error quietly.
                return web.Response(status=204)
            response: web.StreamResponse
            if decision.action == "status":
                response = self._fault_status(decision)
            else:
                response = await self._answer(request, handler)
            record.status = response.status
            if decision.action in ("truncate", "slow") and isinstance(response, web.Response):
                return await self._stream(request, response, decision)
            return response
        finally:
            self.stats._leave(name)

    @staticmethod
    def _fault_status(decision: FaultDecision) -> web.Response:
        headers = {}
        if decision.status == 429 and decision.retry_after is not None:
            headers["Retry-After"] = decision.retry_after
        message = {
            429: "too many requests (injected fault)",
            500: "internal error (injected fault)",
            503: "service unavailable (injected fault)",
        }.get(decision.status, f"status {decision.status} (injected fault)")
        return _json(error_body(decision.status, message), decision.status, headers)

    @staticmethod
    async def _stream(
        request: web.Request, response: web.Response, decision: FaultDecision
    ) -> web.StreamResponse:
        body = response.body if isinstance(response.body, bytes) else b""
        stream = web.StreamResponse(status=response.status, reason=response.reason)
        for key, value in response.headers.items():
            if key.lower() != "content-length":
                stream.headers[key] = value
        if decision.action == "truncate":
            # Promise more than is sent, then close: the client sees a short body.
            stream.content_length = len(body) + max(16, len(body) // 2)
            stream.force_close()
            await stream.prepare(request)
            await stream.write(body[: len(body) // 2])
            return stream
        stream.content_length = len(body)
        await stream.prepare(request)
        size = max(1, -(-len(body) // decision.slow_chunks))  # ceiling division
        for start in range(0, len(body), size):
            if start:
                await asyncio.sleep(decision.slow_chunk_delay)
            await stream.write(body[start : start + size])
        return stream

    @staticmethod
    def _check_protocol(request: web.Request) -> EmulatorHTTPError | None:
        """Return the error for a request line, headers or method the emulator refuses.

        aiohttp's parser answers itself, in plain text and before any of this runs, for what
        it cannot parse: a method llhttp does not know (``FOO``), a malformed request, or a
        line or header count past its raised limits (8 times the ones below).
        """
        if len(request.raw_path) > MAX_LINE_BYTES:
            return EmulatorHTTPError(414, f"the request target is over {MAX_LINE_BYTES:,} bytes")
        if len(request.raw_headers) > MAX_HEADERS:
            return EmulatorHTTPError(431, f"the request has more than {MAX_HEADERS} headers")
        for name, value in request.raw_headers:
            if len(name) > MAX_LINE_BYTES or len(value) > MAX_LINE_BYTES:
                shown = name[:40].decode("latin-1")
                return EmulatorHTTPError(
                    431, f"header {shown!r} is over {MAX_LINE_BYTES:,} bytes", field=shown
                )
        if request.method not in _KNOWN_METHODS:
            headers = {}
            routed = request.match_info.http_exception
            if routed is not None and "Allow" in routed.headers:
                headers["Allow"] = routed.headers["Allow"]
            return EmulatorHTTPError(
                501, f"method {request.method} is not implemented", headers=headers
            )
        return None

    async def _answer(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            self._authenticate(request)
            if len(request.headers.getall(BASE_HEADER, ())) > 1:
                raise EmulatorHTTPError(
                    400, f"send one {BASE_HEADER} header, not several", field=BASE_HEADER
                )
            return await handler(request)
        except EmulatorHTTPError as exc:
            return _error(exc)
        except web.HTTPException as exc:
            headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            message = exc.reason
            if exc.status == 404:
                message = f"no route for {request.method} {request.path}"
            return _json(error_body(exc.status, message), exc.status, headers)
        except Exception:
            # A bug of the emulator: still the service's JSON shape, and the traceback logged.
            _log.exception("the emulator failed on %s %s", request.method, request.path)
            return _json(error_body(500, "the emulator failed (its log has the traceback)"), 500)

    def _authenticate(self, request: web.Request) -> None:
        keys = request.headers.getall(API_KEY_HEADER, ())
        if not keys:
            raise EmulatorHTTPError(401, f"missing {API_KEY_HEADER} header")
        if len(keys) > 1:
            # Which one would count is anybody's guess: refuse rather than pick the first.
            raise EmulatorHTTPError(401, f"send one {API_KEY_HEADER} header, not {len(keys)}")
        given = keys[0]
        # Constant-time comparison, like a real service, so timing says nothing about the key.
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise EmulatorHTTPError(401, "invalid API key")

    @staticmethod
    def _base_id(request: web.Request) -> str | None:
        # The spec only says the header is an optional string: an empty one (HTTP strips the
        # spaces around a value, so also "  ") names no base, as if it were not sent.
        return request.headers.get(BASE_HEADER) or None

    async def _read_body(self, request: web.Request) -> bytes:
        """Return the request body with its content codings undone; 413, 415 or 400 if not."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY_BYTES:
            raise too_large()
        codings = content_codings(request.headers.getall("Content-Encoding", []))
        try:
            # A body that stops arriving (half sent, or a bad chunk after the headers, which
            # aiohttp's parser never reports to the app) would hold the request forever.
            async with asyncio.timeout(self.idle_timeout):
                raw = await request.read()
        except TimeoutError:
            raise EmulatorHTTPError(
                408,
                f"the request body did not arrive in full within {self.idle_timeout:g} s of "
                "its headers",
            ) from None
        if len(raw) > MAX_BODY_BYTES:  # a chunked body declares no length
            raise too_large()
        if not codings or not raw:
            return raw
        # Inflating releases the GIL, and a small body may inflate to the cap: always off-loop.
        return await self._off_loop(decode_content, raw, codings)

    @contextlib.asynccontextmanager
    async def _turn(self, raw: bytes) -> AsyncIterator[None]:
        """Work on a large body one at a time, and on one per iteration of the event loop.

        An image search of 600,000 characters costs a few milliseconds of the loop (JSON,
        base64, SHA-256, the ranking). Two hundred arriving together would otherwise run back
        to back in one iteration, and every other request would wait for all of them.
        """
        if len(raw) <= LARGE_BODY_BYTES:
            yield
            return
        loop = asyncio.get_running_loop()
        if self._large_body_turn is None or self._large_body_turn[0] is not loop:
            self._large_body_turn = (loop, asyncio.Lock())
        async with self._large_body_turn[1]:
            yield
            # Keep the turn over one iteration, so the next large body waits for the next one.
            await asyncio.sleep(0)

    async def _json_body(self, request: web.Request) -> Any:
        raw = await self._read_body(request)
        async with self._turn(raw):
            return decode_json(raw)

    def _parse_search_body(self, raw: bytes) -> tuple[Any, SearchRequest]:
        body = decode_json(raw)
        return body, parse_search(body, first_page=self.first_page, strict=self.strict)

    # --------------------------------------------------------- service handlers

    async def _search(self, request: web.Request) -> web.StreamResponse:
        base_id = self._base_id(request)
        raw = await self._read_body(request)
        async with self._turn(raw):
            return await self._search_body(raw, base_id)

    async def _search_body(self, raw: bytes, base_id: str | None) -> web.Response:
        started = time.perf_counter()
        # An image search of 600,000 characters: its picture is hashed (microseconds per
        # kilobyte), and only a picture Pillow recognises is decoded, in the worker thread.
        body, parsed = self._parse_search_body(raw)
        images = parsed.images_to_decode()
        if images:
            await self._off_loop(_prepare_images, images)
        index = self.store.base(base_id).index
        use_numpy = self.use_numpy if self.use_numpy is not None else _search.HAVE_NUMPY
        total, page = index.search(parsed, use_numpy=use_numpy)
        hits = []
        for doc, score, terms in page:
            hit = dict(doc.wire)
            hit["score"] = round(score, 6)
            hit["chunks"] = index.matched_chunks(doc, terms)
            hit["embeddings"] = {
                "small3_512": index.small3.wire_vector(doc.row),
                "clip2": index.clip2.wire_vector(doc.row),
            }
            hits.append(hit)
        has_more = (parsed.page_index + 1) * parsed.page_size < total
        response = _json({"total": total, "hasMore": has_more, "hits": hits})
        self.stats.last_search_ms = (time.perf_counter() - started) * 1000.0
        if parsed.incognito is not True:
            self.search_history.append(SearchRecord(base_id, _kept(body)))
        return response

    def _job_record(self, request: web.Request) -> JobRecord:
        base_id = self._base_id(request)
        job_id = check_uuid(request.match_info["jobId"], "jobId")
        record = self.store.base(base_id).jobs.get(job_id)
        if record is None:
            raise not_found(f"extraction job {job_id} not found", "jobId")
        return record

    async def _extract(self, request: web.Request) -> web.StreamResponse:
        _check_params(request, ("format",), self.strict)
        fmt = request.query.get("format", "json")
        if fmt not in ("json", "markdown"):
            raise validation_error("format must be json or markdown", "format")
        record = self._job_record(request)
        job = copy.deepcopy(record.wire)
        if record.next_states:
            record.wire["state"] = record.next_states.popleft()
        if fmt == "markdown":
            common = job.get("extraction", {}).get("common")
            if isinstance(common, dict):
                common["caption"] = render_markdown(job)
        return _json(job)

    async def _link(self, request: web.Request) -> web.StreamResponse:
        self._base_id(request)
        _check_params(request, ("url", "type"), self.strict)
        url = request.query.get("url")
        if url is None:
            raise validation_error("url is required", "url")
        try:
            # Both modes: a URL urlsplit refuses (a stray "[" or "]" in the host) is no URI.
            parts = urlsplit(url)
        except ValueError as exc:
            raise validation_error(f"url is not a URI ({exc})", "url") from None
        if self.strict:
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise validation_error("url must be an absolute http(s) URI", "url")
            # urlsplit drops tabs and newlines, strips leading spaces and control characters
            # and lets any other character through; fullmatch, as "$" allows a final newline.
            if not _URI_WITH_AUTHORITY_RE.fullmatch(url):
                raise validation_error(
                    "url must be an RFC 3986 URI: percent-encode spaces, control characters, "
                    "non-ASCII characters and other characters it does not allow",
                    "url",
                )
        elif not _URI_SCHEME_RE.match(url):
            # The spec fixes "URI format": a scheme is required, any scheme will do.
            raise validation_error("url must be an absolute URI (scheme:...)", "url")
        kind = request.query.get("type", "cache")
        if kind not in ("cache", "link"):
            raise validation_error("type must be cache or link", "type")
        key = normalize_page_url(url)
        cached = self.store.preview_cache.get(key)
        if kind == "cache" and cached is not None:
            return _json(cached)
        html = self.store.pages.get(key)
        if html is None:
            # No outside requests: a URL no page was registered for gets a preview made up
            # from the URL alone, not stored, so a page added later takes its place.
            return _json(synthetic_preview(url))
        preview = parse_preview(url, html)
        self.store.preview_cache[key] = preview
        return _json(preview)

    async def _webhook_logs(self, request: web.Request) -> web.StreamResponse:
        _check_params(request, (), self.strict)
        record = self._job_record(request)
        summary_fields = (
            "id",
            "traceId",
            "attemptNumber",
            "status",
            "statusCode",
            "errorMessage",
            "firedAt",
            "createdAt",
        )
        items = [{k: log[k] for k in summary_fields if k in log} for log in record.logs.values()]
        return _json({"items": items})

    async def _webhook_log(self, request: web.Request) -> web.StreamResponse:
        _check_params(request, (), self.strict)
        record = self._job_record(request)
        log_id = check_uuid(request.match_info["logId"], "logId")
        log = record.logs.get(log_id)
        if log is None:
            raise not_found(f"webhook log {log_id} not found for this job", "logId")
        return _json(log)

    # --------------------------------------------------------- control handlers

    async def _control_body(self, request: web.Request) -> dict[str, Any]:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise validation_error("the body must be a JSON object")
        return body

    async def _control_faults_get(self, request: web.Request) -> web.StreamResponse:
        return _json(self.faults.snapshot())

    async def _control_faults_set(self, request: web.Request) -> web.StreamResponse:
        body = await self._control_body(request)
        with refused_as_422(errors=(TypeError, ValueError)):
            self.faults.apply(body)
        return _json(self.faults.snapshot())

    async def _control_faults_script(self, request: web.Request) -> web.StreamResponse:
        body = await self._control_body(request)
        endpoint = body.get("endpoint", "*")
        sequence = body.get("sequence")
        if not isinstance(endpoint, str) or not isinstance(sequence, list):
            raise validation_error('send {"endpoint": "<name>", "sequence": [503, "drop", 200]}')
        with refused_as_422():
            self.faults.script(endpoint, sequence)
        return _json(self.faults.snapshot())

    async def _control_faults_clear(self, request: web.Request) -> web.StreamResponse:
        self.faults.clear(_query_endpoint(request))
        return _json(self.faults.snapshot())

    async def _control_gate_get(self, request: web.Request) -> web.StreamResponse:
        wanted = request.query.get("parked")
        if wanted is None:
            return _json(self.faults.gate_snapshot())
        endpoint = _query_endpoint(request)
        try:
            count = int(wanted)
            timeout = float(request.query.get("timeout", "10"))
            if not 0 < timeout <= 600:
                raise ValueError("timeout must be in (0, 600] seconds")
            async with asyncio.timeout(timeout):
                await self.faults.wait_parked(count, endpoint)
        except TimeoutError:
            raise EmulatorHTTPError(
                504, f"fewer than {wanted} requests were parked after {timeout:g} s"
            ) from None
        except ValueError as exc:
            raise validation_error(str(exc)) from None
        return _json(self.faults.gate_snapshot())

    async def _control_gate_hold(self, request: web.Request) -> web.StreamResponse:
        body = await self._control_body(request)
        endpoint = body.pop("endpoint", "*")
        after = body.pop("after", 0)
        if body:
            raise validation_error(f"unknown gate settings {sorted(body)}; known: endpoint, after")
        if not isinstance(endpoint, str):
            raise validation_error("endpoint must be a string", "endpoint")
        with refused_as_422():
            self.faults.hold(endpoint, after=after)
        return _json(self.faults.gate_snapshot())

    async def _control_gate_release(self, request: web.Request) -> web.StreamResponse:
        self.faults.release(_query_endpoint(request))
        return _json(self.faults.gate_snapshot())

    async def _control_stats(self, request: web.Request) -> web.StreamResponse:
        return _json(self.stats.snapshot())

    async def _control_stats_reset(self, request: web.Request) -> web.StreamResponse:
        self.stats.reset()
        return _json(self.stats.snapshot())

    async def _control_add_resource(self, request: web.Request) -> web.StreamResponse:
        base_id = self._base_id(request)
        body = await self._control_body(request)
        image = body.get("image")
        with refused_as_422(errors=(TypeError, ValueError)):
            if isinstance(image, str):
                # Pillow decodes the picture in the worker thread, not on the event loop.
                data = decode_data_url(image)
                image = await self._off_loop(fingerprint, data) if recognised(data) else data
            given = body.get("resource") or {}
            if not isinstance(given, dict):
                raise TypeError("resource must be an object")
            resource = self.store.add_resource(
                given,
                base_id=base_id,
                text=body.get("text"),
                chunks=body.get("chunks"),
                ancestors=body.get("ancestors"),
                image=image,
                strict=bool(body.get("strict", True)),
            )
        return _json(resource, 201)

    async def _control_add_job(self, request: web.Request) -> web.StreamResponse:
        base_id = self._base_id(request)
        body = await self._control_body(request)
        with refused_as_422(errors=(TypeError, ValueError)):
            job = self.add_job(
                body.get("job") or {},
                base_id=base_id,
                next_states=body.get("nextStates") or (),
                strict=bool(body.get("strict", True)),
            )
        return _json(job, 201)

    async def _control_add_webhook_log(self, request: web.Request) -> web.StreamResponse:
        base_id = self._base_id(request)
        body = await self._control_body(request)
        try:
            log = self.add_webhook_log(
                request.match_info["jobId"],
                body.get("log") or {},
                base_id=base_id,
                strict=bool(body.get("strict", True)),
            )
        except KeyError as exc:
            raise not_found(str(exc.args[0]), "jobId") from None
        except (TypeError, ValueError) as exc:
            raise validation_error(str(exc)) from None
        return _json(log, 201)

    async def _control_add_page(self, request: web.Request) -> web.StreamResponse:
        body = await self._control_body(request)
        url, html = body.get("url"), body.get("html")
        if not isinstance(url, str) or not isinstance(html, str):
            raise validation_error('send {"url": "<absolute URL>", "html": "<html>"}')
        with refused_as_422(field="url"):
            self.add_page(url, html)
        return _json({"url": url}, 201)

    async def _control_seed(self, request: web.Request) -> web.StreamResponse:
        base_id = self._base_id(request)
        body = await self._control_body(request)
        values = {"nResources": 200, "nJobs": 50, "seed": 0}
        for key in values:
            value = body.get(key, values[key])
            if isinstance(value, bool) or not isinstance(value, int):
                raise validation_error(f"{key} must be an integer", key)
            values[key] = value
        with refused_as_422():
            self.seed(values["nResources"], values["nJobs"], values["seed"], base_id)
        return _json({"resources": len(self.store.base(base_id).index)}, 201)

    # --------------------------------------------------------- listing handlers

    def _listing_routes(self) -> list[web.RouteDef]:
        return [
            web.get("/_emulator/jobs", self._control_list_jobs),
            web.get("/_emulator/resources", self._control_list_resources),
        ]

    async def _control_list_jobs(self, request: web.Request) -> web.StreamResponse:
        """``GET /_emulator/jobs``: ``{"items": [job, ...]}`` of a base, in insertion order."""
        return _json({"items": self.jobs(self._base_id(request))})

    async def _control_list_resources(self, request: web.Request) -> web.StreamResponse:
        """``GET /_emulator/resources``: ``{"items": [resource, ...]}`` of a base."""
        return _json({"items": self.resources(self._base_id(request))})


EMULATOR_KEY = web.AppKey("asyncsearch_emulator", ServiceEmulator)


async def serve_forever(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    seed: int | None = None,
    n_resources: int = 200,
    n_jobs: int = 50,
    first_page: int = 1,
    strict: bool = False,
    on_ready: Callable[[ServiceEmulator], object] | None = None,
) -> None:
    """Run an emulator until cancelled (for a ``serve`` command); prints nothing itself.

    ``on_ready`` is called with the running emulator (read ``base_url`` and ``api_key`` there).

    Args:
        host: The address to listen on.
        port: The port.
        api_key: The key the emulator accepts; ``None``: a random one.
        seed: The seed of the data made at start; ``None``: an empty store.
        n_resources: How many resources a seed makes.
        n_jobs: How many extraction jobs a seed makes.
        first_page: The number of the first page of search results.
        strict: Refuse with a 422 what the spec leaves open.
        on_ready: Called with the running emulator.
    """
    emulator = ServiceEmulator(
        api_key,
        seed=seed,
        n_resources=n_resources,
        n_jobs=n_jobs,
        host=host,
        port=port,
        first_page=first_page,
        strict=strict,
    )
    async with emulator:
        if on_ready is not None:
            on_ready(emulator)
        await asyncio.Event().wait()


def _prepare_images(images: Sequence[ImageQuery]) -> None:
    for image in images:
        image.prepare()
