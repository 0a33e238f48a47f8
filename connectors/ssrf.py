"""Which callback URLs batchfleet will call: the SSRF guard for webhooks.

A webhook makes the fleet send an HTTP request to a URL a *caller* chose, so an
unchecked URL lets anyone who can submit probe the fleet's private network
(cloud metadata at 169.254.169.254, Redis on localhost, admin panels). The
policy is an allowlist of schemes and hosts, and it refuses every private,
loopback, link-local, CGNAT, multicast or reserved address unless that network
is named explicitly in ``allow_networks``.

One classifier, :meth:`CallbackPolicy.check_address` over :func:`parse_host`
and :func:`embedded_ipv4`, decides both times the URL is checked: at submit
(SDK and gateway; static, no DNS, so a bad URL is refused up front and
cheaply) and at delivery, where the host is resolved and *every* address it
resolves to must pass. A host is read the way the resolver will read it
(``inet_aton``'s numeric forms, IPv6 literals), and an IPv6 address that
carries an IPv4 one (mapped, SIIT-translated, compatible, NAT64, 6to4, Teredo,
ISATAP) is judged by the IPv4 address it reaches. Shared by producers and the
webhook job, hence here in ``connectors``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, TypeAlias
from urllib.parse import urlsplit

from batchfleet.schemas.errors import CallbackRefusedError, ConfigError, WebhookDeliveryError

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
_LOCALHOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
#: Names cloud providers give their instance metadata service.
_METADATA_NAMES = ("metadata.google.internal", "metadata.goog", "metadata",
                   "instance-data", "instance-data.ec2.internal")

_net = ipaddress.ip_network
#: Never called unless named in ``allow_networks``; ``is_global`` is a backstop on top,
#: but its answer moves between Python versions, so the list is spelled out.
DENIED_NETWORKS: Final[tuple[Network, ...]] = tuple(_net(n) for n in (
    "0.0.0.0/8",          # "this network"; 0.0.0.0 reaches the local host
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # private
    "100.64.0.0/10",      # carrier-grade NAT (Alibaba metadata is 100.100.100.200)
    "127.0.0.0/8",        # loopback
    "169.254.0.0/16",     # link-local (AWS, GCP, Azure metadata: 169.254.169.254)
    "192.0.0.0/24", "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # IETF, docs
    "192.88.99.0/24",     # 6to4 relay anycast
    "198.18.0.0/15",      # benchmarking
    "224.0.0.0/4", "240.0.0.0/4",  # multicast, reserved and broadcast
    "::/128", "::1/128",  # unspecified, loopback
    "100::/64",           # discard-only
    "2001::/23",          # IETF protocol assignments (Teredo is unwrapped before this)
    "2001:db8::/32", "3fff::/20",  # documentation
    "fc00::/7",           # unique local (AWS IPv6 metadata is fd00:ec2::254)
    "fe80::/10", "fec0::/10",  # link-local, old site-local
    "ff00::/8",           # multicast
))
_NAT64: Final = (_net("64:ff9b::/96"), _net("64:ff9b:1::/48"))
#: SIIT's IPv4-translated addresses, ``::ffff:0:a.b.c.d`` = ``::ffff:0:0:0/96`` (RFC 2765).
_TRANSLATED: Final = _net("::ffff:0:0:0/96")
_COMPATIBLE: Final = _net("::/96")
#: ISATAP's interface ID ``[0200|0000]:5efe:a.b.c.d`` (RFC 5214), under any /64 prefix;
#: the mask ignores the universal/local and group bits.
_ISATAP_MASK: Final = 0xFCFF_FFFF
_ISATAP_ID: Final = 0x0000_5EFE
_NUMERIC_LABEL = re.compile(r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)")
_HOST_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_ALL_ONES = 0xFFFFFFFF


def _split(spec: str | None) -> list[str]:
    return [p.strip() for p in (spec or "").replace(";", ",").split(",") if p.strip()]


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as ``inet_aton`` reads it, or None when it is not a numeric IPv4 form.

    So ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1`` and ``0`` are all
    addresses, as they are to the resolver: 1 to 4 parts of decimal, ``0x`` hex or
    ``0``-led octal, the last part filling the bytes the others left.
    Raises CallbackRefusedError for a numeric-looking host that is no valid address
    (``08.1``, ``256.1.1.1``): no real name ends in an all-numeric label.
    """
    parts = host.split(".")
    if not _NUMERIC_LABEL.fullmatch(parts[-1]):
        return None
    values: list[int] = []
    for part in parts:
        value = _ipv4_part(part) if len(parts) <= 4 else None
        if value is None:
            raise CallbackRefusedError(f"callback_url host {host!r} is not a valid address")
        values.append(value)
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        raise CallbackRefusedError(f"callback_url host {host!r} is not a valid address")
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _ipv4_part(part: str) -> int | None:
    if not part.isascii():
        return None
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if len(digits) > 10:
        return None
    if not digits:
        return 0 if base != 10 else None
    try:
        return int(digits, base)
    except ValueError:
        return None


