"""The public surface: a complete, sorted ``__all__``, and a light ``import asyncsearch``."""

from __future__ import annotations
import __future__

import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import msgspec
import pytest

import asyncsearch
import asyncsearch.concurrency
import asyncsearch.models


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions and dunders.
    if name.isupper():
        return (0, name)
    if name[0].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted_and_unique() -> None:
    assert asyncsearch.__all__ == sorted(asyncsearch.__all__, key=_isort_key)
    assert len(set(asyncsearch.__all__)) == len(asyncsearch.__all__)


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(asyncsearch).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert public | {"__version__"} == set(asyncsearch.__all__)
    for name in asyncsearch.__all__:
        assert hasattr(asyncsearch, name)


# Adding a name here is a decision: every one stays stable once published. What a user calls,
# catches or annotates belongs here; the parts of a response are in asyncsearch.models and the
# generic machinery in asyncsearch.concurrency.
PUBLIC_NAMES = {
    "IN_PROGRESS_JOB_STATES",
    # the client and what its methods return
    "AsyncSearchClient",
    "APIResponse",
    "RawResponseClient",
    "SearchPager",
    "ExtractionResult",
    "ExtractionSuccess",
    "ExtractionFailure",
    "ExtractionResults",
    # the blocking client and what its methods return (issue 46)
    "SearchClient",
    "SyncSearchPager",
    "SyncExtractionResults",
    "SyncRawResponseClient",
    # options
    "Timeout",
    "RetryBudget",
    "RateLimit",
    "RetryPolicy",
    "RequestOptions",
    "SearchOptions",
    "OptionChanges",
    # errors
    "AsyncSearchError",
    "APIConnectionError",
    "APITimeoutError",
    "PoolTimeoutError",
    "ProxyError",
    "APIStatusError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "RateLimitError",
    "InternalServerError",
    "ResponseValidationError",
    "ResponseTooLargeError",
    "InvalidRequestError",
    "MiddlewareError",
    "KeyProviderError",
    "ConfigurationError",
    "ClientClosedError",
    "EventLoopMismatchError",
    "WaitTimeoutError",
    # the models a caller meets first, and the search arguments
    "SearchPage",
    "SearchHit",
    "LeanSearchPage",
    "LeanSearchHit",
    "ExtractionJob",
    "LinkPreview",
    "WebhookLogSummary",
    "WebhookLog",
    "SearchFilters",
    "SearchQuery",
    "Sort",
    "SearchParams",
    "SearchCallParams",
    # the closed value sets
    "ExtractionFormat",
    "LinkType",
    # functions
    "image_data_url",
    "__version__",
}


def test_public_names_are_pinned() -> None:
    assert set(asyncsearch.__all__) == PUBLIC_NAMES
    # About 50: the 21 errors are most of it (RetryPolicy, for issue 29, is the 50th; issue 38
    # added EventLoopMismatchError, which names what happened, and SearchCallParams, the one
    # TypedDict a wrapper of search needs; issue 37 MiddlewareError; issue 40 RateLimit, the
    # client-side limit of requests per second; issue 45 ProxyError and KeyProviderError, whose
    # failures a bulk call stops on; issue 46 the blocking SearchClient and its three blocking
    # types).
    assert len(PUBLIC_NAMES) <= 60


def _structs_reachable_from(roots: list[type]) -> set[type]:
    """Every Struct type a caller can meet in the fields of ``roots``, recursively."""
    seen: set[type] = set()
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack = list(typing.get_type_hints(cls).values())
        while stack:
            hint = stack.pop()
            if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
                todo.append(hint)
            stack.extend(typing.get_args(hint))
    return seen


def test_models_module_holds_every_wire_struct_a_caller_meets() -> None:
    public_structs = [
        value
        for name in asyncsearch.__all__
        if isinstance(value := getattr(asyncsearch, name), type)
        and issubclass(value, msgspec.Struct)
    ]
    reachable = {cls.__name__ for cls in _structs_reachable_from(public_structs)}
    # The results of the bulk calls are Structs too, but the client's values, not wire shapes:
    # they live at the top level only. What they hold (ExtractionJob) is a wire shape.
    assert {"ExtractionSuccess", "ExtractionFailure", "ExtractionJob"} <= reachable
    reachable -= {"ExtractionSuccess", "ExtractionFailure"}
    # Every part of a response or request a caller can hold is nameable from asyncsearch.models
    # (internal envelopes and views the client decodes itself need not be).
    assert reachable <= set(asyncsearch.models.__all__), reachable - set(asyncsearch.models.__all__)
    assert {"SearchChunk", "ExtractionMedia", "ImageDescriptor", "User"} <= reachable
    for name in asyncsearch.models.__all__:
        assert getattr(asyncsearch.models, name) is getattr(asyncsearch._models, name)
    # Everything public at the top level that is a model is the same object here.
    for name in asyncsearch.__all__:
        if name in asyncsearch.models.__all__:
            assert getattr(asyncsearch, name) is getattr(asyncsearch.models, name)


