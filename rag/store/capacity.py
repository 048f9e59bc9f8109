"""What the knowledge store may hold: the plan's global capacity, and each tenant's own quota.

retriever.capacity_chunks is the figure the retriever's memory was planned for, shared by every
tenant. A tenant's quota (retriever.tenant_max_chunks / tenant_max_documents, overridden per
tenant in retriever.tenant_quotas) refuses first, so one tenant cannot fill the store; and every
refusal names only the asking tenant's own figures, never what the others hold.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field


class CapacityExceeded(ValueError):
    """An ingest would take a tenant past its quota, or the index past its planned capacity (413)."""


@dataclass(frozen=True)
class TenantQuota:
    chunks: int | None = None  # None: no quota of its own (the global capacity still applies)
    documents: int | None = None


@dataclass(frozen=True)
class Quotas:
    default: TenantQuota = TenantQuota()
    tenants: dict[str, TenantQuota] = field(default_factory=dict)

    def of(self, tenant: str) -> TenantQuota:
        return self.tenants.get(tenant, self.default)


def tenant_usage(db: sqlite3.Connection, tenant: str) -> tuple[int, int]:
    """(documents, chunks) the tenant stores, over every collection (a covering index: no metadata read)."""
    documents, chunks = db.execute(
        "SELECT count(*), COALESCE(SUM(chunk_count), 0) FROM documents WHERE tenant=?", (tenant,)
    ).fetchone()
    return documents, chunks


def check_capacity(
    db: sqlite3.Connection,
    tenant: str,
    collection: str,
    documents: list[tuple],
    quota: TenantQuota,
    held_total: int,
    capacity: int | None,
) -> None:
    """Raise CapacityExceeded if storing `documents` (each (doc_id, chunks, ...), replacing those of the
    same id) would pass the tenant's quota or the store's capacity."""
    replaced_docs, replaced_chunks = 0, 0
    for doc_id in {doc[0] for doc in documents}:
        row = db.execute(
            "SELECT chunk_count FROM documents WHERE tenant=? AND collection=? AND doc_id=?",
            (tenant, collection, doc_id),
        ).fetchone()
        if row:
            replaced_docs, replaced_chunks = replaced_docs + 1, replaced_chunks + row[0]
    final = {doc[0]: len(doc[1]) for doc in documents}  # the last of a repeated id is what stays
    adding_docs, adding_chunks = len(final), sum(final.values())
    held_docs, held_chunks = tenant_usage(db, tenant)
    advice = "Delete documents or ask the operator for a larger quota"
    if quota.chunks is not None and held_chunks - replaced_chunks + adding_chunks > quota.chunks:
        raise CapacityExceeded(
            f"this tenant stores {held_chunks:,} chunks of its quota of {quota.chunks:,}; this ingest adds "
            f"{adding_chunks:,} (replacing {replaced_chunks:,}). {advice}"
        )
    if quota.documents is not None and held_docs - replaced_docs + adding_docs > quota.documents:
        raise CapacityExceeded(
            f"this tenant stores {held_docs:,} documents of its quota of {quota.documents:,}; this ingest adds "
            f"{adding_docs - replaced_docs:,} new ones. {advice}"
        )
    if capacity is not None and held_total - replaced_chunks + adding_chunks > capacity:
        raise CapacityExceeded(
            f"the knowledge store has no room for this ingest's {adding_chunks:,} chunks: the server is at the "
            f"capacity its memory is planned for (this tenant stores {held_chunks:,} chunks). Delete documents "
            "or ask the operator to re-plan with a larger retriever.capacity_chunks"
        )
