"""Capabilities composed at random against a loopback server: the promises where they meet.

Each example draws a plan (``make_plan``): a pool of 1-4 connections, one to four calls run at
once on one client (direct searches, incognito or not, ``get_extraction``, page walks, bulk
calls over a list, over a slow async id source, or over a source that itself calls the client),
aiohttp client middlewares (on the client and on a call: pass-through, one that reads the body,
one whose side request fails after ``handler()`` returned, one calling ``handler()`` twice),
what the server does with each attempt (429 and 503 with a small ``Retry-After``, a reset,
an answer held back, gzip and chunked bodies), deadlines, cancellations, and calls started
once another call's first request reached the server; and the client's knobs (issue 45): a
``RateLimit``, a key provider (rotating, slow, failing), a forward proxy (``Gateway``: plain, or
tunnelling to the service over TLS with a test CA, or refusing every tunnel with 407 or 502),
same-origin redirects before every answer, and ``max_response_bytes`` below every answer. Each
seed has a theme (``THEMES``, ``seed % len(THEMES)``) that makes one hard composition likely: a
swarm of calls waiting for the one connection under a rate limit, redirects under a rate limit, a
middleware quoting the headers through a proxy with credentials, a 503 with the next token past
the deadline, a refusing proxy, a failing key provider, a bulk retry waiting for a connection
past its deadline, the size cap with a middleware that reads the body; ``mixed`` turns the knobs
on at random. ``Example.run`` plays it and checks:

- never more TCP connections open at once than the pool's size, and none left open once the
  client is closed (counted by ``CountingProxy``, a plain TCP proxy in front of the server);
- no task left behind: none named ``asyncsearch.*`` once the calls have ended, none at all
  once the client, the proxy and the server are closed; nothing reported to the loop's
  exception handler;
- a call with a ``deadline`` ends within it plus 50 ms (times ``TIME_SCALE``), by the loop's
  clock;
- a non-incognito search is never acted on twice for one call: at most one of its requests
  got an answer other than 429 or 503 (the two a search is retried after under
  ``retry_search="safe"``);
- every bulk id is answered exactly once, each with the outcome its attempts call for;
- every call ends as its plan says (``expect``): a user middleware's own error re-raised as its
  own type after one attempt, ``handler()`` called twice a clear error after one attempt, a
  body read by a middleware still decoded for the SDK, no ``PoolTimeoutError`` at all (the
  pool's wait, ``Timeout.pool``, is far longer than any answer is held);
- no secret (the API key, a rotating key, the proxy's password or its base64) in any error's
  text: ``str``, ``repr``, arguments, the whole ``__cause__``/``__context__`` chain, and the
  formatted traceback;
- the requests the server saw for each request of a call: its ``attempts`` (errors, and
  ``APIResponse`` for ``get``) plus one per redirect followed; where the proxy refuses every
  tunnel, the ``CONNECT`` s it refused add up to the calls' attempts;
- under a rate limit, at most ``per_second + burst + 1`` requests in any second, timed at the
  server (at the proxy where it refuses them), widened only by the loop's own lateness;
- a key provider asked at most once per call (a bulk id, a page: a call each; a failing one
  stops a bulk call at once), a success over ``max_response_bytes`` never returned, a proxy's
  refusal a ``ProxyError`` of its status, a failing provider's error its own (direct) or a
  ``KeyProviderError`` (bulk).

Nothing waits on a bet about which task is faster: answers are held with an event, a slow id
source waits for one, a cancellation waits for the call to reach the point it targets. Time
bounds only end a stuck example (as a failure) and never decide an outcome that is correct.

Environment:
    ASYNCSEARCH_COMPOSITION_EXAMPLES  how many examples (default 30, a few seconds)
    ASYNCSEARCH_COMPOSITION_SEED      the first example's seed (default: ``DEFAULT_SEED``, so
                                      that the suite checks the same examples every run;
                                      ``random`` explores new ones, printed on failure);
                                      example ``i`` uses ``seed + i``
    ASYNCSEARCH_COMPOSITION_SUBSET    ``today-safe``: only compositions that main at 1842239
                                      handles (no slow or calling id sources, no bulk deadline,
                                      no failing or twice-calling middleware, no body-reading
                                      middleware with a compressed or chunked answer)
    ASYNCSEARCH_COMPOSITION_KEEP_GOING  ``1``: run every example and report every failing one,
                                      instead of stopping at the first

Reproduce a failure with the seed it prints:
``ASYNCSEARCH_COMPOSITION_SEED=<seed> ASYNCSEARCH_COMPOSITION_EXAMPLES=1 pytest
tests/test_composition.py``; ``--show-capture=no`` leaves out the DEBUG log of every example.

``SCENARIOS`` are fixed plans, one per defect the issue found where two capabilities meet (a
random run of the default size finds each of them too, but not surely); they are checked like
random plans, and skipped in the today-safe subset.

Only detection, never a verdict, may depend on which ready task the loop runs first: a scenario
or a random plan may miss a defect in an interleaving where it does not show, but a correct
client passes every interleaving.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import json
import math
import os
import random
import re
import socket
import ssl
import threading
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import trustme
import yarl
from aiohttp import web

from asyncsearch import (
    APIConnectionError,
    APITimeoutError,
    AsyncSearchClient,
    AsyncSearchError,
    ExtractionJob,
    InternalServerError,
    KeyProviderError,
    PoolTimeoutError,
    ProxyError,
    RateLimit,
    RateLimitError,
    ResponseTooLargeError,
    RetryPolicy,
    SearchClient,
    SearchHit,
    SearchPage,
    Timeout,
)

from .conftest import API_KEY
from .helpers import TIME_SCALE, client_tasks, turns
from .test_security import server_tls, trusting

EXAMPLES = int(os.environ.get("ASYNCSEARCH_COMPOSITION_EXAMPLES", "30"))
SUBSET = os.environ.get("ASYNCSEARCH_COMPOSITION_SUBSET", "all")
KEEP_GOING = os.environ.get("ASYNCSEARCH_COMPOSITION_KEEP_GOING", "") not in ("", "0")
#: The first seed of a default run: fixed, so that a run of the suite checks the same examples
#: every time (a test fails only when a promise breaks); ``random`` explores new ones.
DEFAULT_SEED = 20261127
_SEED = os.environ.get("ASYNCSEARCH_COMPOSITION_SEED", str(DEFAULT_SEED))
FIRST_SEED = random.SystemRandom().randrange(2**32) if _SEED == "random" else int(_SEED)

#: How late a call with a deadline may end (the issue's 50 ms, scaled for a busy machine).
DEADLINE_SLACK = 0.05 * TIME_SCALE
#: ``Timeout.pool`` of every example: longer than any answer is ever held (see ``Example.run``),
#: so a ``PoolTimeoutError`` means a connection was held by something that was not a request.
POOL_WAIT = 3.0 * TIME_SCALE
#: How long the calls get to reach their held answers before those are released anyway.
REACH_BOUND = 1.0 * TIME_SCALE
#: How long past the longest deadline the held answers stay held, if a deadline call has not
#: ended by then (it is late already: the check below says so).
DEADLINE_GRACE = 0.35 * TIME_SCALE
#: How long an example's calls may take in all before the example fails as stuck.
LIVENESS = 8.0 * TIME_SCALE
#: How long the client's connections may take to close once it is closed.
CLOSE_BOUND = 3.0 * TIME_SCALE
#: Attempts of one request: the default ``max_retries=2`` plus one.
MAX_ATTEMPTS = 3
RETRY_AFTER = "0.01"

#: Answers that are a success, by how the body travels.
SUCCESSES = ("ok", "gzip", "chunked", "gzip-chunked")
#: What the server may do with one attempt besides a success.
FAULTS = ("429", "503", "reset")
DIRECT_KINDS = ("search", "search-incognito", "get")
WALK_KINDS = ("pages", "hits")
BULK_KINDS = ("gather", "iter")
CALL_MIDDLEWARES = ("pass", "body", "audit", "audit-raw", "audit-quoting", "twice")
#: The middlewares main at 1842239 gets wrong whatever they meet.
FAILING_MIDDLEWARES = ("audit", "audit-raw", "audit-quoting", "twice")
#: Many direct calls of ``get_extraction`` started at once (one per id).
SWARM = "swarm"

#: Each example's theme (``seed % len(THEMES)``): a composition the plan makes likely, so that
#: every run of ``len(THEMES)`` seeds or more meets each of them (issue 45); ``mixed`` turns the
#: client's knobs on at random over the random calls.
THEMES = (
    "mixed",
    "rate-pool",
    "rate-redirects",
    "proxy-plain",
    "rate-deadline",
    "proxy-refuse",
    "key-failing",
    "bulk-deadline",
    "size-cap",
    "blocking",
)
SERVICE_NAME = "search.invalid"  # reached only through the plan's proxy
PROXY_LOGIN, PROXY_PASSWORD = "team", "pr0xy-S3cret-DO-NOT-LOG"
PROXY_HEADER = "Basic " + base64.b64encode(f"{PROXY_LOGIN}:{PROXY_PASSWORD}".encode()).decode()
#: What no error may show: the key (a rotating one starts with it) and the proxy's credentials.
SECRETS = (API_KEY, PROXY_PASSWORD, PROXY_HEADER.split()[-1])
#: How long held answers stay held at least under a rate limit: long enough for the calls
#: waiting meanwhile to be owed more tokens than the bound's slack.
RATE_HOLD = 0.8
#: ``max_response_bytes`` of a size-cap plan: below every success body of the plans (~3 KB).
SIZE_CAP = 1024

pytestmark = pytest.mark.timeout(max(120.0, EXAMPLES * 4.0))


# -- the plan of one example ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One call of an example; ``faults`` are what the server does with its request's attempts
    (bulk: ``id_faults``, one tuple per id), ``success`` how its successful body travels."""

    name: str
    kind: str
    faults: tuple[str, ...] = ()
    success: str = "ok"
    middleware: str | None = None
    deadline: float | None = None
    cancel: bool = False
    #: Start once this call's first request reached the server (or its slow id source waits
    #: for its gate, or it ended).
    after: str | None = None
    # bulk calls
    source: str = "list"
    concurrency: int = 1
    id_faults: tuple[tuple[str, ...], ...] = ()
    # walks
    pages: int = 1

    def __repr__(self) -> str:
        fields = [self.kind]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "kind") and value != f.default:
                fields.append(f"{f.name}={value!r}")
        return f"{self.name}({', '.join(fields)})"


