"""Fault injection and request counters of the emulator, seen from a plain HTTP client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import FaultConfig, Faults, ServiceEmulator

from .conftest import EMULATOR_KEY as KEY


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=40, n_jobs=5) as emulator:
        yield emulator


async def status_of(http: aiohttp.ClientSession, body: dict[str, Any] | None = None) -> int:
    async with http.post("/v2/search", json=body or {}) as response:
        await response.read()
        return response.status


# ------------------------------------------------------------------------ fault kinds


async def test_a_429_carries_retry_after_and_the_error_body(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", rate_429=1.0, retry_after=3)
    async with http.post("/v2/search", json={}) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "3"
        body = await response.json()
    assert body["error"]["code"] == "rate_limited"
    emu.faults.set("search", retry_after=0.5)
    async with http.post("/v2/search", json={}) as response:
        assert response.headers["Retry-After"] == "0.5"
    emu.faults.set("search", retry_after=None)
    async with http.post("/v2/search", json={}) as response:
        assert response.status == 429
        assert "Retry-After" not in response.headers


@pytest.mark.parametrize(("setting", "status"), [("rate_500", 500), ("rate_503", 503)])
async def test_server_errors_are_injected(
    http: aiohttp.ClientSession, emu: ServiceEmulator, setting: str, status: int
) -> None:
    emu.faults.set("search", **{setting: 1.0})
    async with http.post("/v2/search", json={}) as response:
        assert response.status == status
        assert (await response.json())["error"]["status"] == status


async def test_a_dropped_connection_raises_a_client_connection_error(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", drop_connection=1.0)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.post("/v2/search", json={}) as response:
            await response.read()
    emu.faults.clear()
    assert await status_of(http) == 200, "the session recovers on a new connection"
    assert [r.status for r in emu.requests] == [None, 200]


async def test_a_truncated_body_raises_a_payload_error(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", truncate_body=1.0)
    async with http.post("/v2/search", json={}) as response:
        assert response.status == 200
        assert response.content_length is not None
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_a_slow_body_arrives_whole_but_late(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    async with http.post("/v2/search", json={}) as response:
        expected = await response.read()
    emu.faults.set("search", slow_body=1.0, slow_chunks=5, slow_chunk_delay=0.05)
    started = time.perf_counter()
    async with http.post("/v2/search", json={}) as response:
        assert response.status == 200
        body = await response.read()
    assert time.perf_counter() - started >= 4 * 0.05 * 0.9
    assert body == expected


async def test_a_slow_body_can_trip_a_client_read_timeout(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", slow_body=1.0, slow_chunks=3, slow_chunk_delay=1.0)
    timeout = aiohttp.ClientTimeout(sock_read=0.2)
    with pytest.raises(asyncio.TimeoutError):
        async with http.post("/v2/search", json={}, timeout=timeout) as response:
            await response.read()


async def test_latency_delays_the_answer(http: aiohttp.ClientSession, emu: ServiceEmulator) -> None:
    emu.faults.set("link", latency=0.2)
    started = time.perf_counter()
    async with http.get("/v2/link", params={"url": emu.page_urls[0]}) as response:
        assert response.status == 200
    assert time.perf_counter() - started >= 0.19
    # Only the link endpoint is delayed: a search is answered while a link request waits out
    # an hour of latency (no race between two short delays).
    emu.faults.set("link", latency=3600)

    async def slow_link() -> None:
        async with http.get("/v2/link", params={"url": emu.page_urls[0]}) as response:
            await response.read()

    link = asyncio.create_task(slow_link())
    async with asyncio.timeout(10):
        while emu.stats.count("link") < 2:  # noqa: ASYNC110 - the emulator has no event for it
            await asyncio.sleep(0.01)
        assert await status_of(http) == 200
    assert not link.done()
    link.cancel()
    with pytest.raises(asyncio.CancelledError):
        await link


# --------------------------------------------------------------------------- scripts


async def test_a_script_answers_exactly_in_order_then_falls_back(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.jobs()[0]["id"]
    emu.faults.script("extract", [503, 503, 200, 429, "ok"])
    statuses = []
    for _ in range(7):
        async with http.get(f"/v2/extract/{job}") as response:
            statuses.append(response.status)
    assert statuses == [503, 503, 200, 429, 200, 200, 200]
    assert emu.stats.count("extract") == 7
    assert emu.stats.count("search") == 0
    assert emu.faults.remaining_script("extract") == []


async def test_scripted_actions_cover_every_fault_kind(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", slow_chunk_delay=0.01)
    emu.faults.script("search", ["drop", "truncate", "slow", 500])
    with pytest.raises(aiohttp.ClientConnectionError):
        await status_of(http)
    with pytest.raises(aiohttp.ClientPayloadError):
        await status_of(http)
    assert await status_of(http) == 200
    assert await status_of(http) == 500
    assert await status_of(http) == 200


async def test_an_endpoint_script_goes_before_the_star_script(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.script("*", [502, 504])
    emu.faults.script("search", [418])
    assert await status_of(http) == 418
    assert await status_of(http) == 502
    async with http.get("/v2/link", params={"url": emu.page_urls[0]}) as response:
        assert response.status == 504
    assert await status_of(http) == 200


async def test_scripts_make_no_random_draws(emu: ServiceEmulator) -> None:
    faults = Faults(seed=1)
    faults.set("search", rate_500=0.5)
    faults.script("search", [200, 200])
    faults.decide("search")
    faults.decide("search")
    after_script = [faults.decide("search").action for _ in range(20)]
    fresh = Faults(seed=1)
    fresh.set("search", rate_500=0.5)
    assert after_script == [fresh.decide("search").action for _ in range(20)]


# ----------------------------------------------------------------------- rates & config


async def test_rates_are_reproducible_from_the_seed(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.set("search", rate_500=0.3, rate_503=0.3)
    runs = []
    for _ in range(2):
        emu.faults.reseed(42)
        runs.append([await status_of(http) for _ in range(30)])
    assert runs[0] == runs[1]
    assert {200, 500, 503} == set(runs[0])


def test_endpoint_settings_override_star_settings_field_by_field() -> None:
    faults = Faults()
    faults.set("*", latency=0.1, rate_500=0.2)
    faults.set("search", rate_500=0.0, rate_429=0.5)
    assert faults.config("search") == FaultConfig(latency=0.1, rate_500=0.0, rate_429=0.5)
    assert faults.config("extract") == FaultConfig(latency=0.1, rate_500=0.2)
    faults.clear("search")
    assert faults.config("search") == FaultConfig(latency=0.1, rate_500=0.2)
    faults.clear()
    assert faults.config("search") == FaultConfig()


@pytest.mark.parametrize(
    ("endpoint", "settings", "match"),
    [
        ("searches", {"latency": 1.0}, "unknown endpoint"),
        ("search", {"rate_404": 0.5}, "unknown fault setting"),
        ("search", {"rate_500": 1.5}, "probability"),
        ("search", {"latency": -1}, "negative"),
        ("search", {"latency": "slow"}, "number"),
        ("search", {"rate_500": 0.6, "rate_503": 0.6}, "more than 1"),
        ("search", {"slow_chunks": 0}, "positive"),
    ],
)
def test_bad_settings_are_refused(endpoint: str, settings: dict[str, Any], match: str) -> None:
    faults = Faults()
    with pytest.raises(ValueError, match=match):
        faults.set(endpoint, **settings)
    assert faults.snapshot() == {"settings": {}, "scripts": {}}


def test_rates_from_star_and_endpoint_must_not_add_up_past_one() -> None:
    faults = Faults()
    faults.set("search", rate_500=0.7)
    with pytest.raises(ValueError, match="'search'"):
        faults.set("*", rate_503=0.5)


@pytest.mark.parametrize("action", [99, 600, "explode", True])
def test_bad_script_actions_are_refused(action: Any) -> None:
    with pytest.raises(ValueError, match=r"script action|between 100 and 599"):
        Faults().script("search", [action])


# --------------------------------------------------------------------- HTTP control API


async def test_faults_can_be_steered_over_http(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    async with http.post(
        "/_emulator/faults", json={"endpoint": "search", "rate_503": 1.0}
    ) as response:
        assert response.status == 200
        assert (await response.json())["settings"] == {"search": {"rate_503": 1.0}}
    assert await status_of(http) == 503
    async with http.delete("/_emulator/faults", params={"endpoint": "search"}) as response:
        assert response.status == 200
    assert await status_of(http) == 200
    async with http.post(
        "/_emulator/faults/script", json={"endpoint": "search", "sequence": [500, "ok"]}
    ) as response:
        assert response.status == 200
    async with http.get("/_emulator/faults") as response:
        assert (await response.json())["scripts"] == {"search": [500, "ok"]}
    assert [await status_of(http) for _ in range(3)] == [500, 200, 200]
    async with http.post("/_emulator/faults", json={"endpoint": "search", "rate_500": 7}) as r:
        assert r.status == 422
    async with http.get("/_emulator/stats") as response:
        stats = await response.json()
    assert stats["counts"] == {"search": 5}
    assert stats["total"] == 5
    assert stats["inFlight"] == 0
    async with http.post("/_emulator/stats/reset") as response:
        assert (await response.json())["total"] == 0
    assert emu.stats.count() == 0


async def test_the_control_api_needs_the_key(emu: ServiceEmulator) -> None:
    async with (
        aiohttp.ClientSession(emu.base_url) as session,
        session.post("/_emulator/faults", json={"rate_500": 1.0}) as response,
    ):
        assert response.status == 401
    assert emu.faults.config("search") == FaultConfig()


async def test_faults_apply_before_authentication(emu: ServiceEmulator) -> None:
    emu.faults.script("search", [503])
    async with (
        aiohttp.ClientSession(emu.base_url) as session,
        session.post("/v2/search", json={}) as response,
    ):
        assert response.status == 503


# ---------------------------------------------------------------------------- counters


async def test_requests_are_recorded_with_endpoint_base_and_status(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.jobs()[0]["id"]
    await status_of(http)
    async with http.get(f"/v2/extract/{job}", headers={"X-Service-Base-Id": "b1"}) as response:
        assert response.status == 404
    async with http.get(f"/v2/extract/{job}/webhook-logs") as response:
        assert response.status == 200
    async with http.get("/_emulator/stats"):
        pass
    assert [(r.method, r.path, r.endpoint, r.base_id, r.status) for r in emu.requests] == [
        ("POST", "/v2/search", "search", None, 200),
        ("GET", f"/v2/extract/{job}", "extract", "b1", 404),
        ("GET", f"/v2/extract/{job}/webhook-logs", "webhook_logs", None, 200),
    ]
    assert emu.stats.counts == {"search": 1, "extract": 1, "webhook_logs": 1}
    assert emu.stats.count() == 3
    # A list: sliced and indexed like one.
    assert [r.endpoint for r in emu.requests[:2]] == ["search", "extract"]
    assert emu.requests[-1].endpoint == "webhook_logs"


async def test_in_flight_counters_see_the_real_concurrency(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    # All five are held at the gate together: no bet that they overlap within some latency.
    emu.faults.hold("search")
    calls = [asyncio.create_task(status_of(http)) for _ in range(5)]
    async with asyncio.timeout(10):
        assert await emu.faults.wait_parked(5, "search") == 5
        assert emu.stats.in_flight == 5
        emu.faults.release("search")
        statuses = await asyncio.gather(*calls)
    assert statuses == [200] * 5
    assert emu.stats.max_in_flight == 5
    assert emu.stats.max_in_flight_by_endpoint == {"search": 5}
    assert emu.stats.in_flight == 0
    emu.stats.reset()
    for _ in range(3):
        await status_of(http)
    assert emu.stats.max_in_flight == 1
    assert emu.stats.count("search") == 3


async def test_a_client_giving_up_leaves_no_request_in_flight(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    # The request is parked until the client has given up: the gate never opens, so only the
    # client's going away can end it (no bet on a latency being longer than a timeout).
    emu.faults.hold("search")
    call = asyncio.create_task(status_of(http))
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(1, "search")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(1000):  # the server notices the closed connection a moment later
        if not emu.stats.in_flight:
            break
        await asyncio.sleep(0.01)
    assert emu.stats.in_flight == 0
    assert emu.faults.parked() == 0
    assert emu.stats.max_in_flight == 1


# ------------------------------------------------------------------------------ gates


async def test_a_gate_parks_requests_until_released(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.hold("search")
    assert emu.faults.held() == ["search"]
    calls = [asyncio.create_task(status_of(http)) for _ in range(3)]
    async with asyncio.timeout(10):
        assert await emu.faults.wait_parked(3, "search") == 3
    # Parked: counted, in flight, and nothing answered.
    assert emu.faults.parked("search") == emu.faults.parked() == 3
    assert emu.stats.count("search") == 3
    assert emu.stats.in_flight == 3
    assert not any(call.done() for call in calls)
    # Other endpoints are not held.
    async with http.get("/v2/link", params={"url": emu.page_urls[0]}) as response:
        assert response.status == 200
    emu.faults.release("search")
    async with asyncio.timeout(10):
        assert await asyncio.gather(*calls) == [200, 200, 200]
    assert emu.faults.held() == []
    assert emu.faults.parked() == 0
    assert await status_of(http) == 200  # an open gate parks nothing


async def test_a_hold_right_after_release_parks_only_the_new_requests(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.jobs()[0]["id"]

    async def extract() -> int:
        async with http.get(f"/v2/extract/{job}") as response:
            await response.read()
            return response.status

    emu.faults.hold("extract")
    first = [asyncio.create_task(extract()) for _ in range(2)]
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(2, "extract")
    # Same turn: the woken requests have not run yet when the new gate closes.
    emu.faults.release("extract")
    emu.faults.hold("extract")
    async with asyncio.timeout(10):
        assert await asyncio.gather(*first) == [200, 200]
        third = asyncio.create_task(extract())
        assert await emu.faults.wait_parked(1, "extract") == 1
    assert not third.done()
    assert emu.faults.held() == ["extract"]
    emu.faults.release("extract")
    async with asyncio.timeout(10):
        assert await third == 200


async def test_a_request_parked_at_two_gates_waits_for_both(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.hold("search")
    emu.faults.hold("*")
    call = asyncio.create_task(status_of(http))
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(1, "search")
        emu.faults.release("search")
        emu.faults.hold("search")  # a new gate: not one this request parked at
        # Still parked, at the "*" gate closed when it parked.
        assert await emu.faults.wait_parked(1, "search") == 1
        assert not call.done()
        assert emu.faults.parked("search") == 1
        emu.faults.release("*")
        assert await call == 200


async def test_a_released_request_still_meets_the_other_faults(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.hold("*")
    emu.faults.script("search", [503])
    call = asyncio.create_task(status_of(http))
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(1)
        assert emu.faults.remaining_script("search") == [503]  # not drawn while parked
        emu.faults.release()
        assert await call == 503


async def test_after_lets_that_many_requests_pass_before_parking(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    emu.faults.hold("search", after=2)
    assert await status_of(http) == 200
    assert await status_of(http) == 200
    third = asyncio.create_task(status_of(http))
    async with asyncio.timeout(10):
        await emu.faults.wait_parked(1, "search")
        assert not third.done()
        emu.faults.clear()  # clearing every fault opens the gates too
        assert await third == 200
    assert emu.faults.held() == []


def test_gate_arguments_are_checked() -> None:
    faults = Faults()
    with pytest.raises(ValueError, match="unknown endpoint"):
        faults.hold("nope")
    with pytest.raises(ValueError, match="after"):
        faults.hold("search", after=-1)
    with pytest.raises(ValueError, match="unknown endpoint"):
        faults.release("nope")
    with pytest.raises(ValueError, match="unknown endpoint"):
        faults.parked("nope")
    faults.release()  # nothing held: nothing to do
    assert faults.held() == []


async def test_wait_parked_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="count"):
        await Faults().wait_parked(0)


async def test_gates_over_http_for_a_server_in_another_process(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    async with http.post("/_emulator/faults/gate", json={"endpoint": "extract", "after": 1}) as r:
        assert r.status == 200
        assert await r.json() == {"held": ["extract"], "parked": {}}
    job = emu.jobs()[0]["id"]

    async def extract() -> int:
        async with http.get(f"/v2/extract/{job}") as response:
            await response.read()
            return response.status

    assert await extract() == 200  # the one `after` lets through
    calls = [asyncio.create_task(extract()) for _ in range(2)]
    async with http.get(
        "/_emulator/faults/gate", params={"parked": "2", "endpoint": "extract", "timeout": "10"}
    ) as r:
        assert r.status == 200
        assert await r.json() == {"held": ["extract"], "parked": {"extract": 2}}
    assert not any(call.done() for call in calls)
    async with http.get("/_emulator/faults/gate", params={"parked": "3", "timeout": "0.05"}) as r:
        assert r.status == 504
    async with http.delete("/_emulator/faults/gate", params={"endpoint": "extract"}) as r:
        assert r.status == 200
        assert (await r.json())["held"] == []
    async with asyncio.timeout(10):
        assert await asyncio.gather(*calls) == [200, 200]
    async with http.get("/_emulator/faults/gate") as r:
        assert await r.json() == {"held": [], "parked": {}}


@pytest.mark.parametrize(
    ("method", "query", "body"),
    [
        ("POST", {}, {"endpoint": "nope"}),
        ("POST", {}, {"endpoint": "search", "after": -1}),
        ("POST", {}, {"endpoint": "search", "latency": 1}),
        ("DELETE", {"endpoint": "nope"}, None),
        ("GET", {"parked": "x"}, None),
        ("GET", {"parked": "1", "endpoint": "nope"}, None),
        ("GET", {"parked": "1", "timeout": "0"}, None),
    ],
)
async def test_bad_gate_control_requests_are_refused(
    http: aiohttp.ClientSession,
    emu: ServiceEmulator,
    method: str,
    query: dict[str, str],
    body: dict[str, Any] | None,
) -> None:
    async with http.request(method, "/_emulator/faults/gate", params=query, json=body) as r:
        assert r.status == 422
    assert emu.faults.held() == []
