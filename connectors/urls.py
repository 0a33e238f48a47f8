"""The one strict parser of ``--broker`` and ``--results`` URLs.

Every command, the SDK, the gateway and the worker reach a broker or a store through
:meth:`BrokerURL.parse` and :func:`results_url_for`, so a URL is refused here, whole,
before anything dials: ``redis:/h:1/0`` (one slash) once reached redis-py, which read
it as "no host" and connected to localhost:6379, a different Redis. A refusal is an
:class:`~batchfleet.schemas.errors.URLError` (a ``ConfigError``): one line, exit 2.

Which schemes exist is not written here: the doors' registry says
(``connectors.registry``: the built-in backends and whatever the entry-point groups
``batchfleet.control_planes`` and ``batchfleet.brokers`` hold). Only the *shape* of the
built-in schemes' addresses is known here; a scheme a plugin adds needs ``scheme://``
and a non-empty rest, and its factory checks the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from batchfleet.connectors.redis_client import CLUSTER_SCHEME, REDIS_SCHEMES, is_cluster_url
from batchfleet.connectors.registry import (
    broker_schemes,
    control_plane_schemes,
    has_control_plane,
    scheme_of,
)
from batchfleet.schemas.errors import ConfigError, URLError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.S)
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::(\d*))?$")
_EXAMPLE = {"broker": "redis://localhost:6379/0", "results": "redis://localhost:6379/0"}


@dataclass(frozen=True, slots=True)
class ParsedURL:
    """The parts of a URL that passed :func:`parse_url`: the hosts it names, its db."""

    scheme: str
    hosts: tuple[tuple[str, int | None], ...]
    db: int | None


_PASSWORD = re.compile(r"(?P<head>://[^/@]*?:)[^/@]*@")


def _refuse(what: str, url: str, why: str) -> URLError:
    """One line that says what is wrong, with any password in the URL masked."""
    shown = _PASSWORD.sub(r"\g<head>***@", url)
    example = _EXAMPLE.get(what, "redis://localhost:6379/0")
    return URLError(f"{what} URL {shown!r}: {why} (for example {example})", url=url)


def _host_port(what: str, url: str, part: str, *, port_required: bool
               ) -> tuple[str, int | None]:
    found = _HOST_PORT.match(part)
    if found is None:
        raise _refuse(what, url, f"{part!r} is not host:port" if part else "no host")
    host, port = found.group(1), found.group(2)
    if port is None:
        if port_required:
            raise _refuse(what, url, f"{host!r} has no port (host:port)")
        return host, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _refuse(what, url, f"port {port!r} is not a number from 1 to 65535")
    return host, int(port)


def _db(what: str, url: str, path: str, *, cluster: bool) -> int | None:
    db = path.strip("/")
    if "/" in db:
        raise _refuse(what, url, f"path {path!r} is not /DB")
    if not db:
        return None
    if not db.isdigit():
        raise _refuse(what, url, f"database {db!r} is not a number")
    if cluster and int(db) != 0:
        raise _refuse(what, url, "a Redis Cluster has only database 0")
    return int(db)


def parse_url(url: str, schemes: Iterable[str], what: str = "broker") -> ParsedURL:
    """``url`` checked whole: scheme among ``schemes``, host(s), port(s), database.

    ``redis``/``rediss``: ``host[:port][/db]``; ``redis+cluster`` and ``kafka``:
    ``host:port[,host:port]``; ``unix``: ``/path/to/socket``. Credentials
    (``user:password@``) and a ``?query`` are passed through to the driver.
    """
    known = sorted(schemes)
    found = _SCHEME.match(url.strip())
    if found is None:
        raise _refuse(what, url, f"not scheme://host:port; schemes are {', '.join(known)}")
    scheme, rest = found.group(1).lower(), found.group(2)
    if scheme not in known:
        raise _refuse(what, url, f"unknown scheme {scheme!r}; schemes are {', '.join(known)}")
    rest, _, _query = rest.partition("?")
    rest = rest.partition("#")[0]
    if scheme == "unix":
        if not rest.startswith("/") or rest == "/":
            raise _refuse(what, url, "a unix:// URL needs a socket path, unix:///path/to/sock")
        return ParsedURL(scheme, (), None)
    if scheme not in REDIS_SCHEMES and scheme != "kafka":
        if not rest.strip("/") and scheme != "memory":  # memory:// alone: the default store
            raise _refuse(what, url, "nothing after the scheme")
        return ParsedURL(scheme, (), None)  # a backend's own scheme: it checks the rest
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = netloc.rsplit("@", 1)[1]
    listed = scheme in (CLUSTER_SCHEME, "kafka")
    if not netloc:
        raise _refuse(what, url, "no host" + (" list" if listed else ""))
    parts = netloc.split(",")
    if not listed and len(parts) > 1:
        raise _refuse(what, url, f"{scheme}:// takes one host; redis+cluster:// takes a list")
    hosts = tuple(_host_port(what, url, unquote(p.strip()), port_required=listed)
                  for p in parts)
    if scheme == "kafka":
        if path.strip("/"):
            raise _refuse(what, url, "a kafka:// URL has no path (kafka://host:port[,host:port])")
        return ParsedURL(scheme, hosts, None)
    return ParsedURL(scheme, hosts, _db(what, url, slash + path, cluster=scheme == CLUSTER_SCHEME))


def result_store_schemes() -> list[str]:
    """The schemes a control plane (result store) is registered under."""
    return control_plane_schemes()


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """A parsed broker URL: ``redis://host:port/db``, ``redis+cluster://host:port[,host:port]``
    (Redis Cluster; ``kind`` is still ``redis``), ``kafka://host:port[,host:port]``, or a
    plugin's scheme (``kind`` is the scheme)."""

    kind: str
    url: str

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port[,host:port]`` for aiokafka's ``bootstrap_servers``."""
        return self.url.split("://", 1)[1].rstrip("/")

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        scheme = parse_url(url, broker_schemes(), "broker").scheme
        kind = "redis" if scheme in REDIS_SCHEMES else scheme
        return cls(kind, url.strip())


def results_url_for(broker: BrokerURL, results: str | None) -> str:
    """The control plane's URL: given explicitly, or the broker's when its scheme also has
    a control plane registered (Redis does; Kafka does not).

    A Redis broker and the result store are both Redis Cluster or both not: the request
    control plane reads both with one set of key names."""
    if results:
        scheme = parse_url(results, result_store_schemes(), "results").scheme
        if broker.kind == "redis" and is_cluster_url(broker.url) != (scheme == CLUSTER_SCHEME):
            raise ConfigError(
                "a Redis broker and the result store must both be Redis Cluster "
                "(redis+cluster://) or both not; mixing them is not supported")
        return results.strip()
    if has_control_plane(broker.url):
        return broker.url
    name = "Kafka" if broker.kind == "kafka" else f"{scheme_of(broker.url)}://"
    raise ConfigError(
        f"a {name} broker needs a result store: pass --results redis://host:port/db "
        "or set BATCHFLEET_RESULTS"
    )
