"""The doors: a URL's scheme picks the control plane and the broker behind it.

:func:`open_control_plane` and :func:`open_broker` are the only ways code above
``connectors/`` gets a backend. A backend is a factory ``factory(url: str, **options)``
registered under its URL scheme in the entry-point group ``batchfleet.control_planes``
or ``batchfleet.brokers``; a separately installed package adds one without editing a
file of ours (docs/architecture.md, "Adding a store or a broker"). The built-in schemes
are registered the same way in ``pyproject.toml`` and also listed in :data:`BUILT_IN`,
so a checkout whose installed metadata predates them still knows them.

Factories take every option as a keyword and ignore the ones they do not use, so the
callers pass one set of options whatever the scheme (the keys: docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, cast

from batchfleet.schemas.errors import ConfigError

if TYPE_CHECKING:
    from batchfleet.connectors.broker import Broker
    from batchfleet.connectors.control_plane import ControlPlane

PLANES_GROUP = "batchfleet.control_planes"
BROKERS_GROUP = "batchfleet.brokers"

_REDIS_PLANE = "batchfleet.connectors.redis_plane:open_redis_control_plane"
_REDIS_BROKER = "batchfleet.connectors.redis_broker:open_redis_broker"
#: group -> scheme -> "module:attribute": the built-in backends, as pyproject.toml lists them.
BUILT_IN: dict[str, dict[str, str]] = {
    PLANES_GROUP: {**{s: _REDIS_PLANE for s in ("redis", "rediss", "unix", "redis+cluster")},
                   "memory": "batchfleet.connectors.memory_plane:open_memory_control_plane"},
    BROKERS_GROUP: {**{s: _REDIS_BROKER for s in ("redis", "rediss", "unix", "redis+cluster")},
                    "kafka": "batchfleet.connectors.kafka_broker:open_kafka_broker",
                    "memory": "batchfleet.connectors.memory_broker:open_memory_broker"},
}

Factory = Callable[..., Any]


@cache
def _registered(group: str) -> dict[str, str | Any]:
    """scheme -> an entry point (installed) or a "module:attr" string (built in)."""
    found: dict[str, str | Any] = dict(BUILT_IN.get(group, {}))
    for ep in entry_points(group=group):
        found[ep.name.lower()] = ep
    return found


def schemes(group: str) -> list[str]:
    """The schemes installed in ``group``, sorted."""
    return sorted(_registered(group))


def control_plane_schemes() -> list[str]:
    return schemes(PLANES_GROUP)


def broker_schemes() -> list[str]:
    return schemes(BROKERS_GROUP)


def forget_installed() -> None:
    """Read the entry points again on the next open (after a package was installed)."""
    _registered.cache_clear()


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].strip().lower() if "://" in url else ""


def _factory(group: str, url: str, what: str) -> Factory:
    scheme = scheme_of(url)
    target = _registered(group).get(scheme)
    if target is None:
        raise ConfigError(f"no {what} for scheme {scheme or url!r}; "
                          f"installed: {', '.join(schemes(group))}")
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        return cast(Factory, getattr(import_module(module), attr))
    return cast(Factory, target.load())


def open_control_plane(url: str, **options: Any) -> ControlPlane:
    """The control plane behind ``url``, chosen by its scheme; ``options`` as documented
    (``namespace``, ``result_ttl_s``, ``max_connections``, ``pool_timeout_s``)."""
    return cast("ControlPlane", _factory(PLANES_GROUP, url, "control plane")(url, **options))


def open_broker(url: str, **options: Any) -> Broker:
    """The broker behind ``url``, chosen by its scheme; ``options`` as documented
    (``namespace``, ``max_connections``, ``pool_timeout_s``, ``partitions``,
    ``claim_idle_ms``, ``session_timeout_ms``, ``max_stream_len``)."""
    return cast("Broker", _factory(BROKERS_GROUP, url, "broker")(url, **options))


def has_control_plane(url: str) -> bool:
    return scheme_of(url) in _registered(PLANES_GROUP)
