"""SLO-driven batch closing: close each batch as late as a latency SLO allows.

A fixed ``max_wait_ms`` is one number for every load. With ``--latency-slo-ms`` a
model's batches instead close from what the worker has learned about itself:

* **cost** against batch size, an online least-squares fit ``cost_s ~ a + b*n`` with
  exponential forgetting (:class:`CostFit`); the middleware feeds it the forward pass
  plus the event loop's CPU per batch, what a batch costs the worker;
* **arrival rate**, an exponentially decayed count of arrivals (:class:`ArrivalRate`);
* **the rest of the way to ``finished_at``**: how much later than predicted each
  batch actually finished, counted from the moment it closed (waiting for the compute
  thread, the hooks before compute, the prediction's own error). Its recent p99 is the
  safety margin (:class:`RecentQuantile`), never below a floor.

The SLO runs from a request's ``enqueued_at`` (its queue time before this worker
fetched it included) to its ``finished_at``. For a group of ``n`` requests whose
oldest was enqueued at ``origin``, the latest moment it can close and still finish
in time is ``origin + slo - margin - compute(n + 1)`` (one more row, because one may
arrive before it closes). It closes then, or earlier:

* when it is full (``max_batch_size``);
* when waiting longer cannot grow it: fewer than ``min_gain_rows`` arrivals are
  expected before that latest moment (so at a low rate a request runs at once);
* when nothing has been learned yet (the first batches run at once, and teach);

and when a burst lands just before a group closes, the batch takes only as many as still
finish in time for its oldest (:meth:`SloController.batch_size`), but never fewer than
keep up with the arrivals; the burst runs next;
* under overload, when the SLO is lost for the group's oldest anyway, it waits to fill
  if arrivals are expected to fill it within one full batch's compute time past the
  latest close, so the worker runs full batches (throughput), not tiny late ones.

Everything here is pure: no I/O, no clock of its own. Time is ``time.monotonic()``
passed in by the caller; ``workers/middleware/slo.py`` feeds the observations and
``workers/batching.py`` asks :meth:`SloController.due_at`. See docs/batching.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloConfig:
    """One model's SLO and the controller's tuning (the defaults are what the worker uses)."""

    slo_s: float
    max_batch_size: int
    #: The safety margin is the recent ``margin_quantile`` of how late batches finished
    #: against the prediction made when they closed, but never below this floor...
    margin_floor_s: float = 0.001
    #: ...nor below this fraction of the SLO.
    margin_fraction: float = 0.05
    #: 0.99: the SLO is a p99 target, so the margin covers all but 1% of batches.
    margin_quantile: float = 0.99
    #: How many recent batches the margin is taken over.
    window: int = 128
    #: Stop waiting once fewer rows than this are expected before the latest close.
    min_gain_rows: float = 1.0
    #: Time constant of the arrival-rate average.
    rate_tau_s: float = 1.0
    #: Batches stay big enough to serve this multiple of the arrival rate
    #: (:meth:`SloController.rows_to_keep_up`).
    keep_up: float = 1.0
    #: Weight kept by the cost fit's old samples per new batch (~1/(1-forget) batches).
    forget: float = 0.98

    def __post_init__(self) -> None:
        if not self.slo_s > 0:
            raise ValueError("the latency SLO must be positive")
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if not 0 < self.forget < 1 or not 0 < self.margin_quantile <= 1:
            raise ValueError("forget must be in (0, 1) and margin_quantile in (0, 1]")
        if self.window < 1 or self.rate_tau_s <= 0 or self.keep_up <= 0:
            raise ValueError("window, rate_tau_s and keep_up must be positive")


class CostFit:
    """Online weighted least squares of compute seconds on batch size, old samples fading.

    While the sizes seen hardly vary, a line through them is not determined; the fit then
    splits the mean cost half fixed, half per row (exact at the mean size, growing with it).
    Both coefficients are kept non-negative: a batch never gets cheaper by growing.
    """

    __slots__ = ("_c", "_forget", "_n", "_nc", "_nn", "_w")

    def __init__(self, forget: float = 0.98) -> None:
        self._forget = forget
        self._w = self._n = self._nn = self._c = self._nc = 0.0

    @property
    def fitted(self) -> bool:
        return self._w > 0.0

    def observe(self, size: int, seconds: float) -> None:
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        f = self._forget
        self._w = self._w * f + 1.0
        self._n = self._n * f + size
        self._nn = self._nn * f + size * size
        self._c = self._c * f + seconds
        self._nc = self._nc * f + size * seconds

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds a, seconds per row b); (0, 0) before any sample."""
        if self._w <= 0.0:
            return 0.0, 0.0
        mean_n, mean_c = self._n / self._w, self._c / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n < 0.25:  # sizes hardly vary: half fixed, half per row
            return mean_c / 2.0, mean_c / (2.0 * mean_n)
        slope = (self._nc / self._w - mean_n * mean_c) / var_n
        if slope <= 0.0:
            return mean_c, 0.0
        fixed = mean_c - slope * mean_n
        if fixed < 0.0:
            return 0.0, mean_c / mean_n
        return fixed, slope

    def predict(self, size: int) -> float | None:
        """Predicted compute seconds of a batch of ``size``; None before any sample."""
        if self._w <= 0.0:
            return None
        a, b = self.coefficients()
        return a + b * size


