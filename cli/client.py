"""The HTTP side of the client commands: where the stack is, which key to send, errors as one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx

URL_ENV, API_KEY_ENV, ADMIN_KEY_ENV = "POOLSERVE_URL", "POOLSERVE_API_KEY", "POOLSERVE_ADMIN_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 300.0  # an ingest of a large file embeds while the request is open
RETRIES = 3  # for 429 (a tenant limit) and 503 (the pool guard or a restarting replica), after Retry-After
MAX_RETRY_WAIT_S = 30.0


class ClientError(Exception):
    """A request that failed: the message says what and why, fit to print."""


def resolve_key(key_file: Path | None, env_name: str) -> str:
    """The key from --key-file, else from the environment; never from the command line (shell history)."""
    if key_file is not None:
        try:
            key = key_file.read_text().strip()
        except OSError as exc:
            raise ClientError(f"cannot read the key file {key_file}: {exc.strerror}") from None
        if not key:
            raise ClientError(f"the key file {key_file} is empty")
        return key
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise ClientError(f"no key: set {env_name} or pass --key-file")
    return key


def error_message(response: httpx.Response) -> str:
    try:
        detail = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        detail = response.text[:300]
    return f"{response.request.method} {response.request.url.path} answered {response.status_code}: {detail}"


class StackClient:
    def __init__(self, base_url: str, key: str, timeout_s: float = TIMEOUT_S):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> StackClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def request(self, method: str, path: str, ok_missing: bool = False, **kwargs) -> dict | None:
        """The JSON answer; None for a 404 when ok_missing; ClientError for anything else that failed."""
        response = self._send(method, path, **kwargs)
        if ok_missing and response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise ClientError(error_message(response))
        return response.json()

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        for attempt in range(RETRIES + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                raise ClientError(
                    f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}. Is the stack running, "
                    f"and is --base-url (or ${URL_ENV}) its address?"
                ) from None
            if response.status_code not in (429, 503) or attempt == RETRIES:
                return response
            time.sleep(_retry_after(response))
        raise AssertionError("unreachable")

    def stream_lines(self, path: str, body: dict):
        """POST with an NDJSON answer: yields each line's JSON; ClientError if the request is refused."""
        for attempt in range(RETRIES + 1):
            try:
                with self.http.stream("POST", path, json=body) as response:
                    if response.status_code in (429, 503) and attempt < RETRIES:
                        response.read()
                        time.sleep(_retry_after(response))
                        continue
                    if response.status_code >= 400:
                        response.read()
                        raise ClientError(error_message(response))
                    for line in response.iter_lines():
                        if line.strip():
                            yield json.loads(line)
                    return
            except httpx.HTTPError as exc:
                raise ClientError(f"{path}: {type(exc).__name__}: {exc}") from None


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(MAX_RETRY_WAIT_S, max(0.5, float(response.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0
