"""A minimal, fast HTTP/1.1 server for the benchmarks, meant to run in its own process.

``python -m benchmarks._server [--latency S] [--pages N] [--page-size N] [--embeddings]``
listens on 127.0.0.1 (a free port), prints ``READY <port>`` on stdout, and serves until its
stdin closes or it is terminated:

- ``GET /v2/extract/{jobId}``: a canned ~3 KB job (``benchmarks._bodies.job_template``) with the
  requested id, answered at once (or after ``--extract-latency``);
- ``POST /v2/search``: page ``pagination.page`` (from 1) of ``--pages`` pre-encoded pages of
  ``--page-size`` hits, after ``--latency`` seconds; a page past the end is empty;
- ``GET /_stats``: ``{"requests": n, "cpu": seconds}``, the server's request count and its own
  CPU time, so a benchmark can tell whether the server was the bottleneck.

It is a bare ``asyncio.Protocol`` (on uvloop when installed) rather than a web framework so that
it costs a fraction of what the clients under test cost: a benchmark of a client must not end
up measuring the server. It checks nothing (no key, no validation): the emulator in
``asyncsearch.testing`` is the faithful one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._bodies import job_template, search_page_body

_HEAD = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"


def _response(status: int, body: bytes, headers: bytes = b"") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 400: b"Bad Request"}.get(status, b"Error")
    return _HEAD % (status, reason, len(body), headers) + body


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.latency: float = args.latency
        self.extract_latency: float = args.extract_latency
        self.page_size: int = args.page_size
        # As the service's answers (the emulator's) carry one: the client reads it on each answer.
        self.request_id: bool = args.request_id
        self.job_prefix, self.job_suffix = job_template()
        self.pages: list[bytes] = []
        total = args.pages * args.page_size
        for n in range(args.pages):
            body = search_page_body(
                args.page_size,
                first_index=n * args.page_size,
                embeddings=args.embeddings,
                total=total,
                has_more=n < args.pages - 1,
            )
            self.pages.append(_response(200, body))
        self.past_end = _response(
            200, json.dumps({"total": total, "hasMore": False, "hits": []}).encode()
        )
        self.not_found = _response(404, b'{"error":{"status":404,"code":"not_found"}}')
        self.requests = 0


class _HTTP(asyncio.Protocol):
    def __init__(self, state: _State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport.
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
            method, target, _ = line.split(b" ", 2)
            self.handle(method, target, body)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def handle(self, method: bytes, target: bytes, body: bytes) -> None:
        state = self.state
        state.requests += 1
        path = target.split(b"?", 1)[0]
        if method == b"GET" and path.startswith(b"/v2/extract/"):
            job_id = path[len(b"/v2/extract/") :]
            rid = b"X-Request-Id: req-%08d\r\n" % state.requests if state.request_id else b""
            data = _response(200, state.job_prefix + job_id + state.job_suffix, rid)
            self.later(state.extract_latency, data)
        elif method == b"POST" and path == b"/v2/search":
            try:
                pagination = json.loads(body or b"{}").get("pagination") or {}
                page = int(pagination.get("page") or 1)
            except (ValueError, AttributeError):
                self.send(_response(400, b'{"error":{"status":400}}'))
                return
            data = state.pages[page - 1] if 1 <= page <= len(state.pages) else state.past_end
            self.later(state.latency, data)
        elif method == b"GET" and path == b"/_stats":
            stats = {"requests": state.requests, "cpu": time.process_time()}
            self.send(_response(200, json.dumps(stats).encode()))
        else:
            self.send(state.not_found)

    def later(self, delay: float, data: bytes) -> None:
        if delay > 0:
            self.loop.call_later(delay, self.send, data)
        else:
            self.send(data)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.0, help="search answer delay, seconds")
    parser.add_argument("--extract-latency", type=float, default=0.0, help="job answer delay")
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--embeddings", action="store_true", help="hits carry embeddings")
    parser.add_argument("--request-id", action="store_true", help="job answers carry X-Request-Id")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    state = _State(args)
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def watch_stdin() -> None:
        # The parent holds our stdin open: EOF means it is gone, so we go too.
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stopped.set)

    server = await loop.create_server(lambda: _HTTP(state), "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"READY {port}", flush=True)
    async with server:
        await stopped.wait()


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(args))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(args))


if __name__ == "__main__":
    main()
