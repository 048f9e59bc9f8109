"""Retriever replica: thin Ray glue around rag.store.knowledge_store.KnowledgeStore (SQLite + FAISS + FTS5) and
rag.retrieval.search (dense, lexical or hybrid search, fused here so a query is one call)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ray import serve

from deployments.start_order import StartOrder
from planner.outputs import RetrieverSettings
from rag.retrieval.search import FusionSettings, SearchQuery, SearchResult, retrieve
from rag.store.capacity import Quotas, TenantQuota
from rag.store.knowledge_store import KnowledgeStore
from rag.store.refusals import refusing
from rag.store.store_schema import STORE_FILE
from system.process_memory import process_tree_memory, release_freed_heap

# Ray Serve's replica logger: a line here lands in the replica's log with the request's id.
logger = logging.getLogger("ray.serve")
# A missing collection or document, a malformed id or a full quota is the client's mistake: answered as a value
# (rag/store/refusals.py) and logged in one line, where an exception would log an ERROR with its traceback.
client_errors_answered = refusing(logger)


@serve.deployment(name="retriever")  # its options: the plan's (deployments/app.py)
class Retriever:
    async def __init__(self, settings: RetrieverSettings, start: StartOrder):
        import faiss

        await start.wait("retriever", serve.get_replica_context().app_name)
        os.umask(0o077)  # the chunk store and its -wal/-shm are the owner's only
        faiss.omp_set_num_threads(settings.faiss_threads)
        self.fusion = FusionSettings.model_validate(settings.fusion.model_dump())  # the profile's rag.fusion
        self.store = KnowledgeStore(
            Path(settings.state_dir) / STORE_FILE,
            dim=settings.dim,
            index_kind=settings.index_kind,
            hnsw_m=settings.hnsw_m,
            hnsw_ef_search=settings.hnsw_ef_search,
            capacity_chunks=settings.capacity_chunks,
            sqlite_cache_bytes=settings.sqlite_cache_bytes,
            quotas=_quotas(settings),
            rebuild_deleted_fraction=settings.hnsw_rebuild_deleted_fraction,
            index_save_interval_s=settings.index_save_interval_s,
            embedder=settings.embedder_model_id,
        )

    def __del__(self):
        # Serve calls this at shutdown: the changed indexes are saved, so the next start loads them.
        store = getattr(self, "store", None)
        if store is not None:
            store.close()

    @client_errors_answered
    def upsert_documents(self, tenant, collection, documents: list[tuple]) -> list[int]:
        """All of a request's documents in one transaction: an ingest is stored whole or not at all."""
        stored = self.store.upsert_documents(tenant, collection, documents)
        release_freed_heap(collect=False)  # the request's vectors and SQLite rows are garbage now
        return stored

    @client_errors_answered
    def delete_document(self, tenant: str, collection: str, doc_id: str) -> None:
        self.store.delete_document(tenant, collection, doc_id)

    @client_errors_answered
    def delete_collection(self, tenant: str, collection: str) -> None:
        self.store.delete_collection(tenant, collection)

    def delete_tenant(self, tenant: str) -> int:
        return self.store.delete_tenant(tenant)

    @client_errors_answered
    def list_collections(self, tenant: str) -> list[dict]:
        return self.store.list_collections(tenant)

    def all_collections(self) -> dict:
        return {"index": self.store.index_kind, "data": self.store.list_all_collections()}

    @client_errors_answered
    def collection_info(self, tenant: str, collection: str) -> dict:
        return self.store.collection_info(tenant, collection)

    @client_errors_answered
    def list_documents(self, tenant: str, collection: str, limit: int, after: str | None) -> dict:
        return self.store.list_documents(tenant, collection, limit, after)

    @client_errors_answered
    def search(self, tenant: str, collection: str, query: SearchQuery) -> SearchResult:
        return retrieve(self.store, tenant, collection, query, self.fusion)

    def stats(self) -> dict:
        return self.store.stats()

    def memory(self) -> dict:
        return process_tree_memory()

    def ready(self) -> bool:
        return True


def _quotas(settings: RetrieverSettings) -> Quotas:
    default = TenantQuota(settings.tenant_max_chunks, settings.tenant_max_documents)
    return Quotas(default, {name: TenantQuota(q.chunks, q.documents) for name, q in settings.tenant_quotas.items()})