@dataclass(frozen=True)
class Plan:
    """One example: the client's pool and knobs, and its calls.

    ``rate``: ``RateLimit(per_second, burst)``; ``key``: ``string``, or a key provider that
    ``rotates`` (a new key per question), is ``slow`` (50 ms a question) or is ``failing``;
    ``proxy``: ``plain`` (a forward proxy for an ``http://`` service), ``tunnel`` (``CONNECT`` to
    the service over TLS), or a tunnel whose proxy refuses every ``CONNECT`` (``tunnel-407``,
    ``tunnel-502``); ``redirects``: same-origin redirects (307) before every answer; ``cap``:
    ``max_response_bytes``.
    """

    seed: int
    pool: int
    client_middleware: str | None
    calls: tuple[Call, ...]
    theme: str = "mixed"
    rate: tuple[float, int] | None = None
    key: str = "string"
    proxy: str | None = None
    redirects: int = 0
    cap: int | None = None
    #: Every call made through a ``SearchClient`` (the blocking client), from a thread.
    blocking: bool = False

    def __str__(self) -> str:
        calls = "\n    ".join(repr(call) for call in self.calls)
        knobs = [
            f"{name}={value!r}"
            for name, value in (
                ("rate", self.rate),
                ("key", self.key),
                ("proxy", self.proxy),
                ("redirects", self.redirects),
                ("cap", self.cap),
                ("blocking", self.blocking or None),
            )
            if value not in (None, 0, "string")
        ]
        return (
            f"seed={self.seed} theme={self.theme} pool={self.pool} "
            f"client_middleware={self.client_middleware} {' '.join(knobs)}\n    {calls}"
        )

    @property
    def refused(self) -> int | None:
        """The status the plan's proxy answers every ``CONNECT`` with, if it refuses them."""
        return int(self.proxy[-3:]) if self.proxy in ("tunnel-407", "tunnel-502") else None


def _attempts(rng: random.Random, *, held: bool, success: str) -> tuple[str, ...]:
    """What the server does with one request's attempts: a few faults, then maybe held."""
    faults = [rng.choice(FAULTS) for _ in range(rng.choice((0, 0, 1, 1, 2, 3)))]
    if held:
        faults.append("held")
    elif rng.random() < 0.3:
        faults.append(success)  # explicit: the same as running out of faults
    return tuple(faults)


def make_plan(seed: int, subset: str = SUBSET) -> Plan:
    """A random composition; ``subset="today-safe"`` leaves out what main at 1842239 gets
    wrong (see the module docstring)."""
    rng = random.Random(seed)
    safe = subset == "today-safe"
    pool = rng.randint(1, 4)
    client_middleware = rng.choice((None, None, "pass", "body"))
    calls: list[Call] = []
    held = 0
    for index in range(rng.randint(1, 4)):
        name = f"c{index}"
        kind = rng.choice(DIRECT_KINDS + DIRECT_KINDS + WALK_KINDS + BULK_KINDS + BULK_KINDS)
        success = rng.choice(SUCCESSES)
        after = f"c{rng.randrange(index)}" if index and rng.random() < 0.35 else None
        if kind in DIRECT_KINDS:
            # Held answers never fill more than the pool: each of them then reaches the server
            # (checked before they are released), and others still get their turn.
            hold = held < pool and rng.random() < 0.45
            held += hold
            middleware = rng.choice((None, None, *CALL_MIDDLEWARES))
            deadline = rng.choice((0.15, 0.25)) if rng.random() < 0.35 else None
            cancel = hold and deadline is None and rng.random() < 0.4
            if safe and middleware in FAILING_MIDDLEWARES:
                middleware = None
            call = Call(
                name,
                kind,
                faults=_attempts(rng, held=hold, success=success),
                success=success,
                middleware=middleware,
                deadline=deadline,
                cancel=cancel,
                after=after,
            )
        elif kind in WALK_KINDS:
            call = Call(
                name,
                kind,
                faults=_attempts(rng, held=False, success=success),
                success=success,
                middleware=rng.choice((None, "pass", "body")),
                pages=rng.randint(1, 3),
                after=after,
            )
        else:
            source = rng.choice(("list", "list", "slow", "calling"))
            n_ids = rng.randint(1, 6)
            deadline = None
            if source == "list" and rng.random() < 0.4:
                # One id: the bulk call then lasts as long as its one request, whose deadline
                # it is (a deadline bounds each request of a bulk call, not the whole call).
                n_ids, deadline = 1, rng.choice((0.15, 0.25))
            if safe:
                source, deadline = "list", None
            call = Call(
                name,
                kind,
                success=success,
                middleware=rng.choice((None, "pass", "body")),
                deadline=deadline,
                cancel=source == "slow" and rng.random() < 0.25,
                after=after,
                source=source,
                concurrency=rng.randint(1, pool + 2),
                id_faults=tuple(
                    _attempts(rng, held=False, success=rng.choice(SUCCESSES)) for _ in range(n_ids)
                ),
            )
        calls.append(call)
    plan = Plan(seed, pool, client_middleware, tuple(calls))
    if safe:
        return _without_read_bodies_encoded(plan)
    return _themed(plan, rng)


def _ids(rng: random.Random, n: int, *, faults: bool = True) -> tuple[tuple[str, ...], ...]:
    """The faults of ``n`` ids' requests (none held)."""
    return tuple(
        _attempts(rng, held=False, success=rng.choice(SUCCESSES)) if faults else ()
        for _ in range(n)
    )