class ArrivalRate:
    """Arrivals per second: an exponentially decayed count with time constant ``tau_s``.

    Each arrival adds ``1/tau_s`` and the sum decays by ``exp(-dt/tau_s)``, so a steady
    rate ``r`` reads ``r`` once a few ``tau_s`` have passed, and silence reads as a
    falling rate. Irregular arrivals need no fixed sampling interval.
    """

    __slots__ = ("_at", "_tau", "_value")

    def __init__(self, tau_s: float = 1.0) -> None:
        self._tau = tau_s
        self._value = 0.0
        self._at: float | None = None

    def observe(self, count: int, now: float) -> None:
        if count <= 0:
            return
        self._value = self.rate(now) + count / self._tau
        self._at = now if self._at is None else max(self._at, now)

    def rate(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._at) / self._tau)


class RecentQuantile:
    """A quantile of the last ``window`` samples (nearest rank)."""

    __slots__ = ("_values",)

    def __init__(self, window: int = 64) -> None:
        self._values: deque[float] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._values.append(value)

    def quantile(self, q: float) -> float | None:
        if not self._values:
            return None
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


#: Closed batches remembered until their compute is reported (the rest are forgotten).
_OPEN_CLOSES = 256


class SloController:
    """One model version's close deadline, from its SLO and what it has observed.

    Feed it :meth:`arrived` (per fetch), :meth:`closed` (the batcher took a batch) and
    :meth:`computed` (the batch's compute finished); ask :meth:`due_at` per group, and
    :meth:`batch_size` once it is due.
    ``token`` pairs a close with its compute: any hashable the caller has at both
    moments (the worker uses the batch key).
    """

    def __init__(self, config: SloConfig) -> None:
        self.config = config
        self.cost = CostFit(config.forget)
        self.rate = ArrivalRate(config.rate_tau_s)
        self.late = RecentQuantile(config.window)
        self._closes: dict[Hashable, tuple[float, float]] = {}

    # --- observations ------------------------------------------------------------

    def arrived(self, count: int, now: float) -> None:
        """``count`` requests reached this worker (fetched and decoded) at ``now``."""
        self.rate.observe(count, now)

    def closed(self, token: Hashable, size: int, now: float) -> None:
        """A batch of ``size`` closed at ``now``: remember when, and what it should cost."""
        predicted = self.cost.predict(size)
        self._closes.pop(token, None)
        if len(self._closes) >= _OPEN_CLOSES:  # never computed (expired, held): forget
            self._closes.pop(next(iter(self._closes)))
        self._closes[token] = (now, predicted if predicted is not None else math.nan)

    def computed(self, token: Hashable, size: int, compute_s: float, finished: float) -> None:
        """The batch ``token`` closed as ran ``compute_s`` seconds and finished at
        ``finished``: learn its cost, and how late it finished against the prediction."""
        self.cost.observe(size, compute_s)
        opened = self._closes.pop(token, None)
        if opened is not None:
            closed_at, predicted = opened
            if not math.isnan(predicted):
                self.late.add(finished - closed_at - predicted)

    # --- decisions ---------------------------------------------------------------

    def margin_s(self) -> float:
        """Seconds kept in reserve: the recent p99 of the lateness, at least the floor."""
        c = self.config
        floor = max(c.margin_floor_s, c.margin_fraction * c.slo_s)
        late = self.late.quantile(c.margin_quantile)
        return floor if late is None else max(floor, late)

    def rows_to_keep_up(self, now: float) -> int:
        """The smallest batch whose throughput, ``n / cost(n)``, is ``keep_up`` times the
        arrival rate (``max_batch_size`` when none is). A burst is never trimmed below
        this (:meth:`batch_size`): smaller batches would fall behind the arrivals, and
        the queue that builds would cost every later request far more than the trim saves
        the oldest."""
        c = self.config
        a, b = self.cost.coefficients()
        need = self.rate.rate(now) * c.keep_up
        if need * b >= 1.0:
            return c.max_batch_size
        return max(1, min(c.max_batch_size, math.ceil(need * a / (1.0 - need * b))))

    def latest_close(self, size: int, oldest_origin: float) -> float | None:
        """The last moment a group of ``size`` can close and finish within the SLO,
        allowing for one more row; None before any compute was observed."""
        cost = self.cost.predict(size + 1)
        if cost is None:
            return None
        return oldest_origin + self.config.slo_s - self.margin_s() - cost

    def due_at(self, size: int, oldest_origin: float, now: float) -> float:
        """When a group of ``size`` whose oldest request was enqueued at ``oldest_origin``
        (monotonic, queue time before the fetch included) should close; ``<= now``: now."""
        c = self.config
        if size >= c.max_batch_size:
            return now
        latest = self.latest_close(size, oldest_origin)
        if latest is None:
            return now  # nothing learned yet: run at once, and learn from it
        rate = self.rate.rate(now)
        if rate <= 0.0:
            return now  # nothing is arriving: waiting cannot grow the batch
        if latest <= now:
            single = self.latest_close(0, oldest_origin)  # one row, closing now
            if single is not None and single > now:
                return now  # the oldest still fits: close (``batch_size`` trims a burst)
            # The SLO is lost for the oldest. Under overload throughput is what helps:
            # wait to fill, but no longer than one full batch's compute time past the
            # last moment one row could have closed, and only while arrivals are expected
            # to fill it by then; an isolated late request (a retry, a clock-skewed
            # producer) runs at once.
            give_up = oldest_origin + c.slo_s - self.margin_s() + (
                self.cost.predict(c.max_batch_size) or 0.0) - (self.cost.predict(1) or 0.0)
            filled = now + (c.max_batch_size - size) / rate
            return give_up if filled <= give_up else now
        # Wait while at least ``min_gain_rows`` more are expected before the latest close.
        return latest - c.min_gain_rows / rate

    def batch_size(self, size: int, oldest_origin: float, now: float) -> int:
        """How many of a due group's ``size`` requests to take now (oldest first).

        All of them (up to ``max_batch_size``), unless a burst landed just before the close:
        then only as many as still finish within the SLO for the oldest, and the burst's
        rows (just arrived, their budget whole) make the next batch. When not even one
        row finishes in time the SLO is lost, and the batch is full (throughput)."""
        c = self.config
        most = min(size, c.max_batch_size)
        a, b = self.cost.coefficients()
        if not self.cost.fitted or b <= 0.0:
            return most
        room = oldest_origin + c.slo_s - self.margin_s() - now - a
        fits = math.floor(room / b) if room > 0 else 0
        return most if fits < 1 else min(most, max(fits, self.rows_to_keep_up(now)))

    def wait_s(self, now: float) -> float:
        """How long a request arriving now to an empty group would wait (the gauge)."""
        return max(0.0, self.due_at(1, now, now) - now)
