"""Fresh request IDs: 128 random bits as 32 hex characters, cut from one ``os.urandom``
call per 256 IDs.

Why a pool: ``os.urandom(16).hex()`` per request is a system call each, 0.53 us against
0.22 from the pool (docs/performance.md), and a client makes one per request it submits.
The IDs stay as unguessable as before (the same kernel source, read in larger pieces).
The pool is a deque, whose ``popleft`` is atomic, so threads never share an ID (two that
refill at once only add more); a forked child empties its copy first, or it would hand
out the IDs its parent is about to.
"""

from __future__ import annotations

import collections
import os

#: IDs read from the kernel at a time.
POOL_SIZE = 256
_HEX = 32
_POOL: collections.deque[str] = collections.deque()


def new_request_id() -> str:
    """128 random bits as 32 hex characters: unguessable, as a UUID4 hex is (which it
    replaced), at a tenth of its CPU; one per request submitted."""
    try:
        return _POOL.popleft()
    except IndexError:
        block = os.urandom(POOL_SIZE * _HEX // 2).hex()
        _POOL.extend(block[i:i + _HEX] for i in range(_HEX, len(block), _HEX))
        return block[:_HEX]


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_POOL.clear)
