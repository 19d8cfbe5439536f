"""POST /v2/search on the emulator: ranking, filters, precision, sort, paging, validation."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator, _search, fake_image_data_url
from asyncsearch.testing._embed import tokenize
from asyncsearch.testing._requests import parse_search

from .conftest import EMULATOR_KEY as KEY

ANY_UUID = "0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10"
needs_numpy = pytest.mark.skipif(not _search.HAVE_NUMPY, reason="numpy is not installed")


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=200, n_jobs=0) as emulator:
        yield emulator


async def search(http: aiohttp.ClientSession, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    async with http.post("/v2/search", json=body, **kw) as response:
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await response.json()
        return data


async def all_hits(http: aiohttp.ClientSession, body: dict[str, Any]) -> list[dict[str, Any]]:
    hits: list[dict[str, Any]] = []
    page = 1
    while True:
        data = await search(http, {**body, "pagination": {"page": page, "pageSize": 100}})
        hits.extend(data["hits"])
        if not data["hasMore"]:
            assert len(hits) == data["total"]
            return hits
        page += 1


def ids(hits: list[dict[str, Any]]) -> list[str]:
    return [h["id"] for h in hits]


# ------------------------------------------------------------------------------ ranking


async def test_a_resource_named_after_the_query_ranks_above_unrelated_ones(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    target = emu.add_resource(name="Pangolin migration survey", text="field notes")
    unrelated = emu.add_resource(name="Lunch menu", text="soup and bread for the team")
    body_only = emu.add_resource(name="Misc", text="a pangolin was seen near the river")
    data = await search(http, {"text": "pangolin", "precision": 0.0})
    order = ids(data["hits"])
    assert order[0] == target["id"]
    assert order.index(body_only["id"]) > order.index(target["id"])
    assert unrelated["id"] not in order
    scores = [h["score"] for h in data["hits"]]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s <= 1.0 for s in scores)


async def test_keyword_search_finds_plural_and_case_variants(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    target = emu.add_resource(name="Wombat burrows")
    for query in ("wombat", "WOMBATS", "Wombat burrow"):
        data = await search(http, {"text": query})
        assert ids(data["hits"])[:1] == [target["id"]], query


async def test_text_hits_quote_matching_chunks_best_first(http: aiohttp.ClientSession) -> None:
    hits = await all_hits(http, {"text": "invoice budget"})
    assert hits
    quoted = 0
    for hit in hits:
        assert len(hit["chunks"]) <= 3
        chunk_scores = [c["score"] for c in hit["chunks"]]
        assert chunk_scores == sorted(chunk_scores, reverse=True)
        for chunk in hit["chunks"]:
            assert {"invoice", "budget"} & set(tokenize(chunk["text"])), chunk["text"]
            assert 0.0 < chunk["score"] <= 1.0
            quoted += 1
    assert quoted > 0


async def test_non_text_searches_quote_no_chunks(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    some_id = emu.resources()[0]["id"]
    for body in ({}, {"resourceId": some_id}, {"image": fake_image_data_url("harbor sunset")}):
        data = await search(http, {**body, "precision": 0.0})
        assert data["hits"]
        assert all(h["chunks"] == [] for h in data["hits"]), body


async def test_every_hit_has_a_score_and_both_embeddings(http: aiohttp.ClientSession) -> None:
    for body in ({}, {"text": "report"}):
        for hit in (await search(http, body))["hits"]:
            assert isinstance(hit["score"], float)
            assert len(hit["embeddings"]["small3_512"]) == 512
            assert len(hit["embeddings"]["clip2"]) == 768
            norm = sum(v * v for v in hit["embeddings"]["small3_512"]) ** 0.5
            assert norm == pytest.approx(1.0, abs=1e-3)


async def test_browsing_without_a_query_gives_every_resource_newest_first(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    hits = await all_hits(http, {})
    assert len(hits) == 200
    assert all(h["score"] == 1.0 for h in hits)
    stamps = [h["createdAt"] for h in hits]
    assert stamps == sorted(stamps, reverse=True)
    assert set(ids(hits)) == {r["id"] for r in emu.resources()}


async def test_image_search_finds_resources_about_the_pictured_thing(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    zebra = emu.add_resource(
        kind="image", name="Zebra crossing", data={"caption": "A zebra crossing at dusk"}
    )
    data = await search(http, {"image": fake_image_data_url("zebra crossing dusk")})
    assert ids(data["hits"])[0] == zebra["id"]
    png = fake_image_data_url(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01")
    data = await search(http, {"image": png})
    assert zebra["id"] not in ids(data["hits"])


async def test_resource_id_search_finds_similar_resources_but_not_itself(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    first = emu.add_resource(name="Axolotl tank", text="axolotl tank water filter gravel")
    twin = emu.add_resource(name="Axolotl tank setup", text="axolotl water filter gravel tank")
    data = await search(http, {"resourceId": first["id"]})
    assert first["id"] not in ids(data["hits"])
    assert ids(data["hits"])[0] == twin["id"]
    async with http.post("/v2/search", json={"resourceId": ANY_UUID}) as response:
        assert response.status == 404
        body = await response.json()
    assert body["error"]["code"] == "not_found"
    assert body["error"]["field"] == "resourceId"


async def test_queries_are_a_union_scored_by_the_best_element(http: aiohttp.ClientSession) -> None:
    first = {h["id"]: h["score"] for h in await all_hits(http, {"text": "invoice"})}
    second = {h["id"]: h["score"] for h in await all_hits(http, {"text": "guitar"})}
    assert first
    assert second
    both = await all_hits(http, {"queries": [{"text": "invoice"}, {"text": "guitar"}]})
    assert set(ids(both)) == set(first) | set(second)
    for hit in both:
        assert hit["score"] == max(first.get(hit["id"], 0.0), second.get(hit["id"], 0.0))
    with_top = await all_hits(http, {"text": "invoice", "queries": [{"text": "guitar"}]})
    assert set(ids(with_top)) == set(ids(both))


async def test_query_elements_keep_their_own_filters_and_precision(
    http: aiohttp.ClientSession,
) -> None:
    documents = await all_hits(
        http, {"queries": [{"text": "invoice", "filters": {"kinds": ["document"]}}]}
    )
    assert documents
    assert {h["kind"] for h in documents} == {"document"}
    loose = await all_hits(http, {"queries": [{"text": "invoice", "precision": 0.0}]})
    strict = await all_hits(http, {"queries": [{"text": "invoice", "precision": 0.9}]})
    assert len(strict) < len(loose)
    top_level = await all_hits(http, {"precision": 0.9, "queries": [{"text": "invoice"}]})
    assert ids(top_level) == ids(strict), "the top-level precision is the elements' default"


# ------------------------------------------------------------------------------ filters


async def test_each_filter_narrows_to_exactly_the_matching_resources(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    resources = emu.resources()
    sample = resources[17]
    tag_owner = next(r for r in resources if r["tags"])
    labelled = next(r for r in resources if r["label"]["id"] != 0)
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"kinds": ["image", "video"]}, lambda r: r["kind"] in ("image", "video")),
        (
            {"color": [labelled["label"]["id"]]},
            lambda r: r["label"]["id"] == labelled["label"]["id"],
        ),
        (
            {"parentIds": [sample["parent"]["id"]]},
            lambda r: r["parent"]["id"] == sample["parent"]["id"],
        ),
        (
            {"ancestorIds": [sample["root"]["id"]]},
            lambda r: r["root"]["id"] == sample["root"]["id"],
        ),
        (
            {"ancestorIds": [sample["root"]["folder"]["id"]]},
            lambda r: r["root"]["folder"]["id"] == sample["root"]["folder"]["id"],
        ),
        (
            {"tagIds": [t["id"] for t in tag_owner["tags"]]},
            lambda r: {t["id"] for t in r["tags"]} & {t["id"] for t in tag_owner["tags"]},
        ),
        ({"userIds": [sample["user"]["id"]]}, lambda r: r["user"]["id"] == sample["user"]["id"]),
        ({"createdAfter": sample["createdAt"]}, lambda r: r["createdAt"] > sample["createdAt"]),
        ({"createdBefore": sample["createdAt"]}, lambda r: r["createdAt"] < sample["createdAt"]),
        (
            {"createdAfter": None, "createdBefore": None, "kinds": [], "tagIds": []},
            lambda r: True,
        ),
    ]
    for filters, predicate in cases:
        expected = {r["id"] for r in resources if predicate(r)}
        got = await all_hits(http, {"filters": filters})
        assert set(ids(got)) == expected, filters
        if filters.get("kinds") != []:
            assert 0 < len(expected) < len(resources), filters


async def test_filters_combine_with_and(http: aiohttp.ClientSession, emu: ServiceEmulator) -> None:
    resources = emu.resources()
    user = resources[3]["user"]["id"]
    expected = {r["id"] for r in resources if r["kind"] == "document" and r["user"]["id"] == user}
    got = await all_hits(http, {"filters": {"kinds": ["document"], "userIds": [user]}})
    assert set(ids(got)) == expected
    assert expected


async def test_created_filters_accept_offsets_and_compare_instants(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    early = emu.add_resource(name="Early", createdAt="2020-01-01T10:00:00.000Z", base_id="t")
    emu.add_resource(name="Late", createdAt="2020-01-01T12:00:00.000Z", base_id="t")
    base = {"X-Service-Base-Id": "t"}
    data = await search(
        http, {"filters": {"createdBefore": "2020-01-01T12:30:00+01:00"}}, headers=base
    )
    assert ids(data["hits"]) == [early["id"]]


async def test_ancestor_ids_match_any_level_of_the_folder_chain(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    deep = emu.add_resource(name="Deep", ancestors=["leaf", "middle", "top"], base_id="tree")
    emu.add_resource(name="Elsewhere", ancestors=["other"], base_id="tree")
    base = {"X-Service-Base-Id": "tree"}
    for ancestor in ("leaf", "middle", "top"):
        data = await search(http, {"filters": {"ancestorIds": [ancestor]}}, headers=base)
        assert ids(data["hits"]) == [deep["id"]]
    data = await search(http, {"filters": {"ancestorIds": ["nowhere"]}}, headers=base)
    assert data["total"] == 0


# ---------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    "query",
    [
        {"text": "invoice budget"},
        {"text": "sunset harbor"},
        {"image": fake_image_data_url("guitar concert")},
    ],
)
async def test_higher_precision_never_gives_more_hits(
    http: aiohttp.ClientSession, query: dict[str, Any]
) -> None:
    previous: set[str] | None = None
    totals = []
    for precision in (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0):
        hits = await all_hits(http, {**query, "precision": precision})
        found = set(ids(hits))
        if previous is not None:
            assert found <= previous, precision
        previous = found
        totals.append(len(found))
        assert all(h["score"] >= precision / 2 for h in hits)
    assert totals[0] > totals[-1]


async def test_precision_defaults_to_0_3(http: aiohttp.ClientSession) -> None:
    default = await search(http, {"text": "invoice"})
    explicit = await search(http, {"text": "invoice", "precision": 0.3})
    other = await search(http, {"text": "invoice", "precision": 0.0})
    assert default == explicit
    assert other["total"] > default["total"]


# --------------------------------------------------------------------------------- sort


def sort_key(field: str, hit: dict[str, Any]) -> Any:
    value = hit.get(field)
    return value.casefold() if field == "name" and value is not None else value


@pytest.mark.parametrize("field", ["score", "createdAt", "modifiedAt", "name", "size"])
@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_sort_orders_hits_by_field_with_nulls_last_and_ties_by_id(
    http: aiohttp.ClientSession, field: str, order: str
) -> None:
    hits = await all_hits(
        http, {"text": "report notes", "precision": 0.0, "sort": {"field": field, "order": order}}
    )
    assert len(hits) > 20
    values = [sort_key(field, h) for h in hits]
    present = [v for v in values if v is not None]
    assert values[: len(present)] == present, "nulls come last"
    assert present == sorted(present, reverse=order == "desc")
    for a, b in itertools.pairwise(hits):
        if sort_key(field, a) == sort_key(field, b):
            assert a["id"] < b["id"], "ties are broken by id"
    if field == "name":
        assert len(present) < len(values), "the seeded data has unnamed resources"


async def test_sort_defaults(http: aiohttp.ClientSession) -> None:
    by_score = await search(http, {"text": "report", "sort": {"field": "score"}})
    scores = [h["score"] for h in by_score["hits"]]
    assert scores == sorted(scores, reverse=True)
    by_name = await search(http, {"sort": {"field": "name"}})
    names = [h["name"].casefold() for h in by_name["hits"] if h["name"] is not None]
    assert names == sorted(names)
    oldest = await search(http, {"sort": {"order": "asc"}})
    stamps = [h["createdAt"] for h in oldest["hits"]]
    assert stamps == sorted(stamps)


# ---------------------------------------------------------------------------- pagination


@pytest.mark.parametrize("page_size", [1, 7, 20, 100])
async def test_pages_cover_every_hit_once_with_consistent_totals(
    http: aiohttp.ClientSession, page_size: int
) -> None:
    body = {"text": "report plan summary", "precision": 0.1}
    expected = await all_hits(http, body)
    assert 20 < len(expected) <= 200
    seen: list[str] = []
    page = 1
    while True:
        data = await search(http, {**body, "pagination": {"page": page, "pageSize": page_size}})
        assert data["total"] == len(expected)
        assert len(data["hits"]) <= page_size
        seen.extend(ids(data["hits"]))
        assert data["hasMore"] == (len(seen) < len(expected))
        if not data["hasMore"]:
            break
        assert len(data["hits"]) == page_size
        page += 1
        if page_size == 1 and page > 40:
            break  # enough single-hit pages to show the walk is consistent
    assert len(seen) == len(set(seen))
    assert seen == ids(expected)[: len(seen)]


async def test_a_page_past_the_end_is_empty(http: aiohttp.ClientSession) -> None:
    data = await search(http, {"pagination": {"page": 50, "pageSize": 20}})
    assert data == {"total": 200, "hasMore": False, "hits": []}


async def test_the_default_page_is_the_first_twenty(http: aiohttp.ClientSession) -> None:
    default = await search(http, {})
    explicit = await search(http, {"pagination": {"page": 1, "pageSize": 20}})
    assert default == explicit
    assert len(default["hits"]) == 20
    assert default["hasMore"] is True


async def test_the_first_page_number_is_configurable() -> None:
    async with (
        ServiceEmulator(api_key=KEY, seed=7, n_resources=30, n_jobs=0, first_page=0) as emulator,
        aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as session,
    ):
        async with session.post("/v2/search", json={"pagination": {"pageSize": 10}}) as r:
            default = await r.json()
        async with session.post(
            "/v2/search", json={"pagination": {"page": 0, "pageSize": 10}}
        ) as r:
            assert await r.json() == default
        async with session.post(
            "/v2/search", json={"pagination": {"page": 2, "pageSize": 10}}
        ) as r:
            last = await r.json()
        assert last["hasMore"] is False
        assert len(last["hits"]) == 10
        async with session.post(
            "/v2/search", json={"pagination": {"page": -1, "pageSize": 10}}
        ) as r:
            assert await r.json() == default  # clamped to the first page


# ---------------------------------------------------------------------------- validation


def data_url_of_length(length: int) -> str:
    prefix = "data:image/x-png;base64,"
    payload = (length - len(prefix)) // 4 * 3
    url = prefix + base64.b64encode(b"\x00" * payload).decode()
    assert len(url) == length
    return url


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "x" * 256}, "text"),
        ({"text": 5}, "text"),
        ({"text": None}, "text"),
        ({"image": "https://example.org/cat.png"}, "image"),
        ({"image": "data:image/png;base64,@@@@"}, "image"),
        ({"image": data_url_of_length(600_004)}, "image"),
        ({"resourceId": "not-a-uuid"}, "resourceId"),
        ({"resourceId": ANY_UUID.upper()}, "resourceId"),
        ({"resourceId": "0b0c4f4e-4b0a-9c6e-9f3e-0e7c2b1a9d10"}, "resourceId"),
        ({"precision": 1.5}, "precision"),
        ({"precision": -0.1}, "precision"),
        ({"precision": "0.3"}, "precision"),
        ({"precision": True}, "precision"),
        ({"filters": {"kinds": "document"}}, "filters.kinds"),
        ({"filters": {"color": ["red"]}}, "filters.color[0]"),
        ({"filters": {"tagIds": [1]}}, "filters.tagIds[0]"),
        ({"filters": {"createdAfter": "yesterday"}}, "filters.createdAfter"),
        ({"filters": []}, "filters"),
        ({"queries": {}}, "queries"),
        ({"queries": [{"text": 1}]}, "queries[0].text"),
        ({"queries": [{"precision": 2}]}, "queries[0].precision"),
        ({"incognito": "yes"}, "incognito"),
        ({"pagination": {"page": "2"}}, "pagination.page"),
        ({"pagination": {"pageSize": 1.5}}, "pagination.pageSize"),
        ({"sort": {"field": 3}}, "sort.field"),
        ({"sort": []}, "sort"),
        ({"resourceId": ANY_UUID + "\n"}, "resourceId"),
        ({"queries": [{"resourceId": ANY_UUID + "\n"}]}, "queries[0].resourceId"),
    ],
)
async def test_invalid_bodies_get_a_422_naming_the_field(
    http: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    async with http.post("/v2/search", json=body) as response:
        assert response.status == 422
        error = (await response.json())["error"]
    assert error["status"] == 422
    assert error["code"] == "validation_error"
    assert error["field"] == field
    assert error["message"]


@pytest.mark.parametrize("body", [[], "text", 3, None])
async def test_a_body_that_is_not_an_object_is_refused(
    http: aiohttp.ClientSession, body: Any
) -> None:
    async with http.post("/v2/search", data=json.dumps(body)) as response:
        assert response.status == 422
        assert (await response.json())["error"]["code"] == "validation_error"


@pytest.mark.parametrize(
    "body",
    [
        {"text": "x" * 255},
        {"image": data_url_of_length(600_000)},
        {"precision": 0},
        {"precision": 1},
        {"incognito": None},
        {"pagination": {"page": 1, "pageSize": 100}},
        {"filters": {"createdAfter": "2024-01-01", "color": [0, 1]}},
        {
            "text": "a",
            "image": fake_image_data_url("a"),
            "resourceId": ANY_UUID.replace("0b0c", "0b0d"),
        },
    ],
)
async def test_values_at_the_limits_are_accepted(
    http: aiohttp.ClientSession, emu: ServiceEmulator, body: dict[str, Any]
) -> None:
    if "resourceId" in body:
        emu.add_resource(id=body["resourceId"], name="a")
    await search(http, body)


# ---------------------------------------------------------------------- search history


async def test_incognito_searches_are_left_out_of_the_history(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    await search(http, {"text": "kept"})
    await search(http, {"text": "hidden", "incognito": True})
    await search(
        http, {"text": "also kept", "incognito": False}, headers={"X-Service-Base-Id": "b"}
    )
    assert [(r.base_id, r.body["text"]) for r in emu.search_history] == [
        (None, "kept"),
        ("b", "also kept"),
    ]


# --------------------------------------------------------------------- numpy and pure paths


@needs_numpy
@pytest.mark.parametrize(
    "body",
    [
        {"text": "invoice budget", "precision": 0.0, "pagination": {"pageSize": 100}},
        {"text": "invoicing", "precision": 0.05},
        {"image": fake_image_data_url("sunset harbor beach"), "precision": 0.0},
        {"queries": [{"text": "guitar"}, {"image": fake_image_data_url("forest")}]},
        {"text": "team", "image": fake_image_data_url("team"), "sort": {"field": "name"}},
    ],
)
async def test_numpy_and_pure_python_paths_give_identical_answers(
    http: aiohttp.ClientSession, emu: ServiceEmulator, body: dict[str, Any]
) -> None:
    emu.use_numpy = True
    async with http.post("/v2/search", json=body) as response:
        with_numpy = await response.read()
    emu.use_numpy = False
    async with http.post("/v2/search", json=body) as response:
        without = await response.read()
    assert json.loads(with_numpy)["total"] > 0
    assert with_numpy == without


@needs_numpy
def test_both_paths_compute_bit_identical_scores() -> None:
    emulator = ServiceEmulator(seed=7, n_resources=200, n_jobs=0)
    index = emulator.store.base(None).index
    some_id = emulator.resources()[9]["id"]
    bodies: list[dict[str, Any]] = [
        {"text": "invoice budget guitar harbor", "precision": 0.0},
        {"text": "invoicing", "precision": 0.0},
        {"image": fake_image_data_url("sunset harbor"), "precision": 0.0},
        {"resourceId": some_id, "precision": 0.0},
        {"text": "report", "resourceId": some_id, "precision": 0.0},
    ]
    for body in bodies:
        request = parse_search({**body, "pagination": {"pageSize": 100}})
        total, with_numpy = index.search(request, use_numpy=True)
        assert total > 20
        assert index.search(request, use_numpy=False) == (total, with_numpy)


@needs_numpy
async def test_resource_similarity_is_identical_on_both_paths(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    for resource in emu.resources()[:3]:
        body = {"resourceId": resource["id"], "precision": 0.0, "pagination": {"pageSize": 100}}
        emu.use_numpy = True
        with_numpy = await search(http, body)
        emu.use_numpy = False
        assert await search(http, body) == with_numpy
        assert with_numpy["total"] > 0


async def test_without_numpy_the_pure_python_path_is_used(
    http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = await search(http, {"text": "invoice"})

    def no_numpy(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the numpy path ran although numpy is marked unavailable")

    monkeypatch.setattr(_search, "HAVE_NUMPY", False)
    monkeypatch.setattr(_search._VectorSpace, "_similarities_numpy", no_numpy)
    assert await search(http, {"text": "invoice"}) == expected


# ---------------------------------------------------------------------------------- scale


async def test_ten_thousand_resources_are_searched_page_by_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the requested page is serialised: counted (chunks and vectors made for the wire),
    # not timed, so that a busy machine cannot fail it.
    serialised = {"chunks": 0, "vectors": 0}
    matched_chunks = _search.SearchIndex.matched_chunks
    wire_vector = _search._VectorSpace.wire_vector

    def counting_chunks(self: Any, *args: Any) -> Any:
        serialised["chunks"] += 1
        return matched_chunks(self, *args)

    def counting_vector(self: Any, *args: Any) -> Any:
        serialised["vectors"] += 1
        return wire_vector(self, *args)

    monkeypatch.setattr(_search.SearchIndex, "matched_chunks", counting_chunks)
    monkeypatch.setattr(_search._VectorSpace, "wire_vector", counting_vector)
    emulator = ServiceEmulator(api_key=KEY, seed=3, n_resources=10_000, n_jobs=0)
    async with (
        emulator,
        aiohttp.ClientSession(emulator.base_url, headers={"X-Api-Key": KEY}) as session,
    ):
        for body in (
            {"text": "invoice budget report"},
            {},
            {"image": fake_image_data_url("harbor")},
        ):
            serialised.update(chunks=0, vectors=0)
            async with session.post("/v2/search", json=body) as response:
                data = await response.json()
            assert data["total"] > 100
            assert len(data["hits"]) == 20
            assert serialised == {"chunks": 20, "vectors": 40}, (body.keys(), serialised)
            assert emulator.stats.last_search_ms is not None


async def test_a_page_walk_sees_resources_added_between_its_pages(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    # The emulator keeps the last search's order for its next page; adding a resource must
    # end that, and another search must not get it.
    body = {"filters": {}, "sort": {"field": "createdAt", "order": "desc"}}
    first = await search(http, {**body, "pagination": {"page": 1, "pageSize": 5}})
    added = emu.add_resource(name="Newest of all", createdAt="2099-01-01T00:00:00Z")
    again = await search(http, {**body, "pagination": {"page": 1, "pageSize": 5}})
    assert again["total"] == first["total"] + 1
    assert ids(again["hits"])[0] == added["id"]
    assert ids(again["hits"])[1:] == ids(first["hits"])[:4]
    oldest = await search(
        http,
        {**body, "sort": {"field": "createdAt", "order": "asc"}, "pagination": {"page": 1}},
    )
    assert added["id"] not in ids(oldest["hits"])
    assert ids(oldest["hits"])[0] != ids(again["hits"])[0]
