"""Image search on the emulator finds added images: by identical bytes, and with Pillow by look."""

from __future__ import annotations

import io
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import asyncsearch
from asyncsearch import AsyncSearchClient
from asyncsearch.testing import ServiceEmulator, _images
from asyncsearch.testing._images import fingerprint, similarity

from .cli_helpers import cli_env, run_python
from .conftest import EMULATOR_KEY as KEY

Image = pytest.importorskip("PIL.Image")


def picture(seed: int, size: int = 96, fmt: str = "PNG") -> bytes:
    """A distinct picture per seed: an 8 x 8 grid of random colours, scaled up."""
    rng = random.Random(seed)
    grid = Image.new("RGB", (8, 8))
    grid.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(64)])
    return encode(grid.resize((size, size), Image.Resampling.NEAREST), fmt)


def encode(image: Any, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def lookalike(data: bytes) -> bytes:
    """The same picture resized to two thirds and re-encoded as a lossy JPEG."""
    with Image.open(io.BytesIO(data)) as original:
        smaller = original.convert("RGB").resize((64, 64), Image.Resampling.BILINEAR)
    return encode(smaller, "JPEG", quality=70)


@pytest.fixture
async def emu() -> AsyncIterator[ServiceEmulator]:
    # Seeded resources too, so an image hit has to beat text-embedded competitors.
    async with ServiceEmulator(api_key=KEY, seed=7, n_resources=100, n_jobs=0) as emulator:
        yield emulator


def add_pictures(emu: ServiceEmulator, count: int = 8) -> list[tuple[str, bytes]]:
    added = []
    for seed in range(count):
        data = picture(seed)
        resource = emu.add_resource(name=f"Picture {seed}", kind="image", image=data)
        added.append((resource["id"], data))
    return added


async def image_search(
    http: aiohttp.ClientSession, data: bytes, mime: str = "image/png", **extra: Any
) -> list[dict[str, Any]]:
    url = asyncsearch.image_data_url(data, mime=mime)
    async with http.post("/v2/search", json={"image": url, **extra}) as response:
        assert response.status == 200, await response.text()
        hits: list[dict[str, Any]] = (await response.json())["hits"]
        return hits


@pytest.mark.parametrize("use_numpy", [None, False])
async def test_the_same_bytes_find_the_added_image_first_with_score_one(
    emu: ServiceEmulator, http: aiohttp.ClientSession, use_numpy: bool | None
) -> None:
    emu.use_numpy = use_numpy
    for resource_id, data in add_pictures(emu):
        hits = await image_search(http, data)
        assert hits[0]["id"] == resource_id
        assert hits[0]["score"] == 1.0
        assert all(h["score"] < 1.0 for h in hits[1:])


async def test_without_pillow_identical_bytes_still_match(
    emu: ServiceEmulator, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_images, "HAVE_PILLOW", False)
    added = add_pictures(emu, 4)
    assert all(fingerprint(data).thumbnail is None for _, data in added)
    for resource_id, data in added:
        hits = await image_search(http, data)
        assert hits[0]["id"] == resource_id
        assert hits[0]["score"] == 1.0
    # Without a decoder a look-alike is just other bytes: no picture of ours scores above 0.99.
    resource_id, data = added[0]
    hits = await image_search(http, lookalike(data), mime="image/jpeg", precision=0.0)
    assert all(h["score"] < 0.5 for h in hits if h["id"] == resource_id)


@pytest.mark.parametrize("use_numpy", [None, False])
async def test_with_pillow_a_resized_reencoded_copy_ranks_the_original_first(
    emu: ServiceEmulator, http: aiohttp.ClientSession, use_numpy: bool | None
) -> None:
    emu.use_numpy = use_numpy
    for resource_id, data in add_pictures(emu):
        copy = lookalike(data)
        assert copy != data
        hits = await image_search(http, copy, mime="image/jpeg")
        assert hits[0]["id"] == resource_id
        assert 0.9 < hits[0]["score"] < 1.0
        assert all(h["score"] < 0.5 for h in hits[1:])


def test_similarity_of_fingerprints() -> None:
    first, second = picture(1), picture(2)
    assert similarity(fingerprint(first), fingerprint(first)) == 1.0
    assert similarity(fingerprint(first), fingerprint(lookalike(first))) > 0.9
    assert similarity(fingerprint(first), fingerprint(second)) < 0.5
    red = encode(Image.new("RGB", (10, 10), (200, 0, 0)), "PNG")
    also_red = encode(Image.new("RGB", (30, 30), (200, 0, 0)), "BMP")
    blue = encode(Image.new("RGB", (10, 10), (0, 0, 255)), "PNG")
    assert similarity(fingerprint(red), fingerprint(also_red)) == _images.MAX_LOOKALIKE_SCORE
    assert similarity(fingerprint(red), fingerprint(blue)) < similarity(
        fingerprint(red), fingerprint(also_red)
    )
    assert similarity(fingerprint(red), fingerprint(first)) == 0.0  # flat against textured
    assert fingerprint(b"not an image").thumbnail is None  # compared by bytes only


def test_a_decompression_bomb_is_compared_by_bytes_only() -> None:
    # 100 M pixels in a few KB: past Pillow's limit (about 89 M), where it only warns.
    huge = encode(Image.new("1", (10_000, 10_000)), "PNG")
    assert fingerprint(huge).thumbnail is None


async def test_the_client_finds_an_image_file_added_as_a_resource(
    emu: ServiceEmulator, tmp_path: Path
) -> None:
    added = add_pictures(emu, 3)
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(lookalike(added[1][1]))
    emu.add_resource(name="The photo itself", image=photo.read_bytes())
    async with AsyncSearchClient(api_key=emu.api_key, base_url=emu.base_url) as client:
        page = await client.search(image=asyncsearch.image_data_url(photo))
    assert [h.name for h in page.hits[:2]] == ["The photo itself", "Picture 1"]


async def test_an_image_can_be_added_over_http(
    emu: ServiceEmulator, http: aiohttp.ClientSession
) -> None:
    data = picture(42)
    url = asyncsearch.image_data_url(data)
    async with http.post(
        "/_emulator/resources", json={"resource": {"name": "Remote picture"}, "image": url}
    ) as response:
        assert response.status == 201
        resource_id = (await response.json())["id"]
    assert (await image_search(http, data))[0]["id"] == resource_id
    async with http.post(
        "/_emulator/resources", json={"resource": {"name": "Bad"}, "image": "not a data URL"}
    ) as response:
        assert response.status == 422


NO_PILLOW = """
import base64, sys
sys.modules["PIL"] = None  # as if Pillow were not installed
from asyncsearch.testing import ServiceEmulator, _images
from asyncsearch.testing._requests import parse_search
assert not _images.HAVE_PILLOW
emu = ServiceEmulator()
data = bytes(range(256)) * 4
emu.add_resource(name="other", image=b"something else")
wanted = emu.add_resource(name="wanted", image=data)
url = "data:image/png;base64," + base64.b64encode(data).decode()
total, page = emu.store.base(None).index.search(parse_search({"image": url}))
print(page[0][0].id == wanted["id"], page[0][1])
"""


async def test_the_emulator_imports_and_matches_bytes_without_pillow() -> None:
    result = await run_python(NO_PILLOW, env=cli_env())
    assert result.code == 0, result.stderr
    assert result.stdout.split() == ["True", "1.0"]
