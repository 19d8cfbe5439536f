"""The emulator's two modes: lenient where the spec is silent (default), strict on request.

Also the spec's own limits that hold in both modes: the UUID pattern matched in full, and the
body cap computed from the spec's per-field limits.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator
from asyncsearch.testing._errors import EmulatorHTTPError
from asyncsearch.testing._requests import (
    MAX_BODY_BYTES,
    MAX_BODY_QUERIES,
    MAX_FILTER_VALUES,
    MAX_IMAGE_LENGTH,
    MAX_TEXT_LENGTH,
    parse_search,
)

from .conftest import EMULATOR_KEY as KEY

ANY_UUID = "0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10"
TIMEOUT = aiohttp.ClientTimeout(total=30)

# Every search body the emulator refused before it had modes, with the field its 422 named.
# None of them breaks a rule the spec states.
SILENT_SEARCH_SHAPES: list[tuple[dict[str, Any], str]] = [
    ({"text": "invoice", "bogus": 1}, "bogus"),
    ({"page": 1}, "page"),
    ({"filters": {"kinds": ["document"], "bogus": []}}, "filters.bogus"),
    ({"pagination": {"page": 0}}, "pagination.page"),
    ({"pagination": {"page": -3}}, "pagination.page"),
    ({"pagination": {"page": 1.0}}, "pagination.page"),
    ({"filters": {"color": [2.0]}}, "filters.color[0]"),
    ({"pagination": {"pageSize": 0}}, "pagination.pageSize"),
    ({"pagination": {"pageSize": 101}}, "pagination.pageSize"),
    ({"pagination": {"page_size": 10}}, "pagination.page_size"),
    ({"sort": {"field": "popularity"}}, "sort.field"),
    ({"sort": {"order": "up"}}, "sort.order"),
    ({"sort": {"field": "name", "direction": "asc"}}, "sort.direction"),
    ({"queries": [{"text": "invoice", "incognito": True}]}, "queries[0].incognito"),
    # Accepted before, refused by the strict mode now: an empty query object and a date
    # without a time where the spec says timestamp.
    ({"queries": [{}]}, "queries[0]"),
    ({"filters": {"createdAfter": "2024-01-01"}}, "filters.createdAfter"),
]

# The same for GET endpoints: (path template, query parameters, field).
SILENT_GET_SHAPES: list[tuple[str, dict[str, str], str]] = [
    ("/v2/extract/{job}", {"fmt": "json"}, "fmt"),
    ("/v2/extract/{job}/webhook-logs", {"page": "2"}, "page"),
    ("/v2/extract/{job}/webhook-logs/{log}", {"expand": "1"}, "expand"),
    ("/v2/link", {"url": "https://www.example.org/", "kind": "link"}, "kind"),
    ("/v2/link", {"url": "ftp://files.example.org/report.pdf"}, "url"),
]


@pytest.fixture(params=[False, True], ids=["lenient", "strict"])
async def emu(request: pytest.FixtureRequest) -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(
        api_key=KEY, seed=7, n_resources=60, n_jobs=2, strict=request.param
    ) as emulator:
        yield emulator


async def post(http: aiohttp.ClientSession, body: Any, status: int = 200) -> Any:
    # A file object: aiohttp warns about large bytes bodies (and warnings are errors here).
    data = io.BytesIO(json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    async with http.post("/v2/search", data=data, headers=headers) as response:
        assert response.status == status, await response.text()
        return await response.json()


@pytest.mark.parametrize(("body", "field"), SILENT_SEARCH_SHAPES)
async def test_search_shapes_the_spec_leaves_open_pass_by_default_and_fail_when_strict(
    emu: ServiceEmulator, http: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    if emu.strict:
        error = (await post(http, body, 422))["error"]
        assert (error["code"], error["field"]) == ("validation_error", field)
        assert error["message"]
    else:
        data = await post(http, body)
        assert set(data) == {"total", "hasMore", "hits"}


@pytest.mark.parametrize(("path", "params", "field"), SILENT_GET_SHAPES)
async def test_get_shapes_the_spec_leaves_open_pass_by_default_and_fail_when_strict(
    emu: ServiceEmulator,
    http: aiohttp.ClientSession,
    path: str,
    params: dict[str, str],
    field: str,
) -> None:
    job = emu.jobs()[0]["id"]
    log = emu.add_webhook_log(job)["id"]
    async with http.get(path.format(job=job, log=log), params=params) as response:
        body = await response.json()
        if emu.strict:
            assert response.status == 422
            assert (body["error"]["code"], body["error"]["field"]) == ("validation_error", field)
        else:
            assert response.status == 200, body


# ------------------------------------------------------- what the lenient mode does instead


def lenient(body: dict[str, Any]) -> Any:
    return parse_search(body, strict=False)


def test_unknown_fields_are_ignored() -> None:
    assert lenient({"text": "a", "bogus": 1, "filters": {"kinds": ["x"], "more": 2}}) == lenient(
        {"text": "a", "filters": {"kinds": ["x"]}}
    )


def test_out_of_range_paging_is_clamped() -> None:
    assert lenient({"pagination": {"page": 0}}).page_index == 0
    assert lenient({"pagination": {"page": -5}}).page_index == 0
    assert lenient({"pagination": {"pageSize": 0}}).page_size == 1
    assert lenient({"pagination": {"pageSize": 10_000}}).page_size == 100
    assert lenient({"pagination": {"page": 3.0, "pageSize": 7.0}}).page_index == 2
    zero_based = parse_search({"pagination": {"page": -1}}, first_page=0, strict=False)
    assert zero_based.page_index == 0


def test_integral_floats_count_as_integers_in_filters_too() -> None:
    # The lenient mode reads 2.0 as 2 wherever an integer goes, paging or filters.color.
    assert lenient({"filters": {"color": [2.0, 3]}}).filters.color == frozenset({2, 3})
    assert lenient({"filters": {"color": [2.0]}}) == lenient({"filters": {"color": [2]}})
    with pytest.raises(EmulatorHTTPError) as refused:
        lenient({"filters": {"color": [2.5]}})
    assert refused.value.field == "filters.color[0]"
    with pytest.raises(EmulatorHTTPError) as strict:
        parse_search({"filters": {"color": [2.0]}}, strict=True)
    assert (strict.value.status, strict.value.field) == (422, "filters.color[0]")
    assert str(strict.value) == "filters.color[0] must be an integer, not number"  # as before


def test_unknown_sort_values_fall_back_to_the_default_order() -> None:
    unknown_field = lenient({"text": "a", "sort": {"field": "popularity"}})
    assert (unknown_field.sort_field, unknown_field.sort_order) == ("", "")
    unknown_order = lenient({"sort": {"field": "name", "order": "up"}})
    assert (unknown_order.sort_field, unknown_order.sort_order) == ("name", "")


def test_a_date_alone_is_midnight_utc_by_default() -> None:
    assert (
        lenient({"filters": {"createdAfter": "2024-03-01"}}).filters
        == lenient({"filters": {"createdAfter": "2024-03-01T00:00:00Z"}}).filters
    )


@pytest.mark.parametrize(
    "stamp", ["2024-03-01T10:00:00Z", "2024-03-01T10:00", "2024-03-01 10:00:00.5+02:00"]
)
def test_the_strict_mode_takes_timestamps_with_a_time(stamp: str) -> None:
    request = parse_search({"filters": {"createdBefore": stamp}}, strict=True)
    assert request.filters.created_before is not None


async def test_lenient_answers_match_the_shapes_they_fall_back_to() -> None:
    async with (
        ServiceEmulator(api_key=KEY, seed=7, n_resources=150, n_jobs=0) as emulator,
        aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as http,
    ):
        relevance = await post(http, {"text": "invoice report", "precision": 0.0})
        assert relevance["total"] > 20
        assert relevance == await post(
            http, {"text": "invoice report", "precision": 0.0, "sort": {"field": "popularity"}}
        )
        by_name = await post(http, {"sort": {"field": "name"}})
        assert by_name == await post(http, {"sort": {"field": "name", "order": "sideways"}})
        biggest = await post(http, {"pagination": {"pageSize": 500}})
        assert len(biggest["hits"]) == 100
        assert biggest["hasMore"] is True
        first = await post(http, {"pagination": {"page": 1, "pageSize": 5}})
        assert first == await post(http, {"pagination": {"page": 0, "pageSize": 5}, "x": [1]})
        one = await post(http, {"pagination": {"pageSize": 0}})
        assert len(one["hits"]) == 1
        browse = await post(http, {})
        assert browse == await post(http, {"queries": [{}]})


# ------------------------------------------------------------ limits both modes enforce


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "x" * (MAX_TEXT_LENGTH + 1)}, "text"),
        ({"precision": 1.01}, "precision"),
        ({"resourceId": ANY_UUID + "\n"}, "resourceId"),
        ({"resourceId": ANY_UUID.upper()}, "resourceId"),
        ({"sort": {"field": 1}}, "sort.field"),
        ({"pagination": {"page": 1.5}}, "pagination.page"),
        ({"filters": {"createdAfter": "yesterday"}}, "filters.createdAfter"),
        ({"queries": [{"text": None}]}, "queries[0].text"),
    ],
)
async def test_what_the_spec_fixes_is_refused_in_both_modes(
    emu: ServiceEmulator, http: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    assert (await post(http, body, 422))["error"]["field"] == field


@pytest.mark.parametrize(
    "path",
    [
        "/v2/extract/{uuid}%0A",
        "/v2/extract/{uuid}%0A/webhook-logs",
        "/v2/extract/{job}/webhook-logs/{uuid}%0A",
    ],
)
async def test_a_uuid_with_a_trailing_newline_is_a_422_not_a_404(
    emu: ServiceEmulator, http: aiohttp.ClientSession, path: str
) -> None:
    url = path.format(uuid=ANY_UUID, job=emu.jobs()[0]["id"])
    async with http.get(url) as response:
        assert response.status == 422
        assert (await response.json())["error"]["field"] in ("jobId", "logId")


# ------------------------------------------------------------------------- the body cap

WIDE = "\\ud83d\\ude00"  # one character outside the BMP as json.dumps escapes it


def largest_body() -> bytes:
    """Write out the largest body the documented bounds allow, field by field, by hand."""

    def text(chars: int) -> str:
        return '"' + WIDE * chars + '"'

    prefix = "data:image/x-png;base64,"
    image = '"' + prefix + "A" * (MAX_IMAGE_LENGTH - len(prefix)) + '"'
    number = "0." + "0" * 29 + "1"  # 32 characters
    stamp = '"2024-01-01T00:00:00.' + "0" * 43 + 'Z"'  # 64 characters, a valid timestamp
    values = ",".join([text(64)] * MAX_FILTER_VALUES)
    colors = ",".join(["1" + "0" * 30 + "1"] * MAX_FILTER_VALUES)
    strings = ",".join(
        f'"{name}":[{values}]'
        for name in ("kinds", "parentIds", "ancestorIds", "tagIds", "userIds")
    )
    filters = f'{{{strings},"color":[{colors}],"createdAfter":{stamp},"createdBefore":{stamp}}}'
    query = (
        f'"text":{text(MAX_TEXT_LENGTH)},"image":{image},"resourceId":"{ANY_UUID}",'
        f'"precision":{number},"filters":{filters}'
    )
    queries = ",".join(["{" + query + "}"] * MAX_BODY_QUERIES)
    body = (
        f'{{{query},"queries":[{queries}],"incognito":false,'
        f'"pagination":{{"page":{"1" * 32},"pageSize":{"1" * 32}}},'
        f'"sort":{{"field":{text(64)},"order":{text(64)}}}}}'
    )
    return body.encode()


async def test_the_largest_spec_valid_body_is_accepted_and_one_byte_more_is_a_413() -> None:
    body = largest_body()
    assert len(body) == MAX_BODY_BYTES
    decoded = json.loads(body)  # it is JSON, and its fields are at the spec's limits
    assert len(decoded["text"]) == MAX_TEXT_LENGTH
    assert len(decoded["queries"][3]["image"]) == MAX_IMAGE_LENGTH
    async with (
        ServiceEmulator(api_key=KEY) as emulator,
        aiohttp.ClientSession(
            emulator.base_url,
            headers={"X-Api-Key": KEY, "Content-Type": "application/json"},
            timeout=TIMEOUT,
        ) as http,
    ):
        emulator.add_resource(id=ANY_UUID, name="target")
        async with http.post("/v2/search", data=io.BytesIO(body)) as response:
            assert response.status == 200, (await response.text())[:500]
            assert (await response.json())["total"] == 0
        async with http.post("/v2/search", data=io.BytesIO(body + b" ")) as response:
            assert response.status == 413
            assert (await response.json())["error"]["code"] == "payload_too_large"


async def test_seven_queries_images_at_the_limit_are_accepted(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    prefix = "data:image/x-png;base64,"
    image = prefix + "A" * (MAX_IMAGE_LENGTH - len(prefix))
    body = {"queries": [{"image": image}] * 7, "text": "invoice"}
    assert len(json.dumps(body)) > 4 * 1024 * 1024  # refused before the cap was computed
    await post(http, body)
