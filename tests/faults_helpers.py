"""A raw loopback HTTP/1.1 server scripted per request, counting connections and requests.

The fault tests need answers no well-behaved server framework sends (a cut chunk, a status line
that never comes, a Content-Length that lies) and need to see what the client did on the wire:
how many connections it opened, how many requests it sent, and whether it closed every
connection. ``RawServer`` is ``asyncio.start_server`` with a per-request script for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "RawRequest",
    "RawServer",
    "Respond",
    "full_backlog",
    "gzip_bomb",
    "http_response",
    "loop_complaints",
    "pause",
    "raw_server",
    "stall",
]


@dataclass
class RawRequest:
    """One request as read off the wire; header names are lower-cased, repeated ones joined."""

    index: int
    connection: int
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Conn:
    """One accepted connection: the streams a script writes to."""

    number: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


#: ``await respond(request, conn)`` writes the answer; it returns True to keep the connection
#: open for the next request (keep-alive) or False to close it.
Respond = Callable[[RawRequest, Conn], Awaitable[bool]]


def http_response(
    status: int = 200,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    content_type: str | None = "application/json",
    reason: str = "X",
) -> bytes:
    """Bytes of a complete response with a correct Content-Length (unless headers set one)."""
    lines = [f"HTTP/1.1 {status} {reason}"]
    given = {k.lower() for k in (headers or {})}
    if content_type is not None and "content-type" not in given:
        lines.append(f"Content-Type: {content_type}")
    if "content-length" not in given and "transfer-encoding" not in given:
        lines.append(f"Content-Length: {len(body)}")
    lines.extend(f"{k}: {v}" for k, v in (headers or {}).items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def pause(conn: Conn, seconds: float) -> bool:
    """Wait ``seconds`` unless the client closes first; True if the client is still there."""
    try:
        data = await asyncio.wait_for(conn.reader.read(65536), seconds)
    except TimeoutError:
        return True
    except OSError:
        return False
    # The client sends nothing while it waits for an answer: any read result means it left.
    return bool(data) and not conn.reader.at_eof()


async def stall(request: RawRequest, conn: Conn) -> bool:
    """A script that never answers: it waits until the client gives up and closes."""
    while await pause(conn, 3600):
        pass
    return False


class RawServer:
    """A loopback server answering each request with a script, counting what it saw.

    ``connections`` TCP connections accepted (counted before any TLS handshake), ``established``
    those that reached HTTP (with ``tls``: whose handshake completed), ``requests`` read (whole,
    body included), ``open`` established connections not yet closed by either side.
    """

    def __init__(
        self, respond: Respond, *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> None:
        self._respond = respond
        self.host = host
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._arrived = asyncio.Event()
        self.port = 0
        self.connections = 0
        self.established = 0
        self.open = 0
        self.seen: list[RawRequest] = []

    @property
    def requests(self) -> int:
        return len(self.seen)

    @property
    def base_url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    async def start(self, port: int = 0) -> RawServer:
        loop = asyncio.get_running_loop()

        def accept() -> asyncio.StreamReaderProtocol:
            # Called on each TCP accept, before a TLS handshake starts: a connection whose
            # handshake fails is counted too.
            self.connections += 1
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._on_connection)

        self._server = await loop.create_server(accept, self.host, port, ssl=self._tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def wait_for_requests(self, count: int) -> None:
        """Return once ``count`` requests have been read."""
        while self.requests < count:
            self._arrived.clear()
            await self._arrived.wait()

    async def wait_all_closed(self, timeout: float = 5.0) -> None:
        """Return once every accepted connection is closed; TimeoutError if one stays open."""
        async with asyncio.timeout(timeout):
            await self._idle.wait()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Cut every connection still open: each script then sees EOF and ends by itself.
        for writer in list(self._writers):
            writer.transport.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # Only ``close`` cancels, as a last resort; ending quietly keeps asyncio's stream
            # callback from logging the cancellation as an error.
            return

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.established += 1
        self.open += 1
        self._idle.clear()
        conn = Conn(self.established, reader, writer)
        try:
            while True:
                request = await self._read_request(conn)
                if request is None:
                    return
                self.seen.append(request)
                self._arrived.set()
                if not await self._respond(request, conn):
                    return
        except (OSError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._writers.discard(writer)
            self._tasks.discard(task)
            self.open -= 1
            if self.open == 0:
                self._idle.set()

    async def _read_request(self, conn: Conn) -> RawRequest | None:
        try:
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip()
                # A header sent twice reads as one, its values joined (RFC 9110 section 5.3).
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        length = int(headers.get("content-length", "0"))
        body = await conn.reader.readexactly(length) if length else b""
        return RawRequest(len(self.seen), conn.number, method, target, headers, body)


@contextlib.asynccontextmanager
async def raw_server(
    respond: Respond, *, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    """``async with raw_server(script) as server:`` a started ``RawServer``, closed on exit."""
    server = RawServer(respond, host=host, tls=tls)
    await server.start(port)
    try:
        yield server
    finally:
        await server.close()


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A loopback port whose accept queue is full, so a new connect hangs in SYN_SENT.

    A listening socket with backlog 0 that never accepts, filled by plain sockets: Linux drops
    further SYNs instead of refusing them, which is what a connect timeout looks like.
    Yields the port.
    """
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def gzip_bomb(decompressed: int) -> bytes:
    """Gzip bytes that inflate to ``decompressed`` zero bytes, built without holding them."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1024 * 1024)
    parts = [stream.compress(block) for _ in range(decompressed // len(block))]
    parts.append(stream.flush())
    return b"".join(parts)


_COMPLAINTS = (
    "was destroyed but it is pending",
    "never retrieved",
    "was never awaited",
    "Unclosed",
    "unclosed",
)


def loop_complaints(records: list[logging.LogRecord]) -> list[str]:
    """Log lines in which asyncio or aiohttp complain about leaked tasks or connections."""
    found = []
    for record in records:
        if record.name.split(".")[0] not in ("asyncio", "aiohttp"):
            continue
        message = record.getMessage()
        if any(word in message for word in _COMPLAINTS):
            found.append(message)
    return found
