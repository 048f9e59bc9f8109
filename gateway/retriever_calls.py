"""The retriever's handle as the gateway's routes call it: a refusal the retriever answers with (a client's
mistake, returned as a value so that its replica logs one line instead of a traceback: rag/store/refusals.py) is
raised again here, where the call returns, and answered as its 4xx by gateway/http_errors.py.

`RetrieverHandle` is a descriptor on the route mixins: whatever handle the Ray binding assigns to
`self._retriever` (deployments/gateway.py), the routes read it wrapped, so no call site can forget to unwrap.
"""

from __future__ import annotations

from rag.store.refusals import raise_refused


class _Method:
    def __init__(self, method):
        self._method = method

    def remote(self, *args, **kwargs):
        """Like the handle's `.remote()`: the call starts now; awaiting it gives the answer or raises the refusal."""
        response = self._method.remote(*args, **kwargs)

        async def answer():
            return raise_refused(await response)

        return answer()


class RefusalsRaised:
    """A replica handle whose answers are unwrapped by raise_refused."""

    def __init__(self, handle):
        self.handle = handle

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.handle, name))


class RetrieverHandle:
    """Data descriptor: assigning a handle stores it wrapped in RefusalsRaised."""

    def __set_name__(self, owner, name: str) -> None:
        self._slot = f"_{name.lstrip('_')}_wrapped"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        try:
            return obj.__dict__[self._slot]
        except KeyError:
            raise AttributeError("the retriever handle is not set yet") from None

    def __set__(self, obj, handle) -> None:
        obj.__dict__[self._slot] = handle if isinstance(handle, RefusalsRaised) else RefusalsRaised(handle)