def _themed(plan: Plan, rng: random.Random) -> Plan:
    """``plan`` with the client's knobs of its theme (``THEMES``), and the calls it needs."""
    theme = THEMES[plan.seed % len(THEMES)]
    plain = dataclasses.replace(plan, theme=theme)
    direct = ("get", "search-incognito")
    if theme == "blocking":
        # The mixed knobs, every call through SearchClient from a thread of its own: ids from
        # a list (an async source is the caller's loop's), no cancellation (a thread's wait is
        # not cancelled with the task waiting for it).
        calls = tuple(dataclasses.replace(c, source="list", cancel=False) for c in plan.calls)
        mixed = _themed(dataclasses.replace(plan, seed=0, calls=calls), rng)
        return dataclasses.replace(mixed, seed=plan.seed, theme=theme, blocking=True)
    if theme == "mixed":
        redirects = rng.choice((0, 0, 0, 1, 2))
        calls = plan.calls
        if redirects:  # a failing middleware fails on the first redirect's answer: kept apart
            calls = tuple(
                dataclasses.replace(c, middleware=None)
                if c.middleware in FAILING_MIDDLEWARES
                else c
                for c in calls
            )
        rate = (rng.choice((10.0, 20.0)), rng.randint(1, 3)) if rng.random() < 0.25 else None
        key = rng.choice(("string", "string", "rotating", "slow"))
        proxy = rng.choice((None, None, "plain", "tunnel"))
        return dataclasses.replace(
            plain, calls=calls, rate=rate, key=key, proxy=proxy, redirects=redirects
        )
    if theme == "rate-pool":
        # The one connection held while a swarm of calls waits for it: tokens must not be
        # taken meanwhile and spent at once when it frees.
        swarm = Call("c1", SWARM, after="c0", id_faults=_ids(rng, rng.randint(8, 10)))
        calls = (Call("c0", "get", faults=("held",)), swarm)
        rate = (rng.choice((8.0, 10.0)), rng.randint(1, 2))
        return dataclasses.replace(plain, pool=1, calls=calls, rate=rate)
    if theme == "rate-redirects":
        # Each redirect followed is a request on the wire, and takes its token.
        bulk = Call(
            "c0",
            rng.choice(BULK_KINDS),
            concurrency=rng.randint(1, 3),
            id_faults=_ids(rng, 3, faults=False),
        )
        calls = (bulk, Call("c1", rng.choice(direct)))
        return dataclasses.replace(plain, calls=calls, rate=(4.0, 1), redirects=rng.randint(2, 3))
    if theme == "proxy-plain":
        # The proxy's credentials travel in each request's headers, which a middleware quotes.
        quoting = Call("c0", rng.choice(direct), middleware="audit-quoting")
        return dataclasses.replace(plain, calls=(quoting, *plan.calls[1:]), proxy="plain")
    if theme == "rate-deadline":
        # A 503, and the next token further away than the deadline: the 503 is the answer.
        first = Call("c0", rng.choice(direct), faults=(rng.choice(("503", "429")),), deadline=0.25)
        calls = (first, Call("c1", rng.choice(direct), after="c0"))
        return dataclasses.replace(plain, calls=calls, rate=(2.0, 1))
    if theme == "proxy-refuse":
        kinds = (*direct, "search", "pages", *BULK_KINDS)
        calls = tuple(
            Call(
                f"c{i}",
                kind := rng.choice(kinds),
                deadline=rng.choice((None, None, 0.25)) if kind not in BULK_KINDS else None,
                concurrency=rng.randint(1, 3),
                id_faults=_ids(rng, rng.randint(1, 5), faults=False),
            )
            for i in range(rng.randint(1, 3))
        )
        return dataclasses.replace(
            plain, calls=calls, proxy=rng.choice(("tunnel-407", "tunnel-502"))
        )
    if theme == "key-failing":
        # A bulk call first: its ids must name the provider, and stop at its first failure.
        kinds = (*direct, "search", "pages", *BULK_KINDS, *BULK_KINDS)
        calls = tuple(
            Call(
                f"c{i}",
                rng.choice(BULK_KINDS if i == 0 else kinds),
                concurrency=rng.randint(1, 3),
                id_faults=_ids(rng, rng.randint(2, 6)),
            )
            for i in range(rng.randint(1, 3))
        )
        return dataclasses.replace(plain, calls=calls, key="failing")
    if theme == "bulk-deadline":
        # Issue 37: the retry of a bulk request waits for the one connection, which a direct
        # call's held answer keeps past the bulk call's deadline.
        bulk = Call("c0", rng.choice(BULK_KINDS), deadline=0.25, id_faults=(("503",),))
        calls = (bulk, Call("c1", "get", faults=("held",), after="c0"))
        return dataclasses.replace(plain, pool=1, calls=calls)
    # size-cap: a body over the cap is refused, read by a middleware or not (issue 37). (An id
    # source calling the client would fail the bulk call with its own error: kept apart.)
    reads = rng.random() < 0.6
    plan = dataclasses.replace(
        plan,
        calls=tuple(
            dataclasses.replace(c, source="list") if c.source == "calling" else c
            for c in plan.calls
        ),
    )
    calls = (
        plan.calls
        if reads
        else (dataclasses.replace(plan.calls[0], middleware="body"), *plan.calls[1:])
    )
    return dataclasses.replace(
        plain, calls=calls, cap=SIZE_CAP, client_middleware="body" if reads else None
    )


def _without_read_bodies_encoded(plan: Plan) -> Plan:
    """The plan with plain bodies wherever a middleware reads them (main at 1842239 then hands
    its reader an empty gzip or chunked body)."""

    def plain(faults: tuple[str, ...]) -> tuple[str, ...]:
        return tuple("ok" if f in SUCCESSES else f for f in faults)

    calls = []
    for call in plan.calls:
        if "body" in (plan.client_middleware, call.middleware):
            call = dataclasses.replace(
                call,
                success="ok",
                faults=plain(call.faults),
                id_faults=tuple(plain(f) for f in call.id_faults),
            )
        calls.append(call)
    return dataclasses.replace(plan, calls=tuple(calls))


# -- what each call must end with --------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """How one request must end (``ok``, ``429``, ``503``, ``reset``, ``audit``, ``audit-raw``,
    ``twice``, ``deadline``, ``cancelled``) and how many of its attempts reach the server."""

    outcome: str
    arrivals: int


def expect(faults: tuple[str, ...], *, idempotent: bool, call: Call) -> Expect:
    """What one request of ``call`` must end with, given what the server does with each attempt.

    Retries (``max_retries=2``): 429 and 503 always (a search too: the service did not act on
    it), a reset only for an idempotent request (a non-incognito search may have been acted
    on). A user middleware's own failure after ``handler()`` returned, and a second
    ``handler()`` call, end the call after that attempt.
    """
    for attempt in range(MAX_ATTEMPTS):
        arrivals = attempt + 1
        fault = faults[attempt] if attempt < len(faults) else "ok"
        if fault == "held" and call.cancel:
            return Expect("cancelled", arrivals)
        if fault == "held" and call.deadline is not None:
            return Expect("deadline", arrivals)
        if fault == "reset":
            if not idempotent or arrivals == MAX_ATTEMPTS:
                return Expect("reset", arrivals)
            continue
        # An answer came back through every middleware's handler().
        if call.middleware in ("audit", "audit-quoting"):
            return Expect("audit", arrivals)
        if call.middleware == "audit-raw":
            return Expect("audit-raw", arrivals)
        if call.middleware == "twice":
            return Expect("twice", arrivals)
        if fault in ("429", "503"):
            if arrivals == MAX_ATTEMPTS:
                return Expect(fault, arrivals)
            continue
        return Expect("ok", arrivals)
    raise AssertionError("unreachable")


# -- middlewares ---------------------------------------------------------------------------------


class AuditDown(Exception):
    """The side request of the ``audit`` middleware failed: its own error, not the SDK's."""


