"""What `dilstore serve` takes in: its two query endpoints' paths and JSON bodies, and the error of a request it
refuses.

A body must be JSON of the declared fields' exact types (pydantic, strict);
FastAPI turns a failed validation into a 422 (runners/serve_app.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dilstore.storage.messages import listed

ASK, RERANK = "/ask", "/rerank"


class ClientError(Exception):
    """A request the server refuses with a 4xx `status` and a message (502, 503: the store could not be read)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestBody(BaseModel):
    """A request body: JSON of the declared fields' exact types, refused with one error however many items are
    wrong. pydantic builds one error per unknown key or wrongly typed list item, on the event loop: a 1 MB body of
    100,000 such items stalled every request for seconds and came back as a 47 MB 422."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and (unknown := [key for key in data if key not in cls.model_fields]):
            raise ValueError(f"unknown field(s) {listed(unknown)}; the fields are {', '.join(cls.model_fields)}")
        return data


class AskRequest(RequestBody):
    """POST /ask: one question; top_p and mu default to those of `dilstore ask`."""

    question: str = Field(description="the question; empty or over-long questions are refused")
    top_p: int | None = Field(None, ge=1, description="passages retrieved with BM25 (default 29)")
    mu: float | None = Field(None, ge=0.0, le=1.0, description="score = mu * reader + (1 - mu) * BM25 (default 0.5)")
    store: str | None = Field(None, description="store name (default: the first dilbert store)")


class RerankRequest(RequestBody):
    """POST /rerank: a query and either the documents to score or how many BM25 hits to score."""

    query: str = Field(description="the query; empty queries are refused")
    doc_ids: list[str] | None = Field(None, min_length=1, description="ids of stored documents to score")
    bm25_top_k: int | None = Field(None, ge=1, description="score BM25's top k (the store needs a BM25 index)")
    store: str | None = Field(None, description="store name (default: the first EARL or Listformer store)")

    @field_validator("doc_ids", mode="before")
    @classmethod
    def _string_ids(cls, value: Any) -> Any:
        listed_ids = value if isinstance(value, list) else []
        if wrong := [index for index, item in enumerate(listed_ids) if not isinstance(item, str)]:
            first = value[wrong[0]]
            raise ValueError(f"doc_ids must be strings; {len(wrong)} of the {len(value)} are not, the first at index "
                             f"{wrong[0]}: {type(first).__name__} {listed([first], quoted=False)}")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _one_source(self) -> RerankRequest:
        if (self.doc_ids is None) == (self.bm25_top_k is None):
            raise ValueError("give exactly one of doc_ids and bm25_top_k")
        return self
