"""How the worker's torch threads wait, chosen before torch loads OpenMP.

libgomp (the OpenMP runtime of torch's CPU builds on Linux) reads its settings once, when
torch is imported, so the worker's entry point applies these first. A thread of a
parallel torch op that waits at a barrier spins ``SPIN_COUNT`` times (about 0.1 ms) and
then sleeps: inside a forward the wait is usually shorter and the spin saves a sleep and
a wake-up (a large model's forward crosses a barrier about 135 times); between batches
the thread sleeps instead of spinning on the cores the event loop, Redis and the callers
need (small models). docs/performance.md, "One OpenMP pool", measures both.

A process holding more OpenMP threads than cores never spins longer than libgomp's
throttled count, whatever these say: the worker builds its models on the compute thread
(``workers.compute.compute_pool``) so that one pool is all it holds.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Iterations a waiting OpenMP thread spins before it sleeps (libgomp's GOMP_SPINCOUNT).
SPIN_COUNT = 10_000


def openmp_defaults(environ: Mapping[str, str], torch_threads: int | None) -> dict[str, str]:
    """The variables to add to ``environ`` for a worker: what the operator set stays, and
    a wait policy of their own keeps its own spin count."""
    out: dict[str, str] = {}
    if "OMP_WAIT_POLICY" not in environ:
        out["OMP_WAIT_POLICY"] = "PASSIVE"
        if "GOMP_SPINCOUNT" not in environ:
            out["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    if torch_threads is not None:
        out["OMP_NUM_THREADS"] = str(torch_threads)
    return out
