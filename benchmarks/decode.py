"""Decoding search pages with embeddings: asyncsearch's typed decode against the alternatives.

    python -m benchmarks.decode [--sizes 10,100,1000] [--rounds 9] [--quick] [--json PATH]

Pages of 10, 100 and 1000 hits, every field of a hit filled and 512 + 768 embedding values per
hit (about 24 MB of JSON at 1000 hits), are decoded by:

- ``msgspec untyped`` (the baseline): ``msgspec.json.Decoder().decode(body)``, dicts and lists;
- ``asyncsearch SearchPage, no vector read``: ``msgspec.json.Decoder(SearchPage).decode(body)``,
  a decoder built once, exactly what the client does (``asyncsearch._protocol.decode_body``):
  each hit keeps its embeddings as the raw JSON, decoded on first read of ``hit.embeddings``;
- ``asyncsearch SearchPage, every vector read``: the same, then ``hit.embeddings`` read for
  every hit (an export that needs them all);
- ``asyncsearch embeddings=False``: the page the client makes with ``embeddings=False`` (the
  raw slices dropped, so the body can be freed);
- ``eager clone`` and ``eager clone, gc=True``: the same Structs rebuilt with ``embeddings``
  decoded while parsing, as asyncsearch did before (``gc=False``), and with ``gc=True``, to
  show what decoding on first read and ``gc=False`` buy;
- ``orjson.loads``, ``json.loads`` (stdlib), and pydantic v2 models of the same schema
  (``model_validate_json``, see ``benchmarks/_pydantic_models.py``).

Times are medians over interleaved rounds; memory is measured in a separate pass with
``tracemalloc`` (peak while decoding, and what the result keeps once decoding is done; the body
itself is allocated before tracing starts and is not counted). ``held MB`` adds the body for
the variants whose result keeps it alive (a page whose vectors are not all read references the
answer's bytes). ``full gc +ms`` is what holding the result adds to one full ``gc.collect()``:
what every later full collection pays for it. ``embedding_matrix()`` turns a page's embeddings
into one float32 numpy array, from the raw text of a page not read and from the lists of a page
read.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from asyncsearch import SearchPage
from asyncsearch._models import Embeddings
from asyncsearch._protocol import _parse_search_page_without_embeddings
from benchmarks._bodies import search_hit
from benchmarks._common import (
    Measurement,
    Target,
    Targets,
    command_line,
    fmt_ratio,
    median,
    print_environment,
    print_table,
    ratio,
    rounds_sync,
    write_json,
)

BASELINE = "msgspec untyped"
TYPED = "asyncsearch SearchPage, no vector read"
READ_ALL = "asyncsearch SearchPage, every vector read"
DROPPED = "asyncsearch embeddings=False"
EAGER = "eager clone (vectors decoded while parsing)"
GC_CLONE = "eager clone, gc=True"
PYDANTIC = "pydantic v2"
#: The variants whose result references the body (a msgspec.Raw per hit not read).
KEEPS_BODY = frozenset({TYPED})

Decode = Callable[[bytes], Any]


# ---------------------------------------------------------------------------------------------
# Eager copies of the SearchPage Structs: vectors decoded while parsing, gc=False or gc=True
# ---------------------------------------------------------------------------------------------


def eager_clone(
    cls: type[msgspec.Struct], *, gc: bool, _done: dict[type, type] | None = None
) -> type[Any]:
    """A copy of a Struct class and of every Struct it refers to, ``embeddings`` decoded eagerly.

    Same fields, wire names, defaults and ``__post_init__``; a hit's raw ``embeddings``
    (``msgspec.Raw``) becomes ``Embeddings | None`` (what asyncsearch decoded before it read
    them on first use), and the garbage collector setting is ``gc``, so timing the clones
    isolates what decoding on first read and ``gc=False`` are worth.
    """
    done = {} if _done is None else _done
    if cls in done:
        return done[cls]
    specs: list[tuple[str, Any, Any]] = []
    for info in msgspec.structs.fields(cls):
        kind = Embeddings | None if info.type is msgspec.Raw else info.type
        kind = _clone_type(kind, done, gc)
        if info.default_factory is not msgspec.NODEFAULT:
            spec = msgspec.field(default_factory=info.default_factory, name=info.encode_name)
        elif info.default is not msgspec.NODEFAULT:
            spec = msgspec.field(default=info.default, name=info.encode_name)
        else:
            spec = msgspec.field(name=info.encode_name)
        specs.append((info.name, kind, spec))
    namespace: dict[str, Any] = {}
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        namespace["__post_init__"] = post_init
        namespace["_list_fields"] = getattr(cls, "_list_fields", ())
    suffix = "GC" if gc else "Eager"
    clone = msgspec.defstruct(
        f"{cls.__name__}{suffix}", specs, kw_only=True, gc=gc, namespace=namespace
    )
    done[cls] = clone
    return clone


def _clone_type(kind: Any, done: dict[type, type], gc: bool) -> Any:
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return eager_clone(kind, gc=gc, _done=done)
    origin = typing.get_origin(kind)
    if origin is None:
        return kind
    args = tuple(_clone_type(arg, done, gc) for arg in typing.get_args(kind))
    if origin is typing.Union or origin is types.UnionType:
        return typing.Union[args]  # noqa: UP007 - built from a tuple at run time
    if origin is list:
        return list[args[0]]  # type: ignore[valid-type]
    return kind


# ---------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------


def decoders() -> dict[str, Decode]:
    """Every variant, the baseline first."""
    import json

    import orjson

    from benchmarks._pydantic_models import SearchPageModel

    typed = msgspec.json.Decoder(SearchPage).decode

    def read_all(body: bytes) -> SearchPage:
        page = typed(body)
        for hit in page.hits:
            hit.embeddings  # noqa: B018 - the read is what is measured
        return page

    return {
        BASELINE: msgspec.json.Decoder().decode,
        TYPED: typed,
        READ_ALL: read_all,
        DROPPED: _parse_search_page_without_embeddings,
        EAGER: msgspec.json.Decoder(eager_clone(SearchPage, gc=False)).decode,
        GC_CLONE: msgspec.json.Decoder(eager_clone(SearchPage, gc=True)).decode,
        "orjson.loads": orjson.loads,
        "json.loads (stdlib)": json.loads,
        PYDANTIC: SearchPageModel.model_validate_json,
    }


def _check_same_data(body: bytes, variants: dict[str, Decode]) -> None:
    """All variants read the same data (a benchmark of wrong answers is worthless)."""
    reference = msgspec.json.decode(body)
    typed = variants[TYPED](body).to_dict()
    assert typed["hits"][0]["embeddings"] == reference["hits"][0]["embeddings"]
    assert msgspec.to_builtins(variants[READ_ALL](body)) == typed
    assert msgspec.to_builtins(variants[EAGER](body)) == typed
    assert msgspec.to_builtins(variants[GC_CLONE](body)) == typed
    assert gc.is_tracked(variants[GC_CLONE](body).hits[0])
    assert not gc.is_tracked(variants[EAGER](body).hits[0])
    assert not gc.is_tracked(variants[TYPED](body).hits[0])
    pydantic_page = variants[PYDANTIC](body).model_dump(by_alias=True)
    assert pydantic_page == typed, "the pydantic models read the page differently"
    dropped = msgspec.to_builtins(variants[DROPPED](body))
    for hit in typed["hits"]:
        hit["embeddings"] = None
    assert dropped == typed


def _timer(decode: Decode, body: bytes, loops: int) -> Callable[[], Measurement]:
    def run() -> Measurement:
        total = 0.0
        for _ in range(loops):
            start = time.perf_counter()
            result = decode(body)
            total += time.perf_counter() - start
            del result
        return {"seconds": total / loops}

    return run


def _read_all(page: SearchPage) -> SearchPage:
    for hit in page.hits:
        hit.embeddings  # noqa: B018 - decoded and kept
    return page


def _matrix_timer(page: SearchPage, name: str) -> Callable[[], Measurement]:
    def run() -> Measurement:
        start = time.perf_counter()
        matrix = page.embedding_matrix(name)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        del matrix
        return {"seconds": seconds}

    return run


def memory(decode: Decode, body: bytes, collections: int = 5) -> dict[str, float]:
    """Peak traced bytes while decoding, bytes the result keeps, and what it adds to a full gc.

    ``gc`` is the time of a full ``gc.collect()`` with the result alive minus one without it
    (fastest of ``collections`` each): what every later full collection pays while the page is
    kept; 0 with no ``collections`` (the smoke run, whose figures mean nothing).
    """
    if collections:
        gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = decode(body)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if not collections:
        return {"peak": peak, "retained": retained, "gc": 0.0}
    with_result = _full_collection(collections)
    del result
    without = _full_collection(collections)
    return {"peak": peak, "retained": retained, "gc": max(0.0, with_result - without)}


def _full_collection(times: int = 5) -> float:
    gc.collect()
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        gc.collect()
        samples.append(time.perf_counter() - start)
    return min(samples)


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", default="10,100,1000", help="hits per page, comma-separated")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="small pages, for a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rounds = max(5, args.rounds)
    if args.quick:  # a smoke test: one round of small pages, in seconds
        sizes, rounds = [10, 30], 1

    variants = decoders()
    hits = [search_hit(i) for i in range(max(sizes))]
    bodies = {
        n: msgspec.json.encode({"total": n, "hasMore": False, "hits": hits[:n]}) for n in sizes
    }
    del hits
    _check_same_data(bodies[min(sizes)], variants)

    biggest = max(sizes)
    # Matrices from a page not read (raw text) and from one read (lists of floats).
    pages = {
        "raw": msgspec.json.decode(bodies[biggest], type=SearchPage),
        "read": _read_all(msgspec.json.decode(bodies[biggest], type=SearchPage)),
    }
    timers: dict[str, Callable[[], Measurement]] = {}
    for n in sizes:
        loops = max(1, 300 // n)
        for name, decode in variants.items():
            timers[f"{n}|{name}"] = _timer(decode, bodies[n], loops)
    for state, page in pages.items():
        for name in ("small3_512", "clip2"):
            timers[f"matrix|{state}|{name}"] = _matrix_timer(page, name)
    samples = rounds_sync(timers, rounds)

    collections = 0 if args.quick else 5
    mem = {
        (n, name): memory(decode, bodies[n], collections)
        for n in sizes
        for name, decode in variants.items()
    }
    empty_gc = _full_collection()

    results: dict[str, Any] = {"sizes": {}, "rounds": rounds}
    for n in sizes:
        body = bodies[n]
        base = median(samples[f"{n}|{BASELINE}"], "seconds")
        rows = []
        per_size: dict[str, Any] = {}
        for name in variants:
            seconds = median(samples[f"{n}|{name}"], "seconds")
            m = mem[(n, name)]
            m["held"] = m["retained"] + (len(body) if name in KEEPS_BODY else 0)
            rows.append(
                [
                    name,
                    f"{seconds * 1000:.2f}",
                    fmt_ratio(ratio(seconds, base)),
                    f"{len(body) / seconds / 1e6:.0f}",
                    f"{m['peak'] / 1e6:.1f}",
                    f"{m['retained'] / 1e6:.1f}",
                    f"{m['held'] / 1e6:.1f}",
                    f"{m['gc'] * 1000:.1f}",
                ]
            )
            per_size[name] = {"seconds": seconds, **m}
        results["sizes"][str(n)] = {"body_bytes": len(body), "variants": per_size}
        print_table(
            f"Decoding a {n}-hit page with embeddings ({len(body) / 1e6:.2f} MB), "
            f"median of {rounds} interleaved rounds; time ratio to {BASELINE} (lower is faster)",
            [
                "decoder",
                "ms",
                "time vs baseline",
                "MB/s",
                "peak MB",
                "retained MB",
                "held MB",
                "full gc +ms",
            ],
            rows,
        )
    print(
        f"full gc +ms: what holding the result adds to every full gc.collect() (which takes "
        f"{empty_gc * 1000:.1f} ms in this process without it). Peak and retained memory are "
        "what tracemalloc sees: allocations made outside Python's allocators (pydantic-core's "
        "Rust parser) are not counted."
    )

    matrix_rows = []
    base_big = median(samples[f"{biggest}|{BASELINE}"], "seconds")
    for state, page in pages.items():
        for name in ("small3_512", "clip2"):
            seconds = median(samples[f"matrix|{state}|{name}"], "seconds")
            matrix = page.embedding_matrix(name)  # type: ignore[arg-type]
            lists = sum(
                sys.getsizeof(v) + 24 * len(v)
                for v in (getattr(h.embeddings, name) for h in pages["read"].hits if h.embeddings)
            )
            matrix_rows.append(
                [
                    f"embedding_matrix({name!r})",
                    "raw text" if state == "raw" else "lists (read)",
                    f"{seconds * 1000:.2f}",
                    "x".join(map(str, matrix.shape)),
                    f"{matrix.nbytes / 1e6:.1f}",
                    f"{lists / 1e6:.1f}",
                    fmt_ratio(ratio(seconds, base_big)),
                ]
            )
            results[f"matrix_{state}_{name}"] = {
                "seconds": seconds,
                "nbytes": matrix.nbytes,
                "lists": lists,
            }
    print_table(
        f"Embeddings of the {biggest}-hit page as one float32 matrix",
        ["call", "from", "ms", "shape", "matrix MB", "as list[float] MB", f"vs {BASELINE}"],
        matrix_rows,
    )

    big = results["sizes"][str(biggest)]["variants"]
    body_bytes = results["sizes"][str(biggest)]["body_bytes"]
    targets = Targets()
    targets.add(
        Target(
            f"SearchPage decode, no vector read, time vs msgspec untyped ({biggest} hits)",
            ratio(big[TYPED]["seconds"], big[BASELINE]["seconds"]),
            0.45,
            higher_is_better=False,
        )
    )
    targets.add(
        Target(
            f"SearchPage decode and every vector read, time vs msgspec untyped ({biggest} hits)",
            ratio(big[READ_ALL]["seconds"], big[BASELINE]["seconds"]),
            0.95,
            higher_is_better=False,
        )
    )
    targets.add(
        Target(
            f"memory held by a page no vector was read of, vs the answer's size ({biggest} hits)",
            ratio(big[TYPED]["held"], body_bytes),
            1.5,
            higher_is_better=False,
        )
    )
    targets.add(
        Target(
            f"SearchPage with every vector read, speed vs pydantic v2 ({biggest} hits)",
            ratio(big[PYDANTIC]["seconds"], big[READ_ALL]["seconds"]),
            1.7,
        )
    )
    gc_gain = ratio(big[GC_CLONE]["seconds"], big[EAGER]["seconds"])
    targets.print()
    print(
        f"gc=False effect ({biggest} hits): the gc=True eager clone decodes in "
        f"{fmt_ratio(gc_gain)} the time of the gc=False one, and holding the page adds "
        f"{big[GC_CLONE]['gc'] * 1000:.1f} ms to every full gc.collect() instead of "
        f"{big[EAGER]['gc'] * 1000:.1f} ms"
    )
    print()
    print_environment(command_line("decode", argv))
    results["targets"] = targets.as_json()
    results["empty_gc"] = empty_gc
    write_json(args.json, {"benchmark": "decode", **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