def parse_host(host: str) -> Address | None:
    """The address a URL's host *is* (not resolves to), or None for a DNS name.

    IPv6 literals (brackets and zone optional), every numeric IPv4 form, and the
    localhost names (which never leave the machine whatever DNS says).
    """
    host = host.lower().strip("[]").rstrip(".")
    if host in _LOCALHOST_NAMES or host.endswith(".localhost"):
        return ipaddress.IPv4Address("127.0.0.1")
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise CallbackRefusedError(
                f"callback_url host {host!r} is not a valid IPv6 address") from None
    return parse_ipv4(host)


def embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, i.e. where packets to it really go.

    IPv4-mapped ``::ffff:a.b.c.d``, SIIT-translated ``::ffff:0:a.b.c.d``,
    IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96`` and the local-use
    ``64:ff9b:1::/48`` (last 32 bits), 6to4 ``2002:AABB:CCDD::/48``, Teredo
    ``2001:0:SERVER::`` (server, and the client as the last 32 bits XOR all-ones) and
    ISATAP ``PREFIX:0:5efe:a.b.c.d`` (a router may forward it to that IPv4 address).
    An IPv4 address carries itself.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return [address]
    low = ipaddress.IPv4Address(int(address) & _ALL_ONES)
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    if address in _TRANSLATED or any(address in net for net in _NAT64):
        return [low]
    if address in _COMPATIBLE and int(address) > 1:  # :: and ::1 are IPv6's own
        return [low]
    carried: list[ipaddress.IPv4Address] = []
    if address.sixtofour is not None:
        carried.append(address.sixtofour)
    if address.teredo is not None:
        carried += address.teredo  # (server, client); the library undoes the XOR
    if (int(address) >> 32) & _ISATAP_MASK == _ISATAP_ID:  # any prefix, 6to4 ones too
        carried.append(low)
    return carried


def _translation(address: ipaddress.IPv6Address | ipaddress.IPv4Address) -> bool:
    """An address whose prefix only says "the IPv4 address inside" (not ISATAP's /64)."""
    return isinstance(address, ipaddress.IPv6Address) and (
        address.ipv4_mapped is not None or address.sixtofour is not None
        or address.teredo is not None
        or any(address in net for net in (_TRANSLATED, _COMPATIBLE, *_NAT64)))


def is_public(address: Address) -> bool:
    """Not in a denied network, and globally routable by the standard library's account."""
    return (address.is_global and not address.is_multicast
            and not any(address in net for net in DENIED_NETWORKS))


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
        if not url.isprintable() or not url.isascii():
            raise CallbackRefusedError("callback_url must be printable ASCII "
                                       "(IDNA-encode international names)")
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
        if host in _METADATA_NAMES:
            raise CallbackRefusedError(f"callback_url host {host!r} is a metadata service")
        if ":" not in host and not _HOST_NAME.fullmatch(host):
            raise CallbackRefusedError(f"callback_url host {host!r} is not a valid host name")
        literal = parse_host(host)
        if literal is not None:
            self.check_address(literal, host)
        return host, port or (443 if scheme == "https" else 80)

    def check_address(self, address: Address, host: str) -> None:
        """Refuse private, loopback and reserved addresses unless their network is allowed.

        An IPv6 address carrying an IPv4 one is judged by every IPv4 address it carries.
        """
        if self._allowed(address):
            return
        carried = embedded_ipv4(address)
        # A translation prefix is only a way to reach its IPv4 address; any other prefix
        # (ISATAP's, say fe80::/64) is a network of its own and is judged too.
        targets: list[Address] = [*carried, *(() if carried and _translation(address)
                                              else (address,))]
        for target in targets:
            if not (self._allowed(target) or is_public(target)):
                shown = f"{address}" if target == address else f"{address} -> {target}"
                raise CallbackRefusedError(
                    f"callback_url host {host!r} is a private, loopback or reserved address "
                    f"({shown}); allow its network explicitly to call it")

    def _allowed(self, address: Address) -> bool:
        return any(address in net for net in self.allow_networks)

    def check_resolved(self, url: str) -> None:
        """At delivery: the static checks, then every address the host resolves to."""
        host, port = self.check_url(url)
        for address in resolve(host, port):
            self.check_address(address, host)


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def resolve(host: str, port: int) -> Iterable[Address]:
    """Every address ``host`` resolves to (a name that resolves to nothing is refused)."""
    literal = parse_host(host)
    if literal is not None and host not in _LOCALHOST_NAMES:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        # DNS can fail for a moment: worth retrying, unlike a refusal.
        raise WebhookDeliveryError(f"callback host {host!r} does not resolve: {exc}") from exc
    if not infos:
        raise WebhookDeliveryError(f"callback host {host!r} resolves to no address")
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
