"""Which models a worker holds in memory: pure decisions, no I/O (docs/models.md,
"Loading on demand").

A worker with ``--max-loaded-models`` or ``--model-memory-mb`` advertises every model it
is given but holds only some of them; the others' lanes are paused, so their requests
wait in the broker. Every tick the residency middleware (``middleware/residency.py``)
hands :func:`decide` what it sees (each model's waiting work, what is loaded and when it
was last used) and does what it says: load one model, and first evict the ones that make
room. Kept pure so the rules are tested directly, without a broker or a model.

The rules:

* a model with work waiting whose oldest request has waited at least its
  ``--cold-load-after-ms`` is *wanted*; the one waiting longest goes first, one load at
  a time (a load holds a CPU or the device's copy engine; two would only slow both);
* it loads when it fits: at most ``max_models`` held and their measured memory plus its
  own (measured when it was last loaded; before that, its parameters and buffers as
  built at start-up) within ``budget_mb``;
* otherwise the least recently used *idle* models (no work waiting or fetched) are
  evicted until it fits, never one held for less than ``min_residency_s`` (no thrash);
* when nothing idle can make room, a model that has held its place past the minimum
  residency is preempted, but only for a request that has itself waited longer than the
  minimum residency, so a busy model is not thrown out for a request just arrived and
  no lane starves behind two busy ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resident:
    """A loaded model as the decision sees it."""

    #: ``time.monotonic()`` when it finished loading, and when it last computed a batch.
    loaded_at: float
    last_used: float
    memory_mb: float = 0.0
    #: Work waiting in its lane or fetched and not acked.
    busy: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    max_models: int | None = None
    budget_mb: float | None = None
    min_residency_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Decision:
    """Evict these (in order), then load ``load``; nothing to do when both are empty."""

    load: str | None = None
    evict: tuple[str, ...] = ()


def wanted(waiting_s: Mapping[str, float], loaded: Sequence[str],
           cold_after_s: Mapping[str, float]) -> list[str]:
    """Models not loaded whose oldest waiting request is old enough, oldest first.
    ``waiting_s``: each model with work waiting -> its oldest request's age."""
    ready = [m for m, age in waiting_s.items()
             if m not in loaded and age >= cold_after_s.get(m, 0.0)]
    return sorted(ready, key=lambda m: (-waiting_s[m], m))


def fits(residents: Mapping[str, Resident], memory_mb: float, limits: Limits) -> bool:
    """Whether one more model of ``memory_mb`` fits beside ``residents``."""
    if limits.max_models is not None and len(residents) + 1 > limits.max_models:
        return False
    if limits.budget_mb is not None:
        held = sum(r.memory_mb for r in residents.values())
        # a model bigger than the whole budget still loads alone: refusing would strand it
        if residents and held + memory_mb > limits.budget_mb:
            return False
    return True


def decide(residents: Mapping[str, Resident], want: Sequence[str], waited_s: Mapping[str, float],
           memory_mb: Mapping[str, float], limits: Limits, now: float) -> Decision:
    """What to evict and load for the first model of ``want`` (see the module's rules).
    ``waited_s``: each wanted model's oldest request's age; ``memory_mb``: what each
    model measured when last loaded."""
    if not want:
        return Decision()
    model = want[0]
    need = memory_mb.get(model, 0.0)
    if fits(residents, need, limits):
        return Decision(load=model)
    settled = {m: r for m, r in residents.items() if now - r.loaded_at >= limits.min_residency_s}
    idle = sorted((m for m, r in settled.items() if not r.busy),
                  key=lambda m: (settled[m].last_used, m))
    evicted = _make_room(residents, idle, need, limits)
    if evicted is not None:
        return Decision(load=model, evict=evicted)
    if waited_s.get(model, 0.0) < limits.min_residency_s:
        return Decision()
    # preempt: the longest-held settled models first (idle ones before them)
    busy = sorted((m for m, r in settled.items() if r.busy),
                  key=lambda m: (settled[m].loaded_at, m))
    evicted = _make_room(residents, idle + busy, need, limits)
    return Decision() if evicted is None else Decision(load=model, evict=evicted)


def _make_room(residents: Mapping[str, Resident], victims: Sequence[str], need: float,
               limits: Limits) -> tuple[str, ...] | None:
    """The fewest of ``victims`` (taken in order) whose eviction lets ``need`` fit."""
    left = dict(residents)
    out: list[str] = []
    for victim in victims:
        if fits(left, need, limits):
            break
        del left[victim]
        out.append(victim)
    return tuple(out) if fits(left, need, limits) else None
