"""The HTTP side of `poolserve stress`: the admin API (tenants, keys, /status) and one call per route,
each timed and classified the way the layers judge it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

# 429 (a tenant's limit) and 503 (shed by the pool guard, or a replica restarting) are answers the
# gateway means to give under load; anything else that is not 2xx counts as an error.
INTENDED = (429, 503)
FACTS = [
    "The Quorvex lighthouse on Brisa Island was built by Admiral Tovin Selk in 1874.",
    "The Velmora bridge spans the Istra river and was opened in 1962 by mayor Ana Kovac.",
    "Copper is used in electrical wiring, plumbing pipes and roofing.",
    "The Harlan observatory keeps a 2.4 metre telescope on Mount Eskel.",
    "Basil grows best in warm soil with six hours of sun a day.",
    "The Tarn express train runs from Odrin to Vessa in three hours and ten minutes.",
]
QUESTIONS = [
    "Who built the Quorvex lighthouse?",
    "When was the Velmora bridge opened?",
    "What is copper used for?",
    "How large is the Harlan telescope?",
]


@dataclass(frozen=True)
class Outcome:
    route: str
    status: int | None  # None: no HTTP answer (timeout or connection error)
    seconds: float
    kind: str  # ok | intended | timeout | error
    detail: str = ""
    started: float = 0.0


def timed(
    route: str, call: Callable[[], httpx.Response], check: Callable[[httpx.Response], str] | None = None
) -> Outcome:
    """Run one request; a 2xx whose body fails `check` (returns a reason) is an error too."""
    started = time.monotonic()
    try:
        response = call()
    except httpx.TimeoutException as exc:
        return Outcome(route, None, time.monotonic() - started, "timeout", type(exc).__name__, started)
    except httpx.HTTPError as exc:
        return Outcome(route, None, time.monotonic() - started, "error", f"{type(exc).__name__}: {exc}", started)
    seconds = time.monotonic() - started
    if response.status_code in INTENDED:
        return Outcome(route, response.status_code, seconds, "intended", "", started)
    if not 200 <= response.status_code < 300:
        return Outcome(route, response.status_code, seconds, "error", response.text[:200], started)
    problem = check(response) if check else ""
    return Outcome(route, response.status_code, seconds, "error" if problem else "ok", problem, started)


def _has_choice(response: httpx.Response) -> str:
    body = response.json()
    return "" if body.get("choices") and body.get("usage") else "answer without choices or usage"


def _has_answer(response: httpx.Response) -> str:
    return "" if "answer" in response.json() else "RAG answer without 'answer'"


def _has_vectors(response: httpx.Response) -> str:
    return "" if response.json().get("data") else "embeddings without data"


class Gateway:
    """One tenant's (or the admin's) view of the gateway."""

    def __init__(self, base_url: str, key: str, timeout_s: float, chat_model: str, embed_model: str, tenant: str = ""):
        self.base_url, self.tenant = base_url.rstrip("/"), tenant
        self.chat_model, self.embed_model = chat_model, embed_model
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(timeout_s, connect=10.0),
        )

    def close(self) -> None:
        self.http.close()

    def chat(self, content: str, max_tokens: int = 16) -> Outcome:
        body = {
            "model": self.chat_model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        return timed("chat", lambda: self.http.post("/v1/chat/completions", json=body), _has_choice)

    def rag(self, collection: str, question: str, max_tokens: int = 24) -> Outcome:
        body = {"collection": collection, "question": question, "top_k": 2, "max_tokens": max_tokens}
        return timed("rag", lambda: self.http.post("/v1/rag/query", json=body), _has_answer)

    def embed(self, text: str) -> Outcome:
        body = {"model": self.embed_model, "input": text}
        return timed("embeddings", lambda: self.http.post("/v1/embeddings", json=body), _has_vectors)

    def ingest(self, collection: str, documents: list[dict]) -> Outcome:
        return timed(
            "ingest", lambda: self.http.post(f"/v1/collections/{collection}/documents", json={"documents": documents})
        )

    def document_ids(self, collection: str) -> set[str]:
        ids, params = set(), {}
        while True:
            response = self.http.get(f"/v1/collections/{collection}/documents", params=params)
            response.raise_for_status()
            page = response.json()
            ids.update(doc["id"] for doc in page["data"])
            if not page["has_more"]:
                return ids
            params = {"after": page["last_id"]}


class Admin:
    """The admin key's calls: tenants and keys (real ones, removed afterwards), /status, /healthz."""

    def __init__(self, base_url: str, admin_key: str, timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=httpx.Timeout(timeout_s, connect=10.0),
        )
        self.created: list[str] = []

    def close(self) -> None:
        self.http.close()

    def create_tenant(self, name: str) -> str:
        response = self.http.post("/admin/tenants", json={"name": name})
        if response.status_code != 201:
            raise RuntimeError(f"POST /admin/tenants {name!r} answered {response.status_code}: {response.text[:200]}")
        self.created.append(name)
        return response.json()["api_key"]

    def create_key(self, tenant: str) -> str:
        response = self.http.post(f"/admin/tenants/{tenant}/keys")
        response.raise_for_status()
        return response.json()["api_key"]

    def delete_created(self) -> list[str]:
        """Remove every tenant this run created (their keys and documents go with them); returns failures."""
        failed = []
        for name in list(self.created):
            try:
                response = self.http.delete(f"/admin/tenants/{name}")
                if response.status_code in (200, 404):
                    self.created.remove(name)
                    continue
                failed.append(f"{name}: {response.status_code}")
            except httpx.HTTPError as exc:
                failed.append(f"{name}: {type(exc).__name__}")
        return failed

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz", timeout=10.0).status_code == 200
        except httpx.HTTPError:
            return False

    def reachable(self, timeout_s: float = 90.0) -> bool:
        """/healthz answers 200 within timeout_s. A 429 (this address over its keyless minute, e.g. after a
        flood from the same host) is waited out as its Retry-After says; anything else answers at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer = self.http.get("/healthz", timeout=10.0)
            except httpx.HTTPError:
                return False
            if answer.status_code != 429 or time.monotonic() >= deadline:
                return answer.status_code == 200
            time.sleep(min(10.0, float(answer.headers.get("retry-after", "5")), max(0.0, deadline - time.monotonic())))

    def status(self) -> dict:
        response = self.http.get("/status")
        response.raise_for_status()
        return response.json()

    def replica_growth_budgets(self) -> dict[str, int]:
        """Per replica, what its plan lets it grow by under traffic: its budget minus its at-rest bytes
        (/status planned_bytes - planned_at_rest_bytes); replicas /status gives no plan for are left out."""
        budgets = {}
        for r in self.status().get("replicas", []):
            budget, at_rest = r.get("planned_bytes"), r.get("planned_at_rest_bytes")
            if budget and at_rest is not None:
                budgets[r["name"]] = max(0, int(budget) - int(at_rest))
        return budgets

    def replica_memory(self) -> dict[str, int]:
        """Measured PSS per replica (its whole process tree), as /status reports it."""
        return {
            r["name"]: int(r["measured_bytes"]) for r in self.status().get("replicas", []) if r.get("measured_bytes")
        }

    def wait_healthy(self, since: float, timeout_s: float, settle_s: float = 3.0) -> float | None:
        """Seconds from `since` until /healthz answers 200 (after the gateway's 2 s health cache has
        passed), or None after timeout_s."""
        time.sleep(settle_s)
        while time.monotonic() - since < timeout_s:
            if self.healthy():
                return time.monotonic() - since
            time.sleep(1.0)
        return None
