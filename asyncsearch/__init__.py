"""asyncsearch: an asyncio-first client for the content search and extraction service.

>>> async with AsyncSearchClient(api_key="...", base_url="https://...") as client:
...     page = await client.search("quarterly report", page_size=20)

``__all__`` holds what a user calls, catches or annotates. Every Struct of the wire format
(the parts of a hit, of a job, ...) is in ``asyncsearch.models``; the generic machinery behind
the bulk methods (``fan_out``, ``FanOut``, ``Outcome``) is in ``asyncsearch.concurrency``.
"""

from __future__ import annotations

from ._call import APIResponse
from ._client import (
    AsyncSearchClient,
    ExtractionFailure,
    ExtractionResult,
    ExtractionResults,
    ExtractionSuccess,
    RawResponseClient,
    SearchCallParams,
)
from ._concurrency import RateLimit, RetryBudget
from ._config import OptionChanges, RequestOptions, RetryPolicy, SearchOptions, Timeout
from ._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncSearchError,
    AuthenticationError,
    BadRequestError,
    ClientClosedError,
    ConfigurationError,
    ConflictError,
    EventLoopMismatchError,
    InternalServerError,
    InvalidRequestError,
    KeyProviderError,
    MiddlewareError,
    NotFoundError,
    PermissionDeniedError,
    PoolTimeoutError,
    ProxyError,
    RateLimitError,
    ResponseTooLargeError,
    ResponseValidationError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from ._models import (
    IN_PROGRESS_JOB_STATES,
    ExtractionFormat,
    ExtractionJob,
    LeanSearchHit,
    LeanSearchPage,
    LinkPreview,
    LinkType,
    SearchFilters,
    SearchHit,
    SearchPage,
    SearchQuery,
    Sort,
    WebhookLog,
    WebhookLogSummary,
)
from ._paging import SearchPager
from ._protocol import SearchParams, image_data_url
from ._sync import SearchClient, SyncExtractionResults, SyncRawResponseClient, SyncSearchPager
from ._version import __version__

__all__ = [
    "IN_PROGRESS_JOB_STATES",
    "APIConnectionError",
    "APIResponse",
    "APIStatusError",
    "APITimeoutError",
    "AsyncSearchClient",
    "AsyncSearchError",
    "AuthenticationError",
    "BadRequestError",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "EventLoopMismatchError",
    "ExtractionFailure",
    "ExtractionFormat",
    "ExtractionJob",
    "ExtractionResult",
    "ExtractionResults",
    "ExtractionSuccess",
    "InternalServerError",
    "InvalidRequestError",
    "KeyProviderError",
    "LeanSearchHit",
    "LeanSearchPage",
    "LinkPreview",
    "LinkType",
    "MiddlewareError",
    "NotFoundError",
    "OptionChanges",
    "PermissionDeniedError",
    "PoolTimeoutError",
    "ProxyError",
    "RateLimit",
    "RateLimitError",
    "RawResponseClient",
    "RequestOptions",
    "ResponseTooLargeError",
    "ResponseValidationError",
    "RetryBudget",
    "RetryPolicy",
    "SearchCallParams",
    "SearchClient",
    "SearchFilters",
    "SearchHit",
    "SearchOptions",
    "SearchPage",
    "SearchPager",
    "SearchParams",
    "SearchQuery",
    "Sort",
    "SyncExtractionResults",
    "SyncRawResponseClient",
    "SyncSearchPager",
    "Timeout",
    "UnprocessableEntityError",
    "WaitTimeoutError",
    "WebhookLog",
    "WebhookLogSummary",
    "__version__",
    "image_data_url",
]
