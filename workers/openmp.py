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
(``workers.compute.compute_pool``) so that one pool is all it holds, and the other threads
that may run parallel torch ops (preprocess, the shadow, containment's aside) free theirs
after each use (:func:`release_thread_pool`).
"""

from __future__ import annotations

import ctypes
import functools
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


#: ``omp_pause_soft`` (OpenMP 5.0): the calling thread's pool is freed; its threads exit.
_PAUSE_SOFT = 1


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """libgomp as torch loaded it, or None where torch uses another OpenMP runtime (or
    none). torch's Linux wheels bundle their own copy, so its path is read from the
    process's memory map; loading it again returns the copy already loaded."""
    import torch  # noqa: F401  (loads libgomp where torch uses it: before the map is read)

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if line.rstrip().rsplit("/", 1)[-1].startswith("libgomp")})
    except OSError:  # no /proc: not Linux
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            lib.omp_pause_resource_all.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):  # unloadable, or older than OpenMP 5.0
            continue
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP pool (its helper threads exit); True when libgomp
    did. A thread that ran a parallel torch op keeps a pool of idle threads for as long as
    it lives, and while they exist the compute thread's barriers sleep instead of spinning
    (the module docstring); the next parallel op on this thread builds a pool again, a
    few tens of microseconds. Cheap when the thread has no pool. Only libgomp: Intel's
    and LLVM's runtimes pause every pool of the process, the compute thread's too."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_PAUSE_SOFT) == 0