def make_middlewares(audit_url: str) -> dict[str, Any]:
    """The middlewares of one example; ``audit_url`` is a loopback port nobody listens on."""

    async def side_request() -> None:
        # An audit sink that is down: a real request, refused (aiohttp.ClientConnectorError).
        async with aiohttp.ClientSession() as session, session.post(audit_url, data=b"audit"):
            pass

    async def passing(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        return await handler(request)

    async def reading(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        await response.read()
        return response

    async def audit(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        response.release()
        try:
            await side_request()
        except aiohttp.ClientError as exc:
            raise AuditDown(f"the audit sink is down ({response.status} not recorded)") from exc
        raise AssertionError("the audit sink answered")

    async def audit_raw(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        # The side request's own aiohttp error goes out as it is: it must not be taken for the
        # SDK's request failing to connect (that one was sent, and answered).
        response = await handler(request)
        response.release()
        await side_request()
        raise AssertionError("the audit sink answered")

    async def audit_quoting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        response = await handler(request)
        response.release()
        try:
            await side_request()
        except aiohttp.ClientError as exc:
            # Quotes the request's headers, the key among them, in a non-string argument.
            raise AuditDown("the audit sink is down", dict(request.headers)) from exc
        raise AssertionError("the audit sink answered")

    async def twice(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        # The "refresh and send again" pattern: the SDK must refuse the second send, clearly.
        first = await handler(request)
        first.release()
        return await handler(request)

    return {
        "pass": passing,
        "body": reading,
        "audit": audit,
        "audit-raw": audit_raw,
        "audit-quoting": audit_quoting,
        "twice": twice,
    }


# -- the server ------------------------------------------------------------------------------


@dataclass
class Route:
    """What the server does with one request key (a job id, a search text, a text and page)."""

    call: str
    faults: tuple[str, ...]
    success: str
    body: bytes


def job_body(job_id: str) -> bytes:
    # Padding, so that a chunked answer comes in more than one chunk.
    return json.dumps({"id": job_id, "state": "done", "name": job_id + "." * 3000}).encode()


def page_hits(text: str, page: int) -> list[str]:
    return [f"{text}-p{page}-h{i}" for i in range(2)]


def page_body(text: str, page: int, pages: int) -> bytes:
    hits = [{"id": hit, "score": 0.5, "name": "." * 1500} for hit in page_hits(text, page)]
    # In the spec's order, total and hasMore first (the walker reads them before the hits).
    return json.dumps({"total": 2 * pages, "hasMore": page < pages, "hits": hits}).encode()


class Service:
    """A loopback aiohttp.web server playing the example's plan, counting every arrival."""

    def __init__(self, routes: dict[str, Route], redirects: int = 0) -> None:
        self.routes = routes
        self.redirects = redirects  # same-origin 307s before each request's answer
        #: The fault served to each arrival of a key (past its redirects), in order.
        self.arrivals: defaultdict[str, list[str]] = defaultdict(list)
        #: Requests of each key that began an attempt (the first of its redirects, if any).
        self.attempts: Counter[str] = Counter()
        #: The loop's time of every request's arrival, redirects included.
        self.times: list[float] = []
        self.arrived: set[str] = set()  # calls with at least one arrival
        self.entered: set[str] = set()  # calls whose answer is (or was) held
        self.release = asyncio.Event()
        self.changed = asyncio.Event()
        self.unknown: list[str] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # handler_cancellation: a held answer whose client went away (deadline, cancel) ends.
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()

    async def key(self, request: web.Request) -> str:
        if request.method == "POST" and request.path == "/v2/search":
            body = json.loads(await request.read())
            page = (body.get("pagination") or {}).get("page")
            return body["text"] if page is None else f"{body['text']}#{page}"
        return request.path.rsplit("/", 1)[-1]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        key = await self.key(request)
        route = self.routes.get(key)
        # A rotating key provider's keys are API_KEY-1, API_KEY-2, ...
        if route is None or not request.headers.get("X-Api-Key", "").startswith(API_KEY):
            self.unknown.append(f"{request.method} {request.path} ({key})")
            return web.json_response({"error": {"message": "unknown"}}, status=404)
        self.times.append(asyncio.get_running_loop().time())
        hop = int(request.query.get("hop", "0"))
        if hop == 0:
            self.attempts[key] += 1
        if hop < self.redirects:
            self.arrived.add(route.call)
            self.changed.set()
            return web.Response(status=307, headers={"Location": f"{request.path}?hop={hop + 1}"})
        arrivals = self.arrivals[key]
        fault = route.faults[len(arrivals)] if len(arrivals) < len(route.faults) else route.success
        arrivals.append(fault)
        self.arrived.add(route.call)
        self.changed.set()
        if fault == "held":
            self.entered.add(route.call)
            self.changed.set()
            await self.release.wait()
            fault = route.success
        if fault == "reset":
            assert request.transport is not None
            request.transport.close()  # closed before a byte of an answer
            raise asyncio.CancelledError
        if fault in ("429", "503"):
            # An error body quoting the request's key, as a debugging proxy might.
            echo = f"overloaded; you sent X-Api-Key: {request.headers.get('X-Api-Key')}"
            return web.json_response(
                {"error": {"message": echo}},
                status=int(fault),
                headers={"Retry-After": RETRY_AFTER},
            )
        return await answer(request, route.body, fault)


async def answer(request: web.Request, body: bytes, how: str) -> web.StreamResponse:
    headers = {"Content-Type": "application/json"}
    if how.startswith("gzip"):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    if not how.endswith("chunked"):
        return web.Response(body=body, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.enable_chunked_encoding()
    await response.prepare(request)
    third = len(body) // 3 + 1
    for start in range(0, len(body), third):
        await response.write(body[start : start + third])
    await response.write_eof()
    return response


# -- counting connections ----------------------------------------------------------------------


class _Counted:
    """One connection the proxy counts, and the order of what the proxy saw of it: each mark is
    the proxy's event count (``CountingProxy.events``) when it happened."""

    def __init__(self, number: int, before: list[_Counted]) -> None:
        self.number = number
        #: The earlier connections not yet seen to end when this one was accepted.
        self.before = before
        #: Seen to end: the client's EOF or reset read, or the proxy closing it (after the server
        #: ended it, or at the end).
        self.ended: int | None = None
        #: The client's first bytes (a request) read, and its last ones.
        self.first_data: int | None = None
        self.last_data: int | None = None
        #: The server's first answer to it (its first bytes or its end): the request went
        #: through the proxy and the server.
        self.replied: int | None = None
        #: The earlier connections not seen to end when its first request was read.
        self.open_at_start: list[_Counted] = []


class CountingProxy:
    """A plain TCP proxy in front of the server: it sees every connection the client opens.

    A connection counts from its accept until it is seen to end: the client's EOF (or reset)
    read, or the proxy closing it. Overlaps are decided by order, not by time or loop turns.
    Every connection is read from its accept on, so that its end is seen as soon as it is in the
    proxy's socket (the loop reports every ready socket on each turn); a client that closed a
    connection before it opened the next one put its EOF there before the next one's SYN, so it
    is seen before the next one's first request is read, and long before that request's answer
    comes back from the server. Once every connection has ended (``overlaps``), an earlier
    connection not seen to end when a new one's first request was read overlaps it if it then
    still sent data, was still not seen to end when the server answered the new one, or never
    ended: past the pool, that is too many connections open at once.
    """

    def __init__(self, backend_port: int, limit: int) -> None:
        self.backend_port = backend_port
        self.limit = limit
        self.open: dict[int, _Counted] = {}
        self.counted: list[_Counted] = []
        self.events = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.handlers: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    def mark(self) -> int:
        self.events += 1
        return self.events

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.connection, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        before = [c for c in self.open.values() if c.ended is None]
        counted = _Counted(len(self.counted), before)
        self.counted.append(counted)
        self.open[counted.number] = counted
        self.idle.clear()
        self.writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        # What the client sends is read from the accept on, and queued until the server's
        # connection is open.
        chunks: asyncio.Queue[bytes] = asyncio.Queue()
        reading = asyncio.create_task(
            self.read_client(reader, chunks, counted), name="composition.proxy.pipe"
        )
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.backend_port)
            self.writers.add(upstream)
            pipes = [
                asyncio.create_task(_forward(chunks, upstream), name="composition.proxy.pipe"),
                asyncio.create_task(
                    self.answer(up_reader, writer, counted), name="composition.proxy.pipe"
                ),
            ]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except OSError:
            pass
        finally:
            if counted.ended is None:
                counted.ended = self.mark()
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            for end in (writer, upstream):
                if end is not None:
                    end.close()
                    self.writers.discard(end)
            del self.open[counted.number]
            if not self.open:
                self.idle.set()
            self.handlers.discard(task)

    async def read_client(
        self, reader: asyncio.StreamReader, chunks: asyncio.Queue[bytes], counted: _Counted
    ) -> None:
        """Queue what the client sends, marking when; it ends when the client ends it."""
        try:
            while data := await reader.read(65536):
                counted.last_data = self.mark()
                if counted.first_data is None:
                    counted.first_data = counted.last_data
                    counted.open_at_start = [c for c in counted.before if c.ended is None]
                chunks.put_nowait(data)
        except OSError:
            pass
        finally:
            if counted.ended is None:
                counted.ended = self.mark()
            chunks.put_nowait(b"")

    async def answer(
        self, source: asyncio.StreamReader, target: asyncio.StreamWriter, counted: _Counted
    ) -> None:
        """Copy the server's answers to the client, marking the first one (or its end)."""
        try:
            while data := await source.read(65536):
                if counted.replied is None:
                    counted.replied = self.mark()
                target.write(data)
                await target.drain()
        except OSError:
            pass
        if counted.replied is None:
            counted.replied = self.mark()

    def overlaps(self) -> list[str]:
        """Connections open at once past the pool, decided once every connection has ended."""
        found = []
        for counted in self.counted:
            start, replied = counted.first_data, counted.replied
            if start is None or len(counted.open_at_start) < self.limit:
                continue
            still = [
                earlier.number
                for earlier in counted.open_at_start
                if earlier.ended is None
                or (earlier.last_data is not None and earlier.last_data > start)
                or (replied is not None and earlier.ended > replied)
            ]
            if len(still) >= self.limit:
                found.append(
                    f"{len(still) + 1} connections open at once on a pool of {self.limit}: "
                    f"{', '.join(map(str, still))} still open once connection {counted.number} "
                    "carried a request (sent more, or ended only after its answer, or never)"
                )
        return found

    async def stop(self) -> None:
        for writer in list(self.writers):
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=CLOSE_BOUND)


async def _forward(chunks: asyncio.Queue[bytes], target: asyncio.StreamWriter) -> None:
    try:
        while data := await chunks.get():
            target.write(data)
            await target.drain()
    except OSError:
        pass


# -- a forward proxy -------------------------------------------------------------------------------


class Gateway:
    """A forward proxy on loopback, in front of ``CountingProxy``: one connection of its own to
    it per connection of the client's, so that the connections counted stay the client's.

    It tunnels a ``CONNECT`` (to the service over TLS) and forwards an absolute-URI request (to
    the plain one), each checked for the plan's credentials (a 407 without them); ``refuse``
    answers every ``CONNECT`` with that status instead. ``connects`` holds the loop's time of
    each ``CONNECT``; ``refused`` counts the requests refused for their credentials.
    """

    def __init__(self, upstream: int, refuse: int | None) -> None:
        self.upstream = upstream
        self.refuse = refuse
        self.connects: list[float] = []
        self.refused = 0
        self.handlers: set[asyncio.Task[Any]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.handlers):
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        upstream: asyncio.StreamWriter | None = None
        pipes: list[asyncio.Task[None]] = []
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")[:-2]
                headers = {k.lower(): v for k, v in (f.split(": ", 1) for f in fields)}
                method, target, version = line.split(" ")
                if headers.get("proxy-authorization") != PROXY_HEADER:
                    self.refused += 1
                    writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                    writer.write(b"Content-Length: 0\r\n\r\n")
                    await writer.drain()
                    return
                if method == "CONNECT":
                    self.connects.append(asyncio.get_running_loop().time())
                    if self.refuse is not None:
                        writer.write(f"HTTP/1.1 {self.refuse} Refused\r\n".encode())
                        writer.write(b"Content-Length: 0\r\n\r\n")
                        await writer.drain()
                        return
                    up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream)
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    pipes.append(
                        asyncio.create_task(_pipe(up_reader, writer), name="composition.proxy.pipe")
                    )
                    await _pipe(reader, upstream)
                    return
                if upstream is None:
                    up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream)
                    pipes.append(
                        asyncio.create_task(_pipe(up_reader, writer), name="composition.proxy.pipe")
                    )
                hop = ("proxy-authorization", "proxy-connection")
                kept = [f for f in fields if f.split(":", 1)[0].lower() not in hop]
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                path = yarl.URL(target).raw_path_qs
                upstream.write(
                    f"{method} {path} {version}\r\n".encode("latin-1")
                    + "".join(f"{f}\r\n" for f in kept).encode("latin-1")
                    + b"\r\n"
                    + body
                )
                await upstream.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client went away
        finally:
            for end in (writer, upstream):
                if end is not None:
                    end.close()
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self.handlers.discard(task)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until it ends, then end ``sink``."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        sink.close()


# -- one example --------------------------------------------------------------------------------


@dataclass
class Ran:
    """What one call did."""

    value: Any = None
    error: BaseException | None = None
    elapsed: float | None = None
    #: How late the loop ran a callback due at the call's deadline: on a busy machine the loop
    #: itself is late, and no client can end a call before its loop runs it.
    lag: float = 0.0
    #: Errors of the calls a ``calling`` id source made.
    inner_errors: list[BaseException] = field(default_factory=list)
    #: The ``attempts`` of each request answered with success, by its key (``APIResponse``).
    attempts: dict[str, int] = field(default_factory=dict)


class ProviderDown(Exception):
    """What a failing key provider raises: its own error."""


class LoopLag:
    """How late the loop ran a timer at most: on a busy machine requests sent in one second
    may be read by the server in the next, which no client can help; the rate limit's bound is
    widened by ``per_second`` times this, never more."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, loop.time() - before - 0.01)


def busiest(times: list[float]) -> int:
    """The most of ``times`` in any window of one second."""
    return max((sum(t <= u < t + 1.0 for u in times) for t in times), default=0)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class Example:
    """Plays one ``Plan`` on one client and collects every broken promise in ``violations``."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        rng = random.Random(plan.seed ^ 0x5EED)
        self.routes: dict[str, Route] = {}
        self.ids: dict[str, list[str]] = {}  # a call's job ids (get, bulk)
        self.probes: dict[str, list[str]] = {}  # the ids a calling source fetches itself
        self.texts: dict[str, str] = {}
        for call in plan.calls:
            if call.kind in DIRECT_KINDS[:2] or call.kind in WALK_KINDS:
                text = f"{call.name}-{plan.seed}"
                self.texts[call.name] = text
                if call.kind in WALK_KINDS:
                    for page in range(1, call.pages + 1):
                        faults = call.faults if page == 1 else ()
                        body = page_body(text, page, call.pages)
                        self.routes[f"{text}#{page}"] = Route(call.name, faults, call.success, body)
                else:
                    body = page_body(text, 1, 1)
                    self.routes[text] = Route(call.name, call.faults, call.success, body)
            elif call.kind == "get":
                job = _uuid(rng)
                self.ids[call.name] = [job]
                self.routes[job] = Route(call.name, call.faults, call.success, job_body(job))
            else:
                ids = [_uuid(rng) for _ in call.id_faults]
                self.ids[call.name] = ids
                for job, faults in zip(ids, call.id_faults, strict=True):
                    success = next((f for f in faults if f in SUCCESSES), call.success)
                    self.routes[job] = Route(call.name, faults, success, job_body(job))
                if call.source == "calling":
                    probes = [_uuid(rng) for _ in ids]
                    self.probes[call.name] = probes
                    for job in probes:
                        self.routes[job] = Route(call.name, (), "ok", job_body(job))
        self.service = Service(self.routes, plan.redirects)
        self.gateway: Gateway | None = None
        self.lag = LoopLag()
        self.asks = 0
        self.ran: dict[str, Ran] = {call.name: Ran() for call in plan.calls}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.source_waiting: set[str] = set()
        self.source_gate = asyncio.Event()
        self.violations: list[str] = []
        self.middlewares: dict[str, Any] = {}

    # the calls

    async def run_call(self, client: AsyncSearchClient, call: Call) -> Any:
        options: dict[str, Any] = {}
        if call.middleware is not None:
            options["middlewares"] = [self.middlewares[call.middleware]]
        if call.deadline is not None:
            options["deadline"] = call.deadline
        if call.kind == "search":
            return await client.search(self.texts[call.name], **options)
        if call.kind == "search-incognito":
            return await client.search(self.texts[call.name], incognito=True, **options)
        if call.kind == "get":
            return await self.get(client, call, self.ids[call.name][0], options)
        if call.kind == SWARM:
            gets = (self.get(client, call, job, options) for job in self.ids[call.name])
            return await asyncio.gather(*gets, return_exceptions=True)
        if call.kind == "pages":
            pages = client.search_pages(self.texts[call.name], page_size=2, **options)
            return [page async for page in pages]
        if call.kind == "hits":
            hits = client.search_hits(self.texts[call.name], page_size=2, **options)
            return [hit async for hit in hits]
        ids = self.source(client, call)
        if call.kind == "gather":
            return await client.gather_extractions(ids, concurrency=call.concurrency, **options)
        async with client.iter_extractions(ids, concurrency=call.concurrency, **options) as results:
            return [result async for result in results]

    def run_blocking(self, client: SearchClient, call: Call) -> Any:
        """``run_call`` through the blocking client, in a thread of the caller's."""
        options: dict[str, Any] = {}
        if call.middleware is not None:
            options["middlewares"] = [self.middlewares[call.middleware]]
        if call.deadline is not None:
            options["deadline"] = call.deadline
        if call.kind in ("search", "search-incognito"):
            incognito = call.kind == "search-incognito"
            return client.search(self.texts[call.name], incognito=incognito or None, **options)
        if call.kind == "get":
            job = self.ids[call.name][0]
            response = client.with_raw_response.get_extraction(job, **options)
            self.ran[call.name].attempts[job] = response.attempts
            return response.parse()
        if call.kind in WALK_KINDS:
            walk = client.search_pages if call.kind == "pages" else client.search_hits
            with walk(self.texts[call.name], page_size=2, **options) as items:
                return list(items)
        ids = list(self.ids[call.name])
        if call.kind == "gather":
            return client.gather_extractions(ids, concurrency=call.concurrency, **options)
        with client.iter_extractions(ids, concurrency=call.concurrency, **options) as results:
            return list(results)

    async def get(
        self, client: AsyncSearchClient, call: Call, job: str, options: dict[str, Any]
    ) -> ExtractionJob:
        """``get_extraction``, its ``attempts`` kept (through ``with_raw_response``)."""
        response = await client.with_raw_response.get_extraction(job, **options)
        self.ran[call.name].attempts[job] = response.attempts
        return response.parse()

    async def provide(self) -> str:
        """The plan's key provider: a new key per question, 50 ms a question when ``slow``."""
        self.asks += 1
        await asyncio.sleep(0.05 if self.plan.key == "slow" else 0)
        if self.plan.key == "failing":
            raise ProviderDown("the vault is sealed")
        return f"{API_KEY}-{self.asks}"

    def source(self, client: AsyncSearchClient, call: Call) -> Iterable[str] | AsyncIterator[str]:
        ids = self.ids[call.name]
        if call.source == "list":
            return list(ids)
        if call.source == "slow":
            return self.slow_source(call.name, ids)
        return self.calling_source(client, call.name, ids)

    async def slow_source(self, name: str, ids: list[str]) -> AsyncIterator[str]:
        """The ids once every call not over a slow source ended (until then, the bulk call's
        workers all wait for their first id)."""
        self.source_waiting.add(name)
        self.service.changed.set()
        await self.source_gate.wait()
        for job in ids:
            yield job

    async def calling_source(
        self, client: AsyncSearchClient, name: str, ids: list[str]
    ) -> AsyncIterator[str]:
        """Each id once the source fetched a job of its own with the client."""
        for job, probe in zip(ids, self.probes[name], strict=True):
            # Some work of its own first: the bulk call's other workers run meanwhile.
            await turns(3)
            try:
                fetched = await client.get_extraction(probe)
            except AsyncSearchError as exc:
                self.ran[name].inner_errors.append(exc)
                raise
            assert fetched.id == probe
            yield job

    async def play(self, client: AsyncSearchClient | SearchClient, call: Call) -> None:
        if call.after is not None:
            after = call.after
            await self.until(
                lambda: (
                    after in self.service.arrived
                    or after in self.source_waiting
                    or self.ended(after)
                )
            )
        ran = self.ran[call.name]
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = None if call.deadline is None else started + call.deadline
        late = (
            None
            if due is None
            else loop.call_at(due, lambda: setattr(ran, "lag", loop.time() - due))
        )
        try:
            if isinstance(client, SearchClient):
                ran.value = await asyncio.to_thread(self.run_blocking, client, call)
            else:
                ran.value = await self.run_call(client, call)
        except Exception as exc:
            ran.error = exc
        finally:
            ran.elapsed = loop.time() - started
            if late is not None:
                late.cancel()

    def ended(self, name: str | None) -> bool:
        task = self.tasks.get(name or "")
        return task is not None and task.done()

    async def until(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``ready()`` (re-checked at every arrival, held answer, end of a call)."""
        changed = self.service.changed
        try:
            async with asyncio.timeout(timeout):
                while not ready():
                    changed.clear()
                    await changed.wait()
        except TimeoutError:
            return False
        return True

    async def cancel_when_reached(self, call: Call) -> None:
        task = self.tasks[call.name]
        reached = self.source_waiting if call.kind in BULK_KINDS else self.service.entered
        await self.until(lambda: call.name in reached or task.done())
        task.cancel()

    # the example

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        before = asyncio.all_tasks()
        plan = self.plan
        tunnel = plan.proxy is not None and plan.proxy.startswith("tunnel")
        ca = trustme.CA() if tunnel else None
        await self.service.start(None if ca is None else server_tls(ca, SERVICE_NAME))
        proxy = CountingProxy(self.service.port, plan.pool)
        await proxy.start()
        if plan.proxy is not None:
            self.gateway = Gateway(proxy.port, plan.refused)
            await self.gateway.start()
        lag = asyncio.create_task(self.lag.watch(), name="composition.lag")
        # The audit sink that is down: a loopback port bound by nobody that listens.
        refuser = socket.socket()
        refuser.bind(("127.0.0.1", 0))
        self.middlewares = make_middlewares(f"http://127.0.0.1:{refuser.getsockname()[1]}/audit")
        middlewares = (
            () if plan.client_middleware is None else (self.middlewares[plan.client_middleware],)
        )
        options: dict[str, Any] = {"base_url": f"http://127.0.0.1:{proxy.port}"}
        if self.gateway is not None:
            scheme = "https" if tunnel else "http"
            gateway = f"http://{PROXY_LOGIN}:{PROXY_PASSWORD}@127.0.0.1:{self.gateway.port}"
            options = {"base_url": f"{scheme}://{SERVICE_NAME}", "proxy": gateway}
            options |= {"allow_http": True} if ca is None else {"ssl": trusting(ca)}
        if plan.rate is not None:
            options["rate_limit"] = RateLimit(plan.rate[0], burst=plan.rate[1])
        if plan.cap is not None:
            options["max_response_bytes"] = plan.cap
        make = SearchClient if plan.blocking else AsyncSearchClient
        client = make(
            API_KEY if plan.key == "string" else self.provide,
            max_connections=plan.pool,
            timeout=Timeout(pool=POOL_WAIT + self.wire_time()),
            retry=RetryPolicy(base=0.01, cap=0.02),
            retry_budget=None,
            middlewares=middlewares,
            **options,
        )
        watchers: list[asyncio.Task[None]] = []
        try:
            for call in plan.calls:
                task = asyncio.create_task(self.play(client, call), name=f"composition.{call.name}")
                task.add_done_callback(lambda _task: self.service.changed.set())
                self.tasks[call.name] = task
            for call in plan.calls:
                if call.cancel:
                    watcher = asyncio.create_task(
                        self.cancel_when_reached(call), name="composition.cancel"
                    )
                    watchers.append(watcher)
            await self.release_in_order()
            await self.finish_or_stop(watchers)
            await turns(20)
            left = [task.get_name() for task in client_tasks()]
            if isinstance(client, SearchClient):
                left = await asyncio.to_thread(_blocking_tasks, client)
            if left:
                self.violations.append(f"SDK tasks left once every call ended: {left}")
        finally:
            if isinstance(client, SearchClient):
                await asyncio.to_thread(client.close)
                threads = [
                    t.name for t in threading.enumerate() if t.name.startswith("asyncsearch.")
                ]
                if threads:
                    self.violations.append(f"threads of the client left once closed: {threads}")
            else:
                await client.aclose()
            try:
                async with asyncio.timeout(CLOSE_BOUND):
                    await proxy.idle.wait()
            except TimeoutError:
                self.violations.append(
                    f"{len(proxy.open)} connections still open after the client was closed"
                )
            lag.cancel()
            await asyncio.gather(lag, return_exceptions=True)
            if self.gateway is not None:
                await self.gateway.stop()
            await proxy.stop()
            await self.service.stop()
            refuser.close()
        self.violations.extend(proxy.overlaps())
        await turns(5)
        left = [t.get_name() for t in asyncio.all_tasks() - before if not t.done()]
        if left:
            self.violations.append(f"tasks left after the example: {left}")
        # In debug mode asyncio reports a connection its servers accepted and whose TLS handshake
        # the client cut (a deadline, a cancellation): the test servers', never the client's.
        incoming = "Error on transport creation for incoming connection"
        reported = [context for context in reported if context.get("message") != incoming]
        if reported:
            self.violations.append(f"the event loop reported: {reported}")
        self.check()

    async def release_in_order(self) -> None:
        """Release held answers, then slow id sources, each once what depends on it happened.

        Held answers: once every started call that holds one reached it (or ended), and every
        call with a deadline ended, each bounded. Slow sources: once every call not over one
        ended. A bound passing decides nothing: a late call fails its own checks.
        """
        plan, service = self.plan, self.service
        holders = [c.name for c in plan.calls if "held" in c.faults]
        await self.until(
            lambda: all(n in service.entered or self.ended(n) for n in holders), REACH_BOUND
        )
        if holders and plan.rate is not None:
            await asyncio.sleep(RATE_HOLD)  # a slow answer: the calls behind it wait meanwhile
        deadlines = [c for c in plan.calls if c.deadline is not None]
        if deadlines:
            longest = max(c.deadline or 0 for c in deadlines)
            await self.until(
                lambda: all(self.ended(c.name) for c in deadlines), longest + DEADLINE_GRACE
            )
        service.release.set()
        others = [c.name for c in plan.calls if c.source != "slow" or c.kind not in BULK_KINDS]
        await self.until(lambda: all(self.ended(n) for n in others), LIVENESS + self.wire_time())
        self.source_gate.set()

    def wire_time(self) -> float:
        """Seconds the plan's rate limit may take to let every request it may make out."""
        if self.plan.rate is None:
            return 0.0
        requests = sum(
            max(1, len(call.id_faults), call.pages) * (2 if call.source == "calling" else 1)
            for call in self.plan.calls
        )
        return requests * MAX_ATTEMPTS * (self.plan.redirects + 1) / self.plan.rate[0]

    async def finish_or_stop(self, watchers: list[asyncio.Task[None]]) -> None:
        tasks = list(self.tasks.values())
        bound = LIVENESS + self.wire_time()
        _done, pending = await asyncio.wait(tasks, timeout=bound)
        for task in pending:
            self.violations.append(f"{task.get_name()} did not end within {bound:g}s (stuck)")
            task.cancel()
        for watcher in watchers:
            watcher.cancel()
        await asyncio.wait([*tasks, *watchers], timeout=CLOSE_BOUND)

    # the checks

    def check(self) -> None:
        service = self.service
        if service.unknown:
            self.violations.append(f"requests the plan never made: {service.unknown}")
        for call in self.plan.calls:
            ran = self.ran[call.name]
            task = self.tasks[call.name]
            for error in self.errors_of(call, ran):
                self.check_error_text(call, error)
                if _in_chain(error, PoolTimeoutError):
                    self.violations.append(
                        f"{call.name}: PoolTimeoutError although no connection was held for "
                        f"anything but a request: {_describe(error)}"
                    )
            limit = None if call.deadline is None else call.deadline + DEADLINE_SLACK + ran.lag
            if limit is not None and ran.elapsed is not None and ran.elapsed > limit:
                self.violations.append(
                    f"{call.name}: deadline={call.deadline} but the call took "
                    f"{ran.elapsed:.3f}s ({_describe(ran.error) if ran.error else 'no error'})"
                )
            if task.cancelled() != call.cancel and not (call.cancel and task.done()):
                self.violations.append(f"{call.name}: cancelled={task.cancelled()}, planned no")
            if call.kind in DIRECT_KINDS:
                self.check_direct(call, ran, task)
            elif call.kind in WALK_KINDS:
                self.check_walk(call, ran)
            elif call.kind == SWARM:
                self.check_swarm(call, ran)
            elif not call.cancel:
                self.check_bulk(call, ran)
        self.check_attempts()
        self.check_rate()
        self.check_asks()
        for key, arrivals in service.arrivals.items():
            route = self.routes[key]
            call = next(c for c in self.plan.calls if c.name == route.call)
            if call.kind in ("search", *WALK_KINDS):
                acted = [f for f in arrivals if f not in ("429", "503")]
                if len(acted) > 1:
                    self.violations.append(
                        f"{call.name}: a non-incognito search reached the service "
                        f"{len(arrivals)} times for one call, {len(acted)} of them acted on "
                        f"({arrivals}) under retry_search='safe'"
                    )

    def errors_of(self, call: Call, ran: Ran) -> list[BaseException]:
        errors = [*ran.inner_errors]
        if ran.error is not None:
            errors.append(ran.error)
        if call.kind in BULK_KINDS and isinstance(ran.value, list):
            errors.extend(r.error for r in ran.value if r.error is not None)
        if call.kind == SWARM and isinstance(ran.value, list):
            errors.extend(r for r in ran.value if isinstance(r, BaseException))
        return errors

    def want(self, call: Call, faults: tuple[str, ...], *, idempotent: bool) -> Expect:
        """How one request of ``call`` must end, the plan's knobs applied to ``expect``."""
        plan = self.plan
        if plan.refused is not None:
            return Expect(f"proxy-{plan.refused}", 0)  # nothing reaches the service
        if plan.key == "failing":
            return Expect("provider", 0)
        want = expect(faults, idempotent=idempotent, call=call)
        if plan.cap is not None and want.outcome == "ok":
            return Expect("too-large", want.arrivals)  # every success body is over the cap
        return want

    def attempted(self, call: Call, ran: Ran) -> Iterable[tuple[str, int, BaseException | None]]:
        """The requests of ``call`` whose ``attempts`` the SDK told: key, attempts, error."""
        for key, attempts in ran.attempts.items():
            yield key, attempts, None
        keys: list[tuple[str, BaseException | None]] = []
        if call.kind in BULK_KINDS and isinstance(ran.value, list):
            keys = [(r.job_id, r.error) for r in ran.value if r.error is not None]
        elif call.kind == SWARM and isinstance(ran.value, list):
            keys = [
                (job, r)
                for job, r in zip(self.ids[call.name], ran.value, strict=True)
                if isinstance(r, BaseException)
            ]
        elif ran.error is not None and call.kind not in BULK_KINDS:
            text = self.texts.get(call.name)
            key = self.ids[call.name][0] if text is None else text
            keys = [(f"{key}#1" if call.kind in WALK_KINDS else key, ran.error)]
        for key, error in keys:
            if isinstance(error, AsyncSearchError) and error.attempts is not None:
                yield key, error.attempts, error

    def check_attempts(self) -> None:
        """The requests the server saw for each request of a call: ``attempts``, plus one per
        redirect followed (the server counts the first of each attempt's redirects). A proxy
        refusing every ``CONNECT`` saw all of the attempts of every call."""
        told = 0
        for call in self.plan.calls:
            if self.tasks[call.name].cancelled():
                continue
            for key, attempts, error in self.attempted(call, self.ran[call.name]):
                told += attempts
                seen = self.service.attempts[key]
                # The deadline may cut the last attempt before its request reached the server.
                cut = isinstance(error, APITimeoutError) and "during attempt" in str(error)
                if (
                    self.plan.refused is None
                    and attempts != seen
                    and not (cut and attempts == seen + 1)
                ):
                    self.violations.append(
                        f"{call.name} {key[:12]}: attempts={attempts}, but the server saw "
                        f"{seen} attempts of it ({_describe(error) if error else 'a success'})"
                    )
        refusing = self.gateway is not None and self.plan.refused is not None
        if refusing and self.gateway is not None and told != len(self.gateway.connects):
            self.violations.append(
                f"the calls' attempts add up to {told}, but the proxy refused "
                f"{len(self.gateway.connects)} CONNECTs"
            )

    def check_rate(self) -> None:
        """At most ``per_second + burst + 1`` requests in any second, timed where they arrive
        (the proxy's ``CONNECT`` where it refuses them all), widened only by the loop's own
        lateness (``LoopLag``)."""
        if self.plan.rate is None:
            return
        per_second, burst = self.plan.rate
        times = self.service.times
        if self.gateway is not None and self.plan.refused is not None:
            times = self.gateway.connects
        bound = per_second + burst + 1 + math.ceil(per_second * self.lag.worst)
        if (most := busiest(times)) > bound:
            self.violations.append(
                f"{most} requests in one second under RateLimit({per_second:g}, burst={burst}) "
                f"(at most {bound}, the loop late by {self.lag.worst:.3f}s at most)"
            )

    def check_asks(self) -> None:
        """A key provider is asked at most once per call (each bulk id and page is a call of
        its own; a failing one stops a bulk call at once); calls asking while a question is in
        flight share it."""
        plan = self.plan
        if plan.key == "string":
            return
        if plan.key == "failing":
            bound = len(plan.calls)
        else:
            bound = sum(
                max(1, len(c.id_faults), c.pages) * (2 if c.source == "calling" else 1)
                for c in plan.calls
            )
        if self.asks > bound:
            self.violations.append(
                f"the key provider was asked {self.asks} times (at most {bound})"
            )
        if self.gateway is not None and self.gateway.refused:
            self.violations.append(
                f"the proxy refused {self.gateway.refused} requests' credentials"
            )

    def check_error_text(self, call: Call, error: BaseException) -> None:
        shown = "".join(traceback.format_exception(error))
        for link in _chain(error):
            shown += f"{link}\n{link!r}\n{link.args!r}\n"
        for secret in SECRETS:
            if secret in shown:
                self.violations.append(
                    f"{call.name}: a secret ({secret[:6]}...) is in the text of "
                    f"{_describe(error)} (str, repr, args, its cause or context chain, or its "
                    "traceback)"
                )

    def check_outcome(self, call: Call, what: str, want: Expect, got: Any, error: Any) -> None:
        """One request's end (a direct call's, a bulk id's) against ``want``."""
        wrong = None
        if call.deadline is not None and _is_deadline(error):
            pass  # waiting for a connection, or a retry's wait, may meet the deadline first
        elif want.outcome == "ok":
            if error is not None:
                wrong = "a success"
        elif want.outcome == "deadline":
            if not _is_deadline(error):
                wrong = "APITimeoutError of the deadline"
        elif want.outcome == "too-large":
            if not isinstance(error, ResponseTooLargeError):
                wrong = f"ResponseTooLargeError (max_response_bytes={self.plan.cap})"
        elif want.outcome.startswith("proxy-"):
            status = int(want.outcome[-3:])
            if not (isinstance(error, ProxyError) and error.status_code == status):
                wrong = f"ProxyError {status}: the proxy refused, nothing was sent"
        elif want.outcome == "provider":
            if call.kind in BULK_KINDS:
                if not isinstance(error, KeyProviderError):
                    wrong = "KeyProviderError, naming the key provider"
            elif not isinstance(error, ProviderDown):
                wrong = "ProviderDown, the key provider's own error, as it is"
        elif want.outcome == "audit":
            if not isinstance(error, AuditDown):
                wrong = "AuditDown, the middleware's own error, as it is"
        elif want.outcome == "audit-raw":
            if not isinstance(error, aiohttp.ClientConnectorError):
                wrong = "the middleware's own aiohttp.ClientConnectorError, as it is"
        elif want.outcome == "twice":
            text = str(error)
            if not (
                isinstance(error, Exception)
                and not isinstance(error, APITimeoutError)
                and re.search(r"middleware|handler", text)
                and re.search(r"twice|second|more than once|again", text)
                and "server closed" not in text
            ):
                wrong = "a clear error naming handler() called twice (not a server's fault)"
        elif want.outcome in ("429", "503", "reset"):
            kind = {"429": RateLimitError, "503": InternalServerError, "reset": APIConnectionError}
            if not isinstance(error, kind[want.outcome]) or isinstance(error, APITimeoutError):
                wrong = f"{kind[want.outcome].__name__} after {want.arrivals} attempts"
        if wrong is None and error is None and want.outcome != "ok" and call.deadline is None:
            wrong = f"an error ({want.outcome})"
        if wrong is not None:
            got_text = _describe(error) if error is not None else f"success {got!r:.80}"
            self.violations.append(f"{call.name} {what}: expected {wrong}, got {got_text}")

    def check_arrivals(self, call: Call, what: str, key: str, want: Expect) -> None:
        arrivals = self.service.arrivals.get(key, [])
        bounded = call.deadline is not None or call.cancel
        if len(arrivals) != want.arrivals and not (bounded and len(arrivals) <= want.arrivals):
            self.violations.append(
                f"{call.name} {what}: {len(arrivals)} requests reached the server "
                f"({arrivals}), expected {want.arrivals} ({want.outcome})"
            )

    def check_direct(self, call: Call, ran: Ran, task: asyncio.Task[None]) -> None:
        idempotent = call.kind != "search"
        want = self.want(call, call.faults, idempotent=idempotent)
        key = self.texts.get(call.name) or self.ids[call.name][0]
        self.check_arrivals(call, "", key, want)
        if want.outcome == "cancelled" or task.cancelled():
            return
        self.check_outcome(call, "", want, ran.value, ran.error)
        if ran.error is None and ran.value is not None:
            if call.kind == "get":
                ok = isinstance(ran.value, ExtractionJob) and ran.value.id == key
            else:
                hits = page_hits(key, 1)
                ok = isinstance(ran.value, SearchPage) and [h.id for h in ran.value.hits] == hits
            if not ok:
                self.violations.append(f"{call.name}: wrong answer {ran.value!r:.120}")

    def check_walk(self, call: Call, ran: Ran) -> None:
        text = self.texts[call.name]
        want = self.want(call, call.faults, idempotent=False)
        self.check_arrivals(call, "page 1", f"{text}#1", want)
        if want.outcome != "ok":
            self.check_outcome(call, "page 1", want, ran.value, ran.error)
            return
        if ran.error is not None:
            self.violations.append(f"{call.name}: the walk failed: {_describe(ran.error)}")
            return
        hits = [hit for page in range(1, call.pages + 1) for hit in page_hits(text, page)]
        if call.kind == "hits":
            got = [h.id for h in ran.value if isinstance(h, SearchHit)]
        else:
            got = [h.id for p in ran.value if isinstance(p, SearchPage) for h in p.hits]
        if got != hits:
            self.violations.append(f"{call.name}: the walk gave {got}, expected {hits}")

    def check_bulk(self, call: Call, ran: Ran) -> None:
        ids = self.ids[call.name]
        if ran.error is not None or not isinstance(ran.value, list):
            self.violations.append(f"{call.name}: the bulk call raised {_describe(ran.error)}")
            return
        results = ran.value
        answered = Counter(r.job_id for r in results)
        if answered != Counter(ids):
            missing = sorted(set(ids) - set(answered))
            twice_ = sorted(i for i, n in answered.items() if n > 1)
            self.violations.append(
                f"{call.name}: {len(results)} results for {len(ids)} ids "
                f"(missing {missing}, more than once {twice_})"
            )
        if call.kind == "gather" and [r.job_id for r in results] != ids[: len(results)]:
            self.violations.append(f"{call.name}: gather_extractions out of input order")
        for job, faults in zip(ids, call.id_faults, strict=True):
            plain = dataclasses.replace(call, middleware=None)  # never one that fails
            want = self.want(plain, faults, idempotent=True)
            self.check_arrivals(call, f"id {job[:8]}", job, want)
            for result in (r for r in results if r.job_id == job):
                self.check_outcome(call, f"id {job[:8]}", want, result.job, result.error)
                if result.ok and result.job.id != job:
                    self.violations.append(f"{call.name}: id {job} answered with {result.job.id}")

    def check_swarm(self, call: Call, ran: Ran) -> None:
        if ran.error is not None or not isinstance(ran.value, list):
            self.violations.append(f"{call.name}: the calls raised {_describe(ran.error)}")
            return
        for job, faults, got in zip(self.ids[call.name], call.id_faults, ran.value, strict=True):
            want = self.want(call, faults, idempotent=True)
            self.check_arrivals(call, f"id {job[:8]}", job, want)
            error = got if isinstance(got, BaseException) else None
            self.check_outcome(call, f"id {job[:8]}", want, None if error else got, error)


def _blocking_tasks(client: SearchClient) -> list[str]:
    """The unfinished tasks of a ``SearchClient``'s loop but the one that keeps it running."""
    running = client._runner.running
    if running is None:
        return []

    async def names() -> list[str]:
        main, this = "asyncsearch.SearchClient.main", asyncio.current_task()
        return [t.get_name() for t in asyncio.all_tasks() if t is not this and t.get_name() != main]

    return asyncio.run_coroutine_threadsafe(names(), running[0]).result()


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and every exception its ``__cause__`` and ``__context__`` lead to."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        link = todo.pop()
        if any(link is s for s in seen):
            continue
        seen.append(link)
        todo.extend(e for e in (link.__cause__, link.__context__) if e is not None)
    return seen


def _in_chain(error: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(link, kind) for link in _chain(error))


def _is_deadline(error: object) -> bool:
    """The call's deadline ended it: its ``APITimeoutError``, or retries it stopped."""
    if isinstance(error, PoolTimeoutError) or not isinstance(error, AsyncSearchError):
        return False
    stopped = error.retries_stopped or ""
    return isinstance(error, APITimeoutError) or "deadline" in stopped


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "nothing"
    text = f"{type(error).__name__}: {error}"
    cause = error.__cause__ or error.__context__
    if cause is not None:
        text += f" (from {type(cause).__name__}: {cause})"
    return text[:400]


def _run_example(plan: Plan) -> list[str]:
    """Play ``plan`` in an event loop of its own; the promises it broke."""
    example = Example(plan)

    async def main() -> None:
        async with asyncio.timeout(LIVENESS * 3):
            await example.run()

    try:
        asyncio.run(main())
    except Exception as exc:  # a crash of the example itself is reported with its plan
        example.violations.append(
            "the example crashed: " + "".join(traceback.format_exception(exc))
        )
    return example.violations


def _report(plan: Plan, violations: list[str]) -> str:
    return f"{plan}\n  - " + "\n  - ".join(violations)


def test_composition() -> None:
    """Compositions drawn at random (see the module docstring), their promises checked."""
    # Shown with the failure even when a timeout stops the test.
    print(f"composition: {EXAMPLES} examples from seed {FIRST_SEED}, subset {SUBSET}")
    failures: list[str] = []
    for seed in range(FIRST_SEED, FIRST_SEED + EXAMPLES):
        plan = make_plan(seed)
        violations = _run_example(plan)
        if violations:
            failures.append(_report(plan, violations))
            if not KEEP_GOING:
                break
    assert not failures, (
        f"{len(failures)} of {EXAMPLES} examples from seed {FIRST_SEED} failed (subset "
        f"{SUBSET}; rerun one with ASYNCSEARCH_COMPOSITION_SEED=<seed> "
        "ASYNCSEARCH_COMPOSITION_EXAMPLES=1):\n\n" + "\n\n".join(failures)
    )


def _scenario(pool: int, *calls: Call, client_middleware: str | None = None) -> Plan:
    return Plan(0, pool, client_middleware, calls)


#: Compositions the issue found broken on main at 1842239, one per defect of its "Why" (the
#: random plans find them too, less surely in a small number of examples). None of them is in
#: the today-safe subset.
SCENARIOS = {
    # (1) A bulk worker waiting for its next id holds a connection: a direct call gets
    # PoolTimeoutError although nothing is in flight.
    "direct-call-beside-a-bulk-call-over-a-slow-source": _scenario(
        2,
        Call("c0", "gather", source="slow", concurrency=2, id_faults=((), (), ())),
        Call("c1", "get", after="c0"),
    ),
    # (1) An id source calling the client itself waits for a connection its own workers hold.
    "id-source-calling-the-client": _scenario(
        2, Call("c0", "gather", source="calling", concurrency=2, id_faults=((), (), ()))
    ),
    # (2) A bulk call's deadline while its retry waits for its connection back (held by a
    # direct call's answer).
    "bulk-deadline-while-its-retry-waits-for-a-connection": _scenario(
        1,
        Call("c0", "iter", deadline=0.25, id_faults=(("503",),)),
        Call("c1", "get", faults=("held",), after="c0"),
    ),
    # (3) A middleware failing after handler() returned: one attempt, its own error.
    "search-with-a-middleware-whose-side-request-fails": _scenario(
        2,
        Call("c0", "search", middleware="audit-raw"),
        Call("c1", "search", middleware="audit"),
        Call("c2", "get", middleware="audit"),
    ),
    # (3) A middleware calling handler() twice: a clear error after one attempt.
    "middleware-calling-handler-twice": _scenario(
        2, Call("c0", "get", middleware="twice"), Call("c1", "search", middleware="twice")
    ),
    # (4) A middleware that reads the body: the SDK still gets it, decoded.
    "body-reading-middleware-with-gzip-and-chunked-answers": _scenario(
        3,
        Call("c0", "get", success="gzip"),
        Call("c1", "search-incognito", success="chunked"),
        Call("c2", "gather", concurrency=2, id_faults=(("gzip-chunked",), ("503", "gzip"))),
        client_middleware="body",
    ),
    # The key in an error's cause: a middleware quoting the request's headers.
    "middleware-error-quoting-the-request-headers": _scenario(
        1, Call("c0", "get", middleware="audit-quoting")
    ),
}


@pytest.mark.skipif(SUBSET == "today-safe", reason="each scenario fails on main at 1842239")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_composition_scenario(name: str) -> None:
    """A composition the issue found broken, played and checked like a random one."""
    plan = SCENARIOS[name]
    violations = _run_example(plan)
    assert not violations, _report(plan, violations)


def test_the_plans_cover_every_capability() -> None:
    """Any 200 seeds draw every capability this test composes, and the today-safe subset
    leaves out what it says (no I/O: plans only)."""
    seen: set[str] = set()
    for seed in range(FIRST_SEED, FIRST_SEED + 200):
        for subset in ("all", "today-safe"):
            plan = make_plan(seed, subset)
            seen.add(f"pool{plan.pool}")
            seen.update((f"theme-{plan.theme}", f"key-{plan.key}", f"proxy-{plan.proxy}"))
            seen.add("rate" if plan.rate else "")
            seen.add("redirects" if plan.redirects else "")
            seen.add("cap" if plan.cap else "")
            if subset == "today-safe":
                assert (plan.rate, plan.key, plan.proxy, plan.redirects, plan.cap) == (
                    None,
                    "string",
                    None,
                    0,
                    None,
                )
            for call in plan.calls:
                seen.update((call.kind, f"mw-{call.middleware}", f"source-{call.source}"))
                seen.update(call.faults)
                seen.update(f for faults in call.id_faults for f in faults)
                seen.add("deadline" if call.deadline else "")
                seen.add("cancel" if call.cancel else "")
                seen.add("after" if call.after else "")
                if subset == "today-safe":
                    assert call.middleware not in FAILING_MIDDLEWARES
                    assert call.source == "list"
                    assert call.kind not in BULK_KINDS or call.deadline is None
    wanted = {
        *DIRECT_KINDS,
        *WALK_KINDS,
        *BULK_KINDS,
        *(f"mw-{m}" for m in CALL_MIDDLEWARES),
        *(f"source-{s}" for s in ("list", "slow", "calling")),
        *FAULTS,
        *SUCCESSES,
        "held",
        "deadline",
        "cancel",
        "after",
        *(f"pool{n}" for n in range(1, 5)),
        *(f"theme-{theme}" for theme in THEMES),
        *(f"key-{key}" for key in ("string", "rotating", "slow", "failing")),
        *(f"proxy-{p}" for p in ("plain", "tunnel", "tunnel-407", "tunnel-502")),
        "rate",
        "redirects",
        "cap",
        SWARM,
    }
    assert wanted <= seen, wanted - seen
