"""A local emulator of the search and extraction service, for tests, examples and benchmarks.

It serves the spec's endpoints over real HTTP from in-memory data, writes the wire format
itself (it never imports the SDK's models or client, so a decoding mistake of the SDK fails an
integration test instead of hiding on both sides), makes no outside requests, and can inject
faults. ``import asyncsearch`` never imports it; import ``asyncsearch.testing``.

Quick start
===========

::

    from asyncsearch import AsyncSearchClient
    from asyncsearch.testing import ServiceEmulator

    async with ServiceEmulator(api_key="test-key", seed=7) as emu:
        async with AsyncSearchClient(api_key=emu.api_key, base_url=emu.base_url) as client:
            page = await client.search("quarterly invoice")

``ServiceEmulator(api_key=None, *, seed=None, n_resources=200, n_jobs=50, host="127.0.0.1",
port=0, first_page=1, use_numpy=None, fault_seed=None, shutdown_timeout=1.0, strict=False,
idle_timeout=50.0)``

- ``api_key``: the key every request must send as ``X-Api-Key``; None generates one
  (``secrets.token_urlsafe``), read it back from ``emu.api_key``.
- ``seed``: None starts empty; an int seeds the workspace (no base header) with ``n_resources``
  resources and ``n_jobs`` extraction jobs (with webhook logs), and registers three link
  preview pages (``emu.page_urls``). The same seed gives identical data in every process.
- ``port=0`` picks a free loopback port; ``emu.base_url`` is ``http://127.0.0.1:<port>``.
- ``first_page``: the number of the first search page (1, or 0 for a zero-based service).
- ``use_numpy``: None uses numpy when importable; False forces the pure-Python path.
- ``idle_timeout``: seconds a connection may go without a request being handled (idle, or
  still sending its request line and headers, however slowly) before it is closed; with the
  default of 50 it is closed within 60 s (connections are looked at every tenth of it, so
  within ``idle_timeout * 1.2``). A request the emulator is handling (parked at a gate, slow)
  is never cut. A body that has not all arrived ``idle_timeout`` after its headers is a 408,
  and the connection is closed. The listen backlog is 1,024 (aiohttp's default is 128).
- ``fault_seed``: seeds the fault RNG (default: ``seed``, else 0).
- ``strict``: False (the default) answers what the spec leaves open the way a tolerant server
  would, so that tests passing here do not lean on 422s the spec never promises; True refuses
  it with a 422 naming the field, to catch typos. Both modes refuse what the spec fixes. The
  choices of each mode are marked below ("lenient:", "strict:").

``async with`` starts and stops it; or ``await emu.start()`` / ``await emu.stop()`` (the data
survives a stop; a restart with ``port=0`` gets a new port). ``emu.app`` is the
``aiohttp.web.Application``; ``serve_forever(host=, port=, api_key=, seed=, n_resources=,
n_jobs=, first_page=, strict=, on_ready=)`` runs one until cancelled, prints nothing, and calls
``on_ready(emulator)`` once it listens (for a ``serve`` command).

Python data API
===============

Items are plain dicts in wire form (camelCase names, as the spec). ``add_*`` fills every field
not given with a realistic default and merges nested objects key by key, so minimal items are
complete. A key the spec does not define raises ValueError (typo guard) unless ``strict=False``
(to inject extra fields on purpose). Returned dicts are copies. ``base_id=None`` is the
workspace; any other string is a base (created empty on first use).

- ``emu.add_resource(resource=None, /, *, base_id=None, text=None, chunks=None,
  ancestors=None, image=None, strict=True, **fields) -> dict``: ``text`` is split into 40-word
  chunks, or give ``chunks`` (strings or dicts of text, sequence, pageNumber, timeStart,
  timeEnd); these are what text search matches and quotes. ``image`` (bytes or a base64 data
  URL) is the resource's picture, which image search compares (see below). ``tags`` may be
  names (ids are stable per name).
  ``ancestors`` are the ids ``filters.ancestorIds`` matches (default: parent id, root folder id,
  root id). ``score``, ``chunks`` and ``embeddings`` are computed per hit, never stored.
- ``emu.add_job(job=None, /, *, base_id=None, next_states=(), strict=True, **fields) -> dict``:
  ``next_states`` scripts progress: each GET answers with the current state and then moves on,
  e.g. ``add_job(state="pending", next_states=["processing", "done"])`` reads pending,
  processing, done, done... ``emu.set_job_state(job_id, state, base_id=None)`` sets it now.
- ``emu.add_webhook_log(job_id, log=None, /, *, base_id=None, strict=True, **fields) -> dict``
  (detail form; ``attemptNumber`` defaults to the next number; KeyError for an unknown job).
- ``emu.add_page(url, html)``: the HTML ``GET /v2/link`` parses for ``url`` (all bases).
- ``emu.seed(n_resources=200, n_jobs=50, seed=0, base_id=None)``: add seeded data to a base.
- Reading back: ``emu.resources(base_id)``, ``emu.resource(id, base_id)``,
  ``emu.resource_chunks(id, base_id)``, ``emu.jobs(base_id)``, ``emu.job(id, base_id)``,
  ``emu.webhook_logs(job_id, base_id)``, ``emu.search_history`` (``SearchRecord(base_id,
  body)`` of each search not sent with ``incognito: true``; the latest 10,000 and at most
  16 MiB of them; a string of a body over 1,024 characters, such as an image, is kept as
  ``"<600,000 characters, sha256 HEX>"``, so a test compares it with
  ``hashlib.sha256(image.encode()).hexdigest()``).
- ``fake_image_data_url(content, mime="image/png")``: a fake image as a data URL (the bytes
  of ``content``, not a real picture, so ``asyncsearch.image_data_url`` would refuse them)
  whose image vector matches resources about ``content`` (see image search below). For a real
  picture use ``asyncsearch.image_data_url(path_or_bytes)``.

Seeded data
===========

Every field of the spec is present; nullable fields hold a realistic mix of values and nulls.
Texts are English-like sentences from ten topic word lists (finance, travel, engineering,
marketing, legal, health, cooking, nature, music, sports), so keyword search finds words such
as "invoice", "harbor" or "guitar". Ids are version 4 UUIDs; timestamps are ISO 8601 UTC with
milliseconds and ``Z`` (``2024-02-04T17:02:51.679Z``) everywhere. Seeded bases are cached per
(size, seed), so a seeded emulator per test is cheap. Values used where the spec shows none:

- resource ``kind``: document, image, video, audio, bookmark, note, default;
  ``stateProcessing``, job ``state``: pending, processing, done, failed;
  webhook log ``status``: pending, success, failed.
- ``root.type``: SYSTEM, USER, SHARED; ``root.subtype``: DEFAULT, PRIVATE, TEAM;
  ``documentType``: invoice, receipt, statement, contract, agreement, report, letter, other.
- ``label``: ``id`` 0 (``#00000000``, no colour) to 8, each with its ``hexColor``.
- Nullable fields read as scalars, as the spec says: ``preferences``, ``requestPayload`` and
  ``responseBody`` are strings (JSON text when set); ``attributes.document.keywords`` is a
  comma-separated string; ``attributes.document.security`` and ``media.color.alphaChannel``
  are booleans; sizes, widths, heights, pages, bit and sample rates and channels are integers;
  duration, frame rate, latitude and longitude are numbers. The one exception is
  ``data.attributes.document.structured``: an object when set, like
  ``extraction.document.structured``.
- A job's extraction sections that do not apply to its kind carry empty strings, zeros, false
  and nulls (e.g. ``document.pages`` 0 for an image); ``web`` image descriptors have ``url ""``.

Endpoints and the choices where the spec is silent
==================================================

All answers are JSON (``application/json``); success is always 200. Every answer carries an
``X-Request-Id`` (a new UUID each time), errors and injected faults included.

Under load: decoding a body over 64 KiB (JSON, base64, the picture's SHA-256, the ranking)
takes a few milliseconds of the event loop, and such bodies take turns, one per loop
iteration, so other requests are answered between them; Pillow's decoding of a picture it
recognises, and inflating a compressed body, run in one worker thread
(``asyncsearch.emulator.worker``), whose work releases the GIL. Two hundred image searches of
600,000 characters in flight leave a link preview answered in milliseconds.

Request bodies may be sent with ``Content-Encoding: gzip`` (or ``x-gzip``), ``deflate`` (zlib
or raw) or ``identity``; the emulator decodes them itself, within the body cap.

``POST /v2/search``
    - Both modes: the types the spec gives are required, ``null`` is accepted only for
      ``incognito``, ``filters.createdAfter`` and ``filters.createdBefore``, and the limits of
      ``text``, ``image``, ``precision`` and the UUID pattern hold; any Content-Type is read
      as JSON. Lenient: unknown fields (at any level) are ignored; an integer may be written
      ``2.0``; a ``queries`` element may be empty (it browses); a filter date may be a date
      alone (midnight UTC). Strict: each of these is a 422.
    - ``text``, ``image`` and ``resourceId`` may be combined; a query object's score is the
      mean of the scores of those it has. With none of them (and no ``queries``) the request
      browses: every resource passing the filters, each with score 1.0.
    - Scores are in [0, 1]. ``text``: ``0.7 * keyword + 0.3 * vector``, keyword = BM25 over
      name (weighted 3x), description and chunk text, divided by the best BM25 score in the
      base; vector = cosine similarity of ``small3_512`` vectors, clamped to [0, 1].
      ``image``: cosine similarity with ``clip2`` (a fake image, at most 1,024 bytes of UTF-8
      text, is embedded like that text, so ``fake_image_data_url("red bicycle")`` finds
      resources about red bicycles; any other picture gets eight signed features drawn from the
      SHA-256 of its bytes: microseconds per kilobyte, the same in every run), raised for a
      resource added with ``image=`` to how alike the two pictures are: 1.0 for identical bytes;
      with Pillow installed (the ``emulator`` extra), else 0, the correlation of 16 x 16 grey
      thumbnails, capped at 0.99, so a re-encoded or resized copy ranks the original first.
      Pictures Pillow cannot or will not decode (decompression bombs) match by bytes only. No
      model, no download. ``image`` must be a base64 data URL of an ``image/<subtype>`` media
      type (``data:text/plain;...`` is a 422 in both modes); its ``=`` padding is optional
      (lenient; the spec says "base64" and no more) or required (strict). ``resourceId``: cosine
      similarity with that resource's ``small3_512``; the resource itself is left out; an
      unknown id is a 404.
    - Vectors come from a hashing embedder: each term (lower-cased, plural-folded, stopwords
      dropped) adds signed counts to hashed positions, plus its first four letters (so
      "invoicing" is near "invoice"). ``small3_512`` embeds name, description and chunks;
      ``clip2`` embeds name, description, ``data.caption`` and ``data.keywords``. On the wire
      they are unit vectors with six decimals (sparse: mostly zeros).
    - ``precision`` (default 0.3) keeps hits with ``score > 0`` and ``score >= precision / 2``.
    - ``queries``: each element (``text``/``image``/``resourceId``/``filters``/``precision``)
      is searched on its own with its own filters AND the top-level filters, its precision
      defaulting to the top-level one; the hits are the union, each with its best score (and
      the chunks of that element). Top-level text/image/resourceId count as one more element.
    - Filters (all ANDed; an empty array is no constraint): ``kinds`` any of ``kind``;
      ``color`` any of ``label.id``; ``parentIds`` any of ``parent.id``; ``ancestorIds`` any of
      the resource's ancestors (parent chain up to the root folder, plus the root id);
      ``tagIds`` any tag in common; ``userIds`` any of ``user.id``; ``createdAfter`` and
      ``createdBefore`` are exclusive bounds on ``createdAt`` (any ISO 8601; naive means UTC).
    - ``sort.field``: score, createdAt, modifiedAt, name (case-insensitive), size;
      ``sort.order``: asc or desc. Defaults: score desc when there is a query, createdAt desc
      when browsing; an order's default is desc, except asc for name. Nulls sort last either
      way; ties go by id ascending. Lenient: another field falls back to the default
      (relevance), another order to the field's default. Strict: a 422.
    - ``pagination.page`` counts from ``first_page`` (1); ``pageSize`` defaults to 20, at most
      100. Lenient: a page below ``first_page`` is the first page, a pageSize below 1 is 1
      and above 100 is 100. Strict: a 422. ``total`` counts every hit, ``hasMore`` says a
      later page has hits; a page past the end is empty. Only the requested page is serialised.
    - Every hit carries ``score`` (6 decimals), ``chunks`` and ``embeddings``. ``chunks`` are
      the resource's chunks containing a query term, best first, at most 3, each with a score
      in (0, 1); empty for image, resourceId and browse queries.

``GET /v2/extract/{jobId}?format=json|markdown``
    ``format=markdown`` keeps the job's shape and replaces ``extraction.common.caption`` with a
    Markdown rendering: a ``# title`` heading, the caption, a ``**Keywords:**`` line, any OCR
    text and a source link. Lenient: unknown query parameters are ignored (on every GET).
    Strict: a 422.

``GET /v2/link?url=&type=cache|link``
    ``url`` must be a URI: lenient, any ``scheme:...`` (``ftp:``, ``mailto:``, ``urn:``);
    strict, an absolute http(s) URL written as RFC 3986 allows: no space, no control or
    non-ASCII character, no other character it does not allow unencoded, and ``%`` only before
    two hex digits. A URL not registered with ``add_page`` gets a synthetic preview derived
    from the URL alone, the same every time and never stored: ``title`` from
    the last path segment's words (else the host, else the URL), ``siteName`` the host without
    ``www.``, ``description`` "<title>, on <host>.", ``image`` a 1200 x 630 PNG at
    ``https://cdn.example.com/link-previews/<hash>.png``, ``favicon`` ``/favicon.ico`` of an
    http(s) origin (else ``url ""``), ``metadata`` the matching og: tags. Registered pages:
    ``type`` defaults to cache: cache answers with the stored preview of the URL if there is one;
    link parses the page again and refreshes the stored preview. The preview's ``url`` is the
    requested URL; ``title`` is og:title, else ``<title>``; ``type`` og:type, else "link";
    ``description`` og:description, else ``<meta name="description">``; ``siteName``
    og:site_name; ``image`` og:image (+ ``:width``, ``:height``, ``:type``) with ``url ""``
    when absent; ``favicon`` the first ``<link rel="... icon">`` (width and height from
    ``sizes``), else ``/favicon.ico`` of the origin; ``metadata`` every meta tag's
    property/name/itemprop/http-equiv -> content (first one wins). URLs match without
    fragment, with scheme and host in any case.

``GET /v2/extract/{jobId}/webhook-logs`` and ``.../webhook-logs/{logId}``
    ``{"items": [...]}`` of every log in summary form, in the order added (no paging); the
    detail form adds ``requestPayload`` and ``responseBody``. A log of another job is a 404.

Errors
======

Every non-2xx answer has one body shape::

    {"error": {"status": 422, "code": "validation_error", "message": "...", "field": "text"}}

``field`` names the offending body field as a path (``filters.color[0]``,
``queries[1].text``), query or path parameter (``format``, ``jobId``) or header, else null.

- 400 ``bad_request``: an empty body, malformed JSON, a body that is not UTF-8, or one nesting
  arrays and objects more than 128 levels deep (``_requests.MAX_BODY_DEPTH``); a body that is
  not what its ``Content-Encoding`` says (``field``: ``Content-Encoding``); more than one
  ``X-Service-Base-Id`` header.
- 401 ``unauthorized``: ``X-Api-Key`` missing, wrong (compared in constant time) or sent more
  than once (which one would count is anybody's guess, so none does).
- 404 ``not_found``: unknown job, log, resourceId or route.
- 405 ``method_not_allowed`` (with ``Allow``): a method of RFC 9110 (or PATCH) that the route
  does not serve. 501 ``not_implemented`` (with ``Allow`` when the path exists): any other
  method aiohttp's parser lets through (``PROPFIND``).
- 413 ``payload_too_large``: a body over 16,869,605 bytes (``_requests.MAX_BODY_BYTES``), the
  largest the spec's limits allow. The spec bounds text (255 characters) and image (600,000)
  but no array, so the computation assumes at most 16 ``queries`` elements and 100 values in
  each filter array, other strings (filter values, timestamps, sort values) of at most 64
  characters and numbers of at most 32; every bounded field at its limit, in compact JSON as
  ``json.dumps`` writes it (ASCII strings one byte per character, others 12, a surrogate
  pair escape). Seventeen 600,000-character images fit. A compressed body is capped once
  inflated too.
- 414 ``uri_too_long``: a request target over 8,190 bytes; 431 ``header_fields_too_large``:
  a header name or value over 8,190 bytes, or more than 128 headers (aiohttp's defaults).
- 415 ``unsupported_media_type`` (with ``Accept-Encoding: gzip, deflate``): a
  ``Content-Encoding`` other than gzip, deflate or identity (``br``, ``zstd``).
- 422 ``validation_error``, both modes: a body that is not an object, a wrong type, a value past
  a limit (text over 255 characters; image over 600000 characters, not a base64 data URL of an
  ``image/`` media type, or not valid base64; precision outside [0, 1]), a UUID not fully
  matching the spec's pattern (lower-case, version 1-8; a trailing newline too) in the body or
  path, an unknown ``format`` or ``type``, a ``url`` that is not a URI. (An empty
  ``X-Service-Base-Id`` is no 422: it names no base, as if it were not sent.) Strict only:
  an unknown field or query parameter, page below
  ``first_page``, pageSize outside 1-100, an unknown ``sort`` value, an empty ``queries``
  element, a filter date without a time, a ``url`` that is not an absolute http(s) URI as RFC
  3986 writes one, an image's base64 without its ``=`` padding.
- 500 ``internal_error``: a bug of the emulator (its traceback is logged on the
  ``asyncsearch.testing`` logger).
- Injected faults: 429 ``rate_limited``, 500 ``internal_error``, 503 ``service_unavailable``
  (other scripted statuses get ``"error"`` or their usual code).

- 408 ``request_timeout``: a body that has not all arrived ``idle_timeout`` seconds after its
  headers (the connection is closed after the answer).

What aiohttp answers itself, with a plain-text 400 and before the application (so with no JSON
body and no ``X-Request-Id``; aiohttp offers the application no public hook for these), is
every request its parser cannot read: a method its C parser (llhttp) does not know (``FOO``;
the pure-Python parser lets it through to the 501 above); a malformed request line (garbage,
TLS bytes sent to plain HTTP) or an HTTP/2 preface (``PRI * HTTP/2.0``); a NUL or other
character a header name or value may not hold; a body framing it refuses (``Content-Length``
with ``Transfer-Encoding: chunked``, an invalid ``Content-Length``, a bad chunk size that
arrives with the headers); a request line, header or header count past 8 times the limits
above (the emulator raises aiohttp's own limits that far so that it answers up to then). Each
is logged as one WARNING line on the ``asyncsearch.testing.server`` logger (``bad request
from 127.0.0.1: Invalid header value char (400 BadHttpMessage, ...)``), never a traceback. A
bad chunk that arrives after the headers is never reported to the application by aiohttp: the
body stops there, and the 408 above answers it.

Fault injection
===============

Per endpoint — "search", "extract", "link", "webhook_logs", "webhook_log" — or "*" for all;
an endpoint's settings override the "*" ones field by field::

    emu.faults.set("search", latency=0.05, rate_429=0.2, retry_after=1)
    emu.faults.set("*", rate_503=0.1)
    emu.faults.script("extract", [503, 503, 200])   # exactly these, in order
    emu.faults.clear("search")                      # or clear() for everything
    emu.faults.reseed(42)                           # replay the same random draws

Settings: ``latency`` (seconds before every answer), ``rate_429`` (with ``Retry-After:
<retry_after>``, default 1; None sends none; a string is sent as is), ``rate_500``,
``rate_503``, ``drop_connection`` (the connection is closed with no answer),
``truncate_body`` (Content-Length promises more than is sent, then the connection closes),
``slow_body`` (the body is written in ``slow_chunks`` pieces, default 10, ``slow_chunk_delay``
seconds apart, default 0.05). Rates are probabilities (summing to at most 1) drawn from one
seeded RNG, one draw per request. A script holds HTTP statuses (2xx answers normally) or
"ok", "drop", "truncate", "slow"; while an endpoint's script lasts no random draw is made; an
endpoint's own script goes before the "*" script. Faults apply before authentication, to
every service endpoint and never to the control API.

Gates hold "the other side is still running" for exactly as long as a test needs, with no bet
on latency::

    emu.faults.hold("extract")           # or "*"; after=N lets N more pass first
    task = asyncio.create_task(export_everything())
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(2, "extract")  # two requests are waiting at the gate
    ...                                  # act while they are held
    emu.faults.release("extract")        # or release() for every gate; they go on

A parked request is counted (``stats``, ``requests``) and in flight, its connection open and
nothing answered; once released it meets the other faults (latency, script, rates) and gets its
answer. ``held()`` lists the closed gates, ``parked(endpoint=None)`` counts the requests parked
now; ``clear()`` also opens the gates. Call them from the emulator's event loop (or over HTTP).

Counters: ``emu.requests`` (a list, oldest first, so ``emu.requests[:2]`` works, of
``RecordedRequest(method, path, endpoint, base_id, query, status)``, status None for a dropped
connection, base_id None without a base header or with an empty one; the latest 100,000 and
at most 16 MiB of them) and ``emu.stats``:
``counts`` (endpoint -> requests, faulted ones included), ``count(endpoint=None)``,
``in_flight``, ``max_in_flight``, ``max_in_flight_by_endpoint``, ``last_search_ms`` (time to
rank and serialise the last search) and ``reset()``.

HTTP control API (for a server in another process; needs ``X-Api-Key``)
=========================================================================

- ``GET /_emulator/faults`` -> ``{"settings": {...}, "scripts": {...}}``
- ``POST /_emulator/faults`` ``{"endpoint": "search", "latency": 0.05, "rate_429": 0.2}``
  (setting names as in Python; endpoint defaults to "*")
- ``POST /_emulator/faults/script`` ``{"endpoint": "extract", "sequence": [503, "drop", 200]}``
- ``DELETE /_emulator/faults[?endpoint=search]`` (also opens that endpoint's gate, or all)
- ``POST /_emulator/faults/gate`` ``{"endpoint": "extract", "after": 0}`` holds a gate
  (endpoint defaults to "*", after to 0); ``DELETE /_emulator/faults/gate[?endpoint=extract]``
  releases one, or all;
  ``GET /_emulator/faults/gate`` -> ``{"held": ["extract"], "parked": {"extract": 2}}``, and
  with ``?parked=2[&endpoint=extract][&timeout=10]`` it answers once at least that many
  requests are parked (504 when ``timeout`` seconds, default 10, pass first)
- ``GET /_emulator/stats`` -> ``{"counts", "total", "inFlight", "maxInFlight",
  "inFlightByEndpoint", "maxInFlightByEndpoint", "lastSearchMs"}``;
  ``POST /_emulator/stats/reset``
- ``GET /_emulator/jobs`` and ``GET /_emulator/resources`` -> ``{"items": [...]}``, a base's
  jobs or resources in insertion order (``jq -r '.items[].id'`` makes an ids file; ``asyncsearch
  serve --write-ids FILE`` writes the seeded job ids at start).
- ``POST /_emulator/resources`` ``{"resource": {...}, "text": "...", "chunks": [...],
  "ancestors": [...], "image": "data:...", "strict": true}``; ``POST /_emulator/jobs``
  ``{"job": {...}, "nextStates": [...]}``; ``POST /_emulator/jobs/{jobId}/webhook-logs``
  ``{"log": {...}}``; ``POST /_emulator/seed`` ``{"nResources": 200, "nJobs": 50,
  "seed": 0}`` (all honour ``X-Service-Base-Id``; 201 with the stored item);
  ``POST /_emulator/pages`` ``{"url": "...", "html": "..."}``.

pytest plugin
=============

Opt in with ``pytest_plugins = ["asyncsearch.testing.pytest_plugin"]`` in the root
conftest.py; fixtures ``asyncsearch_emulator`` (running, ``api_key="test-key"``, ``seed=7``)
and ``asyncsearch_client`` (an open ``AsyncSearchClient`` on it). Change the options with
``@pytest.mark.asyncsearch_emulator(seed=3, n_resources=50)`` or by overriding the
``asyncsearch_emulator_options`` fixture.

numpy
=====

Optional. When importable it ranks vectors for all resources at once (10,000 resources answer
in milliseconds); without it a pure-Python loop gives bit-identical scores and rankings
(vectors are integer counts, and both paths do the same floating-point operations in the same
order), only slower.
"""

from __future__ import annotations

from ._embed import fake_image_data_url
from ._emulator import (
    EmulatorStats,
    RecordedRequest,
    SearchRecord,
    ServiceEmulator,
    serve_forever,
)
from ._faults import ENDPOINTS, FaultConfig, FaultDecision, Faults

__all__ = [
    "ENDPOINTS",
    "EmulatorStats",
    "FaultConfig",
    "FaultDecision",
    "Faults",
    "RecordedRequest",
    "SearchRecord",
    "ServiceEmulator",
    "fake_image_data_url",
    "serve_forever",
]
