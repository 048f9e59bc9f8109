"""One collection's FAISS index: exact (Flat) or HNSW, with soft deletes, saved to and loaded from a file.

HNSW cannot remove a vector, and rebuilding the graph for every replaced document costs the whole
collection's build time. So removed ids are marked deleted (tombstones) and filtered out of every
search; the store rebuilds the index from SQLite once the deleted fraction passes the profile's
threshold (retriever.hnsw_rebuild_deleted_fraction). Flat indexes remove ids directly (cheap).

The file holds the index as faiss.write_index writes it. It is only a cache of SQLite: `reconcile`
compares its ids with the chunk rows (chunk ids are AUTOINCREMENT, never reused, so equal id sets
mean equal vectors), marks the ids SQLite no longer has deleted and adds the rows it lacks.
"""

from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np


class CollectionIndex:
    def __init__(self, dim: int, kind: str, hnsw_m: int, ef_search: int, index: faiss.Index | None = None):
        self.dim, self.kind, self.hnsw_m, self.ef_search = dim, kind, hnsw_m, ef_search
        self.index = index if index is not None else self._new()
        self.deleted: set[int] = set()
        self._not_deleted: faiss.IDSelector | None = None  # cached selector; None when it must be rebuilt

    def _new(self) -> faiss.Index:
        if self.kind == "hnsw":
            inner = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = self.ef_search
        else:
            inner = faiss.IndexFlatIP(self.dim)
        return faiss.IndexIDMap2(inner)

    # ---- contents ----------------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Vectors a search can return: stored minus deleted."""
        return self.index.ntotal - len(self.deleted)

    def deleted_fraction(self) -> float:
        return len(self.deleted) / self.index.ntotal if self.index.ntotal else 0.0

    def ids(self) -> np.ndarray:
        return faiss.vector_to_array(self.index.id_map).astype(np.int64)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            self.index.add_with_ids(vectors, ids)

    def remove(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.kind == "hnsw":
            self.deleted.update(int(i) for i in ids)
            self._not_deleted = None
        else:
            self.index.remove_ids(np.array(ids, dtype=np.int64))

    # ---- search ------------------------------------------------------------------------------
    def _params(self, selector: faiss.IDSelector | None, k: int):
        if selector is None:
            return None
        if self.kind == "hnsw":
            return faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.ef_search, k))
        return faiss.SearchParameters(sel=selector)

    def search(self, query: np.ndarray, top_k: int) -> list[tuple[int, float]]:
        """(id, score) of the top_k live vectors, best first."""
        k = min(top_k, self.live)
        if k <= 0:
            return []
        selector = None
        if self.deleted:
            if self._not_deleted is None:
                batch = faiss.IDSelectorBatch(np.fromiter(self.deleted, dtype=np.int64, count=len(self.deleted)))
                self._not_deleted = faiss.IDSelectorNot(batch)
                self._not_deleted.referenced = batch  # the Not selector points at it: keep it alive
            selector = self._not_deleted
        scores, ids = self.index.search(query, k, params=self._params(selector, k))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def search_among(self, query: np.ndarray, allowed: np.ndarray, top_k: int) -> list[tuple[int, float]]:
        """The top_k of the allowed ids (live ones, from SQLite), searched inside FAISS (an ID selector), so
        a filter that matches few chunks still gets top_k of them."""
        if not len(allowed):
            return []
        wanted = min(top_k, len(allowed))
        selector = faiss.IDSelectorBatch(allowed)
        scores, ids = self.index.search(query, wanted, params=self._params(selector, wanted))
        hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        if len(hits) < wanted:  # HNSW's graph walk can miss sparse matches: score them all exactly
            vectors = np.vstack([self.index.reconstruct(int(i)) for i in allowed])
            scores = vectors @ query[0]
            order = np.argsort(-scores, kind="stable")[:wanted]
            hits = [(int(allowed[i]), float(scores[i])) for i in order]
        return hits

    # ---- files -------------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Write the index atomically (a crash leaves the old file or the new one, never half of one)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        faiss.write_index(self.index, str(partial))
        os.replace(partial, path)

    @classmethod
    def load(cls, path: Path, dim: int, kind: str, hnsw_m: int, ef_search: int) -> CollectionIndex | None:
        """The saved index if it is one this configuration would build; None if absent, unreadable or another kind."""
        if not path.exists():
            return None
        try:
            index = faiss.read_index(str(path))
        except RuntimeError:
            return None
        if not isinstance(index, faiss.IndexIDMap2) or index.d != dim:
            return None
        inner = faiss.downcast_index(index.index)
        if kind == "hnsw":
            if not isinstance(inner, faiss.IndexHNSWFlat) or inner.hnsw.nb_neighbors(1) != hnsw_m:
                return None
            inner.hnsw.efSearch = ef_search  # a search setting, not part of the graph: the profile's wins
        elif not isinstance(inner, faiss.IndexFlatIP):
            return None
        return cls(dim, kind, hnsw_m, ef_search, index)

    def reconcile(self, stored_ids: np.ndarray) -> np.ndarray:
        """Bring a loaded index in line with SQLite's chunk ids: ids SQLite no longer has are removed
        (marked deleted on HNSW); returns the stored ids the index lacks, for the caller to add."""
        held = self.ids()
        self.remove(np.setdiff1d(held, stored_ids, assume_unique=True).tolist())
        return np.setdiff1d(stored_ids, held, assume_unique=True)
