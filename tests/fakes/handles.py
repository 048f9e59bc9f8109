"""Ray Serve handle stand-ins: `handle.method.remote(...)` runs the method in-process and is awaited, as a
DeploymentHandle's response is (an async method's result is awaited too, as Serve does in the replica)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


class RemoteMethod:
    """One method of a handle: `.remote(*args, **kwargs)` is an awaitable of `fn`'s result."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any):
        async def call() -> Any:
            result = self.fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return call()


class FakeHandle:
    """A handle over a replica object in this process: handle.method.remote(...) answers target.method(...)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> RemoteMethod:
        return RemoteMethod(getattr(self._target, name))