def test_concurrency_module_holds_the_generic_machinery() -> None:
    # What a user needs, and nothing else: the limiter and the page walker are the client's
    # machinery, private.
    assert set(asyncsearch.concurrency.__all__) == {"FanOut", "Outcome", "RetryBudget", "fan_out"}
    assert not hasattr(asyncsearch.concurrency, "AdaptiveConcurrency")
    assert not hasattr(asyncsearch.concurrency, "Pager")
    for name in asyncsearch.concurrency.__all__:
        assert getattr(asyncsearch.concurrency, name) is getattr(asyncsearch._concurrency, name)


def test_error_tree() -> None:
    assert issubclass(asyncsearch.APITimeoutError, asyncsearch.APIConnectionError)
    assert issubclass(asyncsearch.PoolTimeoutError, asyncsearch.APITimeoutError)
    for status_error in (
        asyncsearch.BadRequestError,
        asyncsearch.AuthenticationError,
        asyncsearch.PermissionDeniedError,
        asyncsearch.NotFoundError,
        asyncsearch.ConflictError,
        asyncsearch.UnprocessableEntityError,
        asyncsearch.RateLimitError,
        asyncsearch.InternalServerError,
    ):
        assert issubclass(status_error, asyncsearch.APIStatusError)
    for name in asyncsearch.__all__:
        value = getattr(asyncsearch, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, asyncsearch.AsyncSearchError), name
    assert issubclass(asyncsearch.InvalidRequestError, ValueError)
    assert issubclass(asyncsearch.ConfigurationError, ValueError)
    assert issubclass(asyncsearch.ClientClosedError, RuntimeError)
    assert issubclass(asyncsearch.WaitTimeoutError, TimeoutError)


def test_import_stays_light() -> None:
    code = (
        "import sys, asyncsearch; "
        "heavy = [m for m in ('numpy', 'asyncsearch.testing', 'asyncsearch._cli', 'rich', "
        "'asyncsearch.ray', 'ray', 'pyarrow') "
        "if m in sys.modules]; print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_the_public_names_table_of_the_docs_lists_exactly_all() -> None:
    root = Path(asyncsearch.__file__).resolve().parent.parent
    page = (root / "docs" / "reference" / "index.md").read_text()
    section = page.split("\n## Public names\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    listed = [name for row in rows for name in re.findall(r"`([\w.]+)`", row.split("|")[2])]
    assert sorted(listed) == sorted(asyncsearch.__all__)


def test_only_the_transport_imports_aiohttp_in_the_core() -> None:
    """STYLE.md's one I/O seam: below the edges, aiohttp is imported by _transport.py alone
    (elsewhere at most under ``TYPE_CHECKING``, for annotations)."""
    import ast

    package = Path(asyncsearch.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        if path.name == "_transport.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: an `if TYPE_CHECKING:` body is not executed
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            if any(name == "aiohttp" or name.startswith("aiohttp.") for name in names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_a_session_that_is_not_an_aiohttp_session_is_refused() -> None:
    with pytest.raises(asyncsearch.ConfigurationError, match=r"aiohttp\.ClientSession"):
        asyncsearch.AsyncSearchClient(
            api_key="k",
            base_url="http://127.0.0.1:1",
            session=object(),  # type: ignore[arg-type]
        )


def test_install_hints_work_from_a_checkout() -> None:
    # Issue 27: the hints said pip install 'asyncsearch[cli]', while asyncsearch is not on the
    # index (README): every message names the extra as a checkout installs it.
    from asyncsearch._errors import install_hint

    assert install_hint("arrow") == "pip install -e '.[arrow]' in a checkout of asyncsearch"
    package = Path(asyncsearch.__file__).resolve().parent
    offenders = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"pip install '?asyncsearch\[", line)
    ]
    assert offenders == []


def test_help_shows_no_private_names_and_documents_the_result_union() -> None:
    # Issue 27: help(ExtractionResult) printed "Represent a PEP 604 union type", and help() of
    # the client showed `Unpack[_OptionChanges]` and APIResponse a `secret=''` parameter.
    import pydoc

    union = pydoc.render_doc(asyncsearch.ExtractionResult, renderer=pydoc.plaintext)
    assert "The outcome of fetching one extraction job in a bulk call" in union
    assert "PEP 604" not in union
    for name in asyncsearch.__all__:
        value = getattr(asyncsearch, name)
        if not callable(value):
            continue  # __version__, IN_PROGRESS_JOB_STATES
        text = pydoc.render_doc(value, renderer=pydoc.plaintext)
        assert not re.search(r"\[_[A-Za-z]|secret=", text), name
