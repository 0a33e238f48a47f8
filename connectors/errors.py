"""Driver errors become project errors here, at the boundary, and nowhere else.

Everything above ``connectors`` catches only :class:`BatchfleetError` subclasses,
so a new store or broker changes no ``except`` clause in workers or producers.
:func:`wrap_errors` is both a context manager and a decorator of coroutines:

    @wrap_errors(ResultStoreError, "cannot read the retry schedule")
    async def size(self) -> int: ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import OutOfMemoryError, RedisError

from batchfleet.schemas.errors import BatchfleetError

P = ParamSpec("P")
T = TypeVar("T")

#: What a driver raises when its server fails or cannot be reached. OSError covers a
#: socket refused before the driver wraps it; project errors pass through untouched.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)


class wrap_errors:
    """Re-raise a driver error as ``error(f"{doing}: {exc}")``, chained to the original."""

    def __init__(self, error: type[BatchfleetError], doing: str) -> None:
        self._error = error
        self._doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, DRIVER_ERRORS) \
                and not isinstance(exc, BatchfleetError):
            raise self._error(f"{self._doing}: {exc or type(exc).__name__}") from exc

    def __call__(self, func: Callable[P, Coroutine[Any, Any, T]]
                 ) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(func)
        async def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
            with self:
                return await func(*args, **kwargs)
        return wrapped


def store_full(exc: BaseException) -> bool:
    """Whether a project error was caused by the store refusing writes at its memory limit
    (Redis ``maxmemory``): overload, not failure."""
    return isinstance(exc.__cause__, OutOfMemoryError) or "maxmemory" in str(exc)
