"""Broker adapters (Redis Streams, Kafka) and the control plane (Redis), behind two doors.

Both ``producers`` and ``workers`` use these; neither imports the other.
:func:`open_control_plane` and :func:`open_broker` are the only places that turn a URL
into a backend: the URL's scheme picks a factory from the entry-point groups
``batchfleet.control_planes`` and ``batchfleet.brokers`` (``connectors.registry``), so
a separately installed package adds a backend without editing this one. Nothing above
this package holds a driver client or names a Redis or Kafka class
(tests/unit/test_layering.py).
"""

from __future__ import annotations

from batchfleet.connectors.broker import (
    Broker,
    CombinedFinish,
    CombinedSubmit,
    Consumer,
    Delivery,
    FinishTrip,
    LaneBacklog,
    LaneLossDetection,
    LanePressure,
    OneTrip,
    OutboundMessage,
    Publisher,
    ShardedLanes,
    ShardSource,
)
from batchfleet.connectors.control_plane import ControlPlane
from batchfleet.connectors.registry import (
    broker_schemes,
    control_plane_schemes,
    open_broker,
    open_control_plane,
)
from batchfleet.connectors.urls import BrokerURL, results_url_for
from batchfleet.connectors.values import DEFAULT_TTL_S, SubmitState, TerminalWrite

__all__ = [
    "DEFAULT_TTL_S",
    "Broker",
    "BrokerURL",
    "CombinedFinish",
    "CombinedSubmit",
    "Consumer",
    "ControlPlane",
    "Delivery",
    "FinishTrip",
    "LaneBacklog",
    "LaneLossDetection",
    "LanePressure",
    "OneTrip",
    "OutboundMessage",
    "Publisher",
    "ShardSource",
    "ShardedLanes",
    "SubmitState",
    "TerminalWrite",
    "broker_schemes",
    "control_plane_schemes",
    "open_broker",
    "open_control_plane",
    "results_url_for",
]
