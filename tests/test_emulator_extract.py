"""GET /v2/extract/{jobId} and its webhook logs on the emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from asyncsearch.testing import ServiceEmulator

from .conftest import EMULATOR_KEY as KEY

MISSING = "0b0c4f4e-4b0a-4c6e-9f3e-0e7c2b1a9d10"


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=0, n_jobs=50) as emulator:
        yield emulator


async def get(http: aiohttp.ClientSession, path: str, status: int = 200, **kw: Any) -> Any:
    async with http.get(path, **kw) as response:
        assert response.status == status, await response.text()
        assert response.content_type == "application/json"
        return await response.json()


async def test_a_job_reads_back_as_stored(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    for job in emu.jobs()[:10]:
        assert await get(http, f"/v2/extract/{job['id']}") == job
        assert await get(http, f"/v2/extract/{job['id']}", params={"format": "json"}) == job


async def test_markdown_puts_a_markdown_rendering_in_the_caption_and_keeps_the_shape(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.add_job(
        name="Scan",
        extraction={
            "common": {"caption": "Two cats on a sofa.", "keywords": ["cat", "sofa"]},
            "document": {"title": "Cat report"},
            "media": {"ocr": "PURR INC"},
        },
    )
    markdown = await get(http, f"/v2/extract/{job['id']}", params={"format": "markdown"})
    caption = markdown["extraction"]["common"]["caption"]
    assert caption.startswith("# Cat report\n")
    assert "Two cats on a sofa." in caption
    assert "**Keywords:** cat, sofa" in caption
    assert "PURR INC" in caption
    markdown["extraction"]["common"]["caption"] = job["extraction"]["common"]["caption"]
    assert markdown == job, "only the caption changes"


async def test_scripted_states_advance_one_read_at_a_time(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.add_job(state="pending", next_states=["processing", "done"])
    states = [(await get(http, f"/v2/extract/{job['id']}"))["state"] for _ in range(4)]
    assert states == ["pending", "processing", "done", "done"]
    emu.set_job_state(job["id"], "failed")
    assert (await get(http, f"/v2/extract/{job['id']}"))["state"] == "failed"


async def test_an_unknown_job_is_a_404_on_every_job_endpoint(http: aiohttp.ClientSession) -> None:
    for path in (
        f"/v2/extract/{MISSING}",
        f"/v2/extract/{MISSING}/webhook-logs",
        f"/v2/extract/{MISSING}/webhook-logs/{MISSING}",
    ):
        body = await get(http, path, status=404)
        assert body["error"]["status"] == 404
        assert body["error"]["code"] == "not_found"
        assert body["error"]["field"] == "jobId"


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v2/extract/not-a-uuid", {}, "jobId"),
        (f"/v2/extract/{MISSING.upper()}", {}, "jobId"),
        ("/v2/extract/{job}", {"format": "pdf"}, "format"),
        ("/v2/extract/not-a-uuid/webhook-logs", {}, "jobId"),
        ("/v2/extract/{job}/webhook-logs/not-a-uuid", {}, "logId"),
        (f"/v2/extract/{MISSING}%0A", {}, "jobId"),
        (f"/v2/extract/{MISSING}%0A/webhook-logs", {}, "jobId"),
        ("/v2/extract/{job}/webhook-logs/" + MISSING + "%0A", {}, "logId"),
    ],
)
async def test_bad_parameters_get_a_422_naming_them(
    http: aiohttp.ClientSession, emu: ServiceEmulator, path: str, params: dict[str, str], field: str
) -> None:
    job = emu.jobs()[0]["id"]
    body = await get(http, path.format(job=job), status=422, params=params)
    assert body["error"]["code"] == "validation_error"
    assert body["error"]["field"] == field


async def test_webhook_logs_list_summaries_in_attempt_order(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    with_logs = [j for j in emu.jobs() if len(emu.webhook_logs(j["id"])) >= 2]
    assert with_logs
    for job in with_logs:
        listing = await get(http, f"/v2/extract/{job['id']}/webhook-logs")
        stored = emu.webhook_logs(job["id"])
        assert [i["id"] for i in listing["items"]] == [s["id"] for s in stored]
        assert [i["attemptNumber"] for i in listing["items"]] == list(range(1, len(stored) + 1))
        for item in listing["items"]:
            assert "requestPayload" not in item
            assert "responseBody" not in item
    empty = [j for j in emu.jobs() if not emu.webhook_logs(j["id"])]
    assert empty, "some seeded jobs have no deliveries yet"
    assert await get(http, f"/v2/extract/{empty[0]['id']}/webhook-logs") == {"items": []}


async def test_a_webhook_log_reads_back_in_detail_form(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    job = emu.add_job(state="done")
    log = emu.add_webhook_log(
        job["id"], status="failed", statusCode=502, errorMessage="HTTP 502", responseBody="bad"
    )
    detail = await get(http, f"/v2/extract/{job['id']}/webhook-logs/{log['id']}")
    assert detail == log
    assert detail["requestPayload"] is not None


async def test_a_log_of_another_job_or_an_unknown_log_is_a_404(
    http: aiohttp.ClientSession, emu: ServiceEmulator
) -> None:
    first = emu.add_job()
    second = emu.add_job()
    log = emu.add_webhook_log(first["id"])
    body = await get(http, f"/v2/extract/{second['id']}/webhook-logs/{log['id']}", status=404)
    assert body["error"]["field"] == "logId"
    await get(http, f"/v2/extract/{first['id']}/webhook-logs/{MISSING}", status=404)


async def test_jobs_are_scoped_per_base(http: aiohttp.ClientSession, emu: ServiceEmulator) -> None:
    job = emu.add_job(base_id="other")
    log = emu.add_webhook_log(job["id"], base_id="other")
    other = {"X-Service-Base-Id": "other"}
    await get(http, f"/v2/extract/{job['id']}", status=404)
    await get(http, f"/v2/extract/{job['id']}/webhook-logs", status=404)
    assert (await get(http, f"/v2/extract/{job['id']}", headers=other))["id"] == job["id"]
    listing = await get(http, f"/v2/extract/{job['id']}/webhook-logs", headers=other)
    assert [i["id"] for i in listing["items"]] == [log["id"]]
    seeded = emu.jobs()[0]["id"]
    await get(http, f"/v2/extract/{seeded}", status=404, headers=other)
