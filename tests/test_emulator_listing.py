"""The control routes that list a running emulator's data: GET /_emulator/jobs and /resources."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator

from .conftest import EMULATOR_KEY as KEY


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=3, n_resources=12, n_jobs=6) as emulator:
        yield emulator


async def test_jobs_and_resources_are_listed_in_insertion_order(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    added = emu.add_job(name="Added last")
    async with http.get("/_emulator/jobs") as response:
        assert response.status == 200
        jobs = (await response.json())["items"]
    assert jobs == emu.jobs()
    assert len(jobs) == 7
    assert jobs[-1]["id"] == added["id"]
    async with http.get("/_emulator/resources") as response:
        assert response.status == 200
        resources = (await response.json())["items"]
    assert [r["id"] for r in resources] == [r["id"] for r in emu.resources()]
    assert len(resources) == 12


async def test_listing_honours_the_base_header_and_the_key(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    in_base = emu.add_job(base_id="base-x")
    async with http.get("/_emulator/jobs", headers={"X-Service-Base-Id": "base-x"}) as response:
        assert [j["id"] for j in (await response.json())["items"]] == [in_base["id"]]
    async with http.get(
        "/_emulator/resources", headers={"X-Service-Base-Id": "empty-base"}
    ) as response:
        assert (await response.json()) == {"items": []}
    async with aiohttp.ClientSession(emu.base_url) as anonymous:
        for path in ("/_emulator/jobs", "/_emulator/resources"):
            async with anonymous.get(path) as response:
                assert response.status == 401


async def test_posting_a_job_still_works_next_to_the_listing(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    async with http.post("/_emulator/jobs", json={"job": {"name": "Posted"}}) as response:
        assert response.status == 201
        posted = await response.json()
    async with http.get("/_emulator/jobs") as response:
        assert (await response.json())["items"][-1]["id"] == posted["id"]
