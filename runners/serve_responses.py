"""What `dilstore serve` answers, as OpenAPI schemas for `/docs` and `/openapi.json`.

The handlers build their JSON themselves (the `ask --json` document, a
rerank's results, `{"detail": ...}`), so these models only describe it: a
client generated from `/openapi.json` learns every field and every status a
query endpoint can send. Every model forbids unknown fields, so that the
tests that validate real responses against them fail when a field is added
or dropped without them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Described(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ValidationProblem(_Described):
    """One problem of a body that failed validation."""

    type: str = Field(description="pydantic's error type, e.g. missing, int_type, json_invalid")
    loc: list[str | int] = Field(description="where: 'body' and the field's path")
    msg: str


class ErrorBody(_Described):
    """Every error response: one message, or, for a body that failed validation, one entry per problem."""

    detail: str | list[ValidationProblem]


class AskSpan(_Described):
    """One n-best answer span; offsets count code points into its passage's text (without the title)."""

    text: str
    score: float = Field(description="mu * reader_score + (1 - mu) * bm25_score")
    passage_id: str
    reader_score: float
    bm25_score: float
    char_start: int
    char_end: int
    title: str


class AskPassage(_Described):
    """A passage the n-best comes from."""

    title: str
    text: str


class AskAnswer(_Described):
    """POST /ask: the object `dilstore ask --json` prints; the answer is "" and its scores null when no passage
    gave a span."""

    question: str
    answer: str
    score: float | None
    passage_id: str | None
    title: str | None
    reader_score: float | None
    bm25_score: float | None
    mu: float
    nbest: list[AskSpan]
    passages: dict[str, AskPassage] = Field(description="title and text of each passage of the n-best, by id")
    timings: dict[str, float] = Field(description="seconds of each stage of the batch the question was read in")
    encoding: str = Field(description="the store's encoding, what the states were read from")
    online_variant: str | None = Field(description="the online layers swapped in for the encoding, else null")


class RerankResult(_Described):
    """One scored document."""

    doc_id: str
    score: float
    bm25_score: float | None = Field(None, description="with bm25_top_k only")


class RerankAnswer(_Described):
    """POST /rerank: the documents best first, ties by doc_id descending, as `dilstore rerank` writes them."""

    query: str
    query_truncated: bool = Field(description="the ranker read only the query's first tokens")
    results: list[RerankResult]
    encoding: str


class Health(_Described):
    """GET /health: 200 once every store is loaded, 503 once a store became unavailable."""

    status: str = Field(description="ok, or unavailable")
    stores: list[str]
    problems: dict[str, str] | None = Field(None, description="with 503: why each unavailable store is")


HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "every store serves"},
    503: {"model": Health, "description": "a store became unavailable (its files changed under the server)"},
}
# GET /metrics sends Prometheus's text format, not JSON.
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text exposition"},
}


# The statuses a query endpoint answers besides 200, each with `{"detail": ...}` (README: serve, Errors).
_ERRORS = {
    400: "a store of the wrong kind, bm25_top_k without an index, or a request that is not HTTP",
    404: "an unknown store",
    408: "the body did not arrive within --request-timeout",
    413: "a body over 1 MiB",
    415: "a compressed body (Content-Encoding)",
    422: "a bad body: not JSON, a missing, mistyped or unknown field, a value out of range, an empty or over-long "
    "question or query, doc_ids the store lacks (a string), or the fields that failed validation (a list)",
    500: "a failure inside the model, for this request only",
    502: "a read of a store at a URL failed, for this request only",
    503: "a full queue (with Retry-After), a store that became unavailable, or a shutdown",
}


def query_responses(answer: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """FastAPI's `responses` for a query endpoint whose 200 body is `answer`."""
    errors: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": description} for status, description in _ERRORS.items()
    }
    return {200: {"model": answer, "description": answer.__doc__ or ""}, **errors}
