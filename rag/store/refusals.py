"""A client's mistake found in another replica, carried back as a value instead of an exception.

Ray Serve logs every exception a replica method raises as an ERROR with its whole traceback ("Request failed."),
then re-raises it in the caller. For a missing collection or a quota that is full, that is the client's ordinary
4xx, not a fault of the replica: five 404s made five tracebacks in the retriever's log (issue 46). So the
retriever returns a `Refused` holding the error (deployments/retriever.py), logs it in one line, and the gateway
raises it again where the call returns (gateway/retriever_calls.py), to be answered as the 4xx it is
(gateway/http_errors.py). Anything else still raises, traceback and all.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from rag.documents.ids import InvalidIdError
from rag.store.capacity import CapacityExceeded
from rag.store.knowledge_store import CollectionNotFound, DocumentNotFound

# The errors that are the caller's: each is answered with its 4xx (gateway/http_errors.py map_exception).
CLIENT_ERRORS: tuple[type[Exception], ...] = (CollectionNotFound, DocumentNotFound, CapacityExceeded, InvalidIdError)


@dataclass(frozen=True)
class Refused:
    """A replica method's answer when the request was the client's mistake: the error, to raise at the caller.
    The errors above take one message, so they pickle across Ray as they are."""

    error: Exception

    def describe(self) -> str:
        """One log line's worth: the error's class and message, no traceback."""
        return f"{type(self.error).__name__}: {self.error}"


def raise_refused(answer):
    """A replica's answer as it is, or its refusal raised here (a `Refused` is never returned)."""
    if isinstance(answer, Refused):
        raise answer.error
    return answer


def refusing(log: logging.Logger):
    """Decorator for a replica's methods: a client's mistake (CLIENT_ERRORS) is returned as a `Refused` and logged
    in one INFO line (the replica's logger adds the request id), never raised; any other error is raised."""

    def decorate(method):
        @functools.wraps(method)
        def answer(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except CLIENT_ERRORS as exc:
                refused = Refused(exc)
                log.info(
                    "%s refused (the client's mistake, answered as a 4xx): %s",
                    method.__name__,
                    refused.describe().replace("\n", " "),
                )
                return refused

        return answer

    return decorate
