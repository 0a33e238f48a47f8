"""Keep Python's cyclic garbage collector off the objects that live as long as the worker.

A ready worker holds torch, its models and its libraries: some 220,000 objects that are
never garbage. CPython's full collection walks every one of them once enough younger
objects have survived two collections, and at load every in-flight request does. On the
2-core bench machine a full collection ran every two to three seconds and stopped the
event loop and the compute thread for about 100 ms each time (docs/performance.md,
"Garbage collection"); frozen, they take 1-3 ms.

``gc.freeze()`` once the worker is ready moves the objects alive then into the
permanent generation, which no collection visits; everything made later is collected
as before, and memory is still freed by reference counting. What a frozen object can
no longer be is *cyclic* garbage: a model let go at run time (``--max-loaded-models``)
is therefore collected with everything thawed (:func:`collect_everything`).

The young generation's threshold goes up at the same moment (:data:`YOUNG_THRESHOLD`).
"""

from __future__ import annotations

import gc

#: Net new tracked objects before a young collection (CPython's default is 700). At load
#: most young objects belong to in-flight requests and are still alive, so each collection
#: walked them and promoted them, only for the next generation to walk them again. At
#: 10,000 the worker's young collections took 83-105 ms of a quick run instead of 333-526
#: ms, and each of three alternating pairs ran faster (docs/performance.md).
YOUNG_THRESHOLD = 10_000


def freeze_long_lived() -> int:
    """Collect what start-up left behind, freeze the rest and raise the young generation's
    threshold; returns how many objects were frozen (logged at "worker ready")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return gc.get_freeze_count()


def collect_everything() -> None:
    """A full collection that includes the frozen objects (a model dropped at run time may
    sit in a reference cycle among them), then freeze the survivors again."""
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
