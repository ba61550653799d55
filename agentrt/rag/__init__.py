"""Retrieval-augmented generation: contents retrieved for a call are injected into the message the
model sees, and reported as `Result.sources` and a `Retrieved` event.

`Retrieval` configures it (at `build(retrieval=...)`, or per method or class with `@retrieval`):
retrievers run concurrently, their lists fused by rank (`reciprocal_rank_fusion`), the best injected
(`inject`). `retriever_tool` offers a retriever to the model as a tool instead.
"""

from __future__ import annotations

from ._augment import (
    DEFAULT_TEMPLATE,
    Aggregator,
    Injector,
    QueryTransformer,
    Retrieval,
    Router,
    Skipped,
    inject,
    reciprocal_rank_fusion,
    retrieval,
)
from ._bm25 import BM25Retriever
from ._splitter import Document, Splitter
from ._tool import retriever_tool
from ._transformers import compressing_transformer, expanding_transformer
from ._types import Content, EmbeddingModel, Query, Retriever

__all__ = [
    "DEFAULT_TEMPLATE",
    "Aggregator",
    "BM25Retriever",
    "Content",
    "Document",
    "EmbeddingModel",
    "Injector",
    "Query",
    "QueryTransformer",
    "Retrieval",
    "Retriever",
    "Router",
    "Skipped",
    "Splitter",
    "compressing_transformer",
    "expanding_transformer",
    "inject",
    "reciprocal_rank_fusion",
    "retrieval",
    "retriever_tool",
]
