"""The opt-in pytest plugin: its emulator and client fixtures, options and marker."""

from __future__ import annotations

import importlib
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator

pytest_plugins = ["pytester", "asyncsearch.testing.pytest_plugin"]


def _client_available() -> bool:
    try:
        return hasattr(importlib.import_module("asyncsearch"), "AsyncSearchClient")
    except Exception:  # the SDK is being written alongside; a broken import must not hide this
        return False


async def test_the_emulator_fixture_is_running_and_seeded(
    asyncsearch_emulator: ServiceEmulator,
) -> None:
    emu = asyncsearch_emulator
    assert emu.api_key == "test-key"
    assert len(emu.resources()) == 200
    assert len(emu.jobs()) == 50
    async with (
        aiohttp.ClientSession(emu.base_url, headers={"X-Api-Key": emu.api_key}) as session,
        session.post("/v2/search", json={}) as response,
    ):
        assert (await response.json())["total"] == 200


@pytest.mark.parametrize(
    "asyncsearch_emulator_options", [{"seed": None, "api_key": "other-key", "first_page": 0}]
)
async def test_overriding_the_options_fixture_configures_the_emulator(
    asyncsearch_emulator: ServiceEmulator,
) -> None:
    assert asyncsearch_emulator.api_key == "other-key"
    assert asyncsearch_emulator.first_page == 0
    assert asyncsearch_emulator.resources() == []


def test_the_marker_passes_options_to_the_emulator(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        """
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        asyncio_default_test_loop_scope = function
        addopts = --strict-markers -p no:cacheprovider
        filterwarnings = error
        """
    )
    pytester.makeconftest('pytest_plugins = ["asyncsearch.testing.pytest_plugin"]')
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.asyncsearch_emulator(seed=3, n_resources=12, n_jobs=2, api_key="m")
        async def test_marked(asyncsearch_emulator):
            assert asyncsearch_emulator.api_key == "m"
            assert len(asyncsearch_emulator.resources()) == 12
            assert len(asyncsearch_emulator.jobs()) == 2

        async def test_default(asyncsearch_emulator):
            assert len(asyncsearch_emulator.resources()) == 200
        """
    )
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=2)


@pytest.mark.skipif(not _client_available(), reason="asyncsearch.AsyncSearchClient is missing")
async def test_the_client_fixture_talks_to_the_emulator(
    asyncsearch_client: Any, asyncsearch_emulator: ServiceEmulator
) -> None:
    job = asyncsearch_emulator.jobs()[0]
    page = await asyncsearch_client.search("invoice")
    extraction = await asyncsearch_client.get_extraction(job["id"])
    assert page.total > 0
    assert str(extraction.id) == job["id"]
    assert asyncsearch_emulator.stats.counts == {"search": 1, "extract": 1}
