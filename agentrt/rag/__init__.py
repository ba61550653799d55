"""Retrieval-augmented generation: contents retrieved for a call are injected into the message the
model sees, and reported as `Result.sources` and a `Retrieved` event.

`Retrieval` configures it (at `build(retrieval=...)`, or per method or class with `@retrieval`):
retrievers run concurrently, their lists fused by rank (`reciprocal_rank_fusion`), the best injected
(`inject`). `retriever_tool` offers a retriever to the model as a tool instead.

Retrievers: `BM25Retriever` (bm25s), `EmbeddingRetriever` over an `InMemoryVectorIndex` or a
`SQLiteVectorIndex`; embedding adapters in `agentrt.rag.openai` and `agentrt.rag.ollama`. The
retrievers need the `rag` extra (bm25s, numpy), imported when one is made.
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
from ._embedding import Embeddings
from ._splitter import Document, Splitter
from ._sqlite_vectors import SQLiteVectorIndex
from ._tool import retriever_tool
from ._transformers import compressing_transformer, expanding_transformer
from ._types import Content, EmbeddingModel, Query, Retriever
from ._vectors import EmbeddingRetriever, InMemoryVectorIndex, VectorIndex
from .ollama import OllamaEmbeddingModel
from .openai import OpenAIEmbeddingModel

__all__ = [
    "DEFAULT_TEMPLATE",
    "Aggregator",
    "BM25Retriever",
    "Content",
    "Document",
    "EmbeddingModel",
    "EmbeddingRetriever",
    "Embeddings",
    "InMemoryVectorIndex",
    "Injector",
    "OllamaEmbeddingModel",
    "OpenAIEmbeddingModel",
    "Query",
    "QueryTransformer",
    "Retrieval",
    "Retriever",
    "Router",
    "SQLiteVectorIndex",
    "Skipped",
    "Splitter",
    "VectorIndex",
    "compressing_transformer",
    "expanding_transformer",
    "inject",
    "reciprocal_rank_fusion",
    "retrieval",
    "retriever_tool",
]
