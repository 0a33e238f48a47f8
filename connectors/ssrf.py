"""Which callback URLs batchfleet will call: the SSRF guard for webhooks.

A webhook makes the fleet send an HTTP request to a URL a *caller* chose, so an
unchecked URL lets anyone who can submit probe the fleet's private network
(cloud metadata at 169.254.169.254, Redis on localhost, admin panels). The
policy is an allowlist of schemes and hosts, and it refuses every private,
loopback, link-local, multicast or reserved address unless that network is
named explicitly in ``allow_networks``.

It is checked twice: at submit (SDK and gateway; static checks only, no DNS, so
a bad URL is refused up front and cheaply) and at delivery, where the host is
resolved and *every* address it resolves to must pass. Shared by producers and
the webhook job, hence here in ``connectors``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import urlsplit

from schemas.errors import CallbackRefusedError, ConfigError, WebhookDeliveryError

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
_LOCALHOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def _split(spec: str | None) -> list[str]:
    return [p.strip() for p in (spec or "").replace(";", ",").split(",") if p.strip()]


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """Allowed callback URLs. The default is strict: https only, public addresses only."""

    schemes: frozenset[str] = frozenset({"https"})
    #: Exact host names or ``*.suffix`` patterns; empty means any (public) host.
    hosts: tuple[str, ...] = ()
    #: Networks allowed even though private or loopback, e.g. ``127.0.0.0/8`` in tests.
    allow_networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, schemes: str | None = None, hosts: str | None = None,
              allow_networks: str | None = None) -> CallbackPolicy:
        """From comma-separated settings (the CLI's flags and environment variables)."""
        try:
            nets = tuple(ipaddress.ip_network(n, strict=False) for n in _split(allow_networks))
        except ValueError as exc:
            raise ConfigError(f"bad callback network allowlist: {exc}") from exc
        chosen = frozenset(s.lower() for s in _split(schemes)) or frozenset({"https"})
        if not chosen <= {"http", "https"}:
            raise ConfigError(f"callback schemes must be http and/or https, got {sorted(chosen)}")
        return cls(chosen, tuple(h.lower() for h in _split(hosts)), nets)

    def check_url(self, url: str) -> tuple[str, int]:
        """Static checks (no DNS): returns (host, port) or raises CallbackRefusedError."""
        if not isinstance(url, str) or len(url) > MAX_URL_LENGTH:
            raise CallbackRefusedError(f"callback_url must be a string of at most "
                                       f"{MAX_URL_LENGTH} characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise CallbackRefusedError(f"callback_url {url!r} is not a valid URL: {exc}") from exc
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower().rstrip(".")
        if scheme not in self.schemes:
            raise CallbackRefusedError(
                f"callback_url scheme {scheme or '(none)'!r} is not allowed "
                f"(allowed: {', '.join(sorted(self.schemes))})")
        if not host:
            raise CallbackRefusedError(f"callback_url {url!r} has no host")
        if parts.username is not None or parts.password is not None:
            raise CallbackRefusedError("callback_url must not carry credentials")
        if self.hosts and not any(_host_matches(host, pattern) for pattern in self.hosts):
            raise CallbackRefusedError(f"callback_url host {host!r} is not in the allowlist")
        literal = _literal_address(host)
        if literal is not None:
            self.check_address(literal, host)
        return host, port or (443 if scheme == "https" else 80)

    def check_address(self, address: Address, host: str) -> None:
        """Refuse private and loopback addresses unless their network is allowed."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in net for net in self.allow_networks):
            return
        if not address.is_global or address.is_multicast:
            raise CallbackRefusedError(
                f"callback_url host {host!r} is a private, loopback or reserved address "
                f"({address}); allow its network explicitly to call it")

    def check_resolved(self, url: str) -> None:
        """At delivery: the static checks, then every address the host resolves to."""
        host, port = self.check_url(url)
        for address in resolve(host, port):
            self.check_address(address, host)


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _literal_address(host: str) -> Address | None:
    if host in _LOCALHOST_NAMES or host.endswith(".localhost"):
        return ipaddress.ip_address("127.0.0.1")
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int) -> Iterable[Address]:
    """Every address ``host`` resolves to (a name that resolves to nothing is refused)."""
    literal = _literal_address(host)
    if literal is not None and host not in _LOCALHOST_NAMES:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        # DNS can fail for a moment: worth retrying, unlike a refusal.
        raise WebhookDeliveryError(f"callback host {host!r} does not resolve: {exc}") from exc
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
