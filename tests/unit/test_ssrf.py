"""The callback URL allowlist (SSRF guard), without the network."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchfleet.connectors.ssrf import DENIED_NETWORKS, CallbackPolicy, is_public, resolve
from batchfleet.schemas.errors import CallbackRefusedError, ConfigError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", [
    "http://example.com/hook",            # https only by default
    "ftp://example.com/", "file:///etc/passwd", "javascript:alert(1)", "example.com/hook",
    "https://", "https://user:pw@example.com/",
    "https://127.0.0.1/", "https://localhost:8080/", "https://app.localhost/",
    "https://10.0.0.5/", "https://172.16.3.4/", "https://192.168.0.1/",
    "https://169.254.169.254/latest/meta-data/", "https://[::1]/", "https://[fd00::1]/",
    "https://[::ffff:127.0.0.1]/", "https://0.0.0.0/", "https://224.0.0.1/",
    "https://example.com:notaport/", "https://" + "a" * 3000 + ".com/",
])
def test_the_default_policy_refuses(url: str) -> None:
    with pytest.raises(CallbackRefusedError):
        CallbackPolicy().check_url(url)


def test_the_default_policy_allows_public_https() -> None:
    assert CallbackPolicy().check_url("https://hooks.example.com/x?y=1") == \
        ("hooks.example.com", 443)
    assert CallbackPolicy().check_url("https://8.8.8.8:8443/") == ("8.8.8.8", 8443)


def test_host_allowlist_and_explicit_networks() -> None:
    policy = CallbackPolicy.parse("http,https", "*.example.com, hooks.partner.io",
                                  "127.0.0.0/8")
    policy.check_url("https://a.b.example.com/")
    policy.check_url("http://hooks.partner.io/")
    for bad in ["https://example.com.evil.io/", "https://partner.io/", "https://evil.io/"]:
        with pytest.raises(CallbackRefusedError):
            policy.check_url(bad)
    loop = CallbackPolicy.parse("http", "", "127.0.0.0/8")
    assert loop.check_url("http://127.0.0.1:9000/hook") == ("127.0.0.1", 9000)
    loop.check_url("http://localhost/hook")
    with pytest.raises(CallbackRefusedError):
        loop.check_url("http://10.0.0.1/hook")  # only loopback was allowed


def test_delivery_time_check_resolves_names() -> None:
    with pytest.raises(CallbackRefusedError):
        CallbackPolicy.parse("http").check_resolved("http://localhost:1/")
    CallbackPolicy.parse("http", "", "127.0.0.0/8").check_resolved("http://localhost:1/")


def test_bad_settings_fail_loudly() -> None:
    with pytest.raises(ConfigError):
        CallbackPolicy.parse("gopher")
    with pytest.raises(ConfigError):
        CallbackPolicy.parse("https", "", "not-a-network")


# --- one classifier: every spelling of an address is judged as the address ------------

@pytest.mark.parametrize(("host", "reaches"), [
    ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"), ("10.1.1", "10.1.0.1"), ("0", "0.0.0.0"), ("0x7f.1", "127.0.0.1"),
    ("0xa9.0376.43518", "169.254.169.254"), ("0X7F.0.0.01", "127.0.0.1"),
    ("[::ffff:127.0.0.1]", "127.0.0.1"), ("[::ffff:7f00:1]", "127.0.0.1"),
    ("[::10.0.0.5]", "10.0.0.5"), ("[64:ff9b::a00:5]", "10.0.0.5"),
    ("[64:ff9b:1::192.168.0.1]", "192.168.0.1"), ("[2002:a9fe:a9fe::]", "169.254.169.254"),
    ("[2002:7f00:1:1::5]", "127.0.0.1"),
    # Teredo: client 10.0.0.1 is stored XOR all-ones in the last 32 bits
    ("[2001:0:808:808:0:0:f5ff:fffe]", "10.0.0.1"),
    ("[2001:0:a00:1::f7f7:f7f7]", "10.0.0.1"),  # a private Teredo *server*
])
def test_every_embedding_and_numeric_form_is_unwrapped_and_refused(host: str,
                                                                   reaches: str) -> None:
    with pytest.raises(CallbackRefusedError, match=reaches.replace(".", r"\.")):
        CallbackPolicy().check_url(f"https://{host}/hook")


@pytest.mark.parametrize("host", [
    "08.1", "1.2.3.4.5", "256.0.0.1", "1.2.65536", "4294967296", "0x1ffffffff", "09",
    "example.123", "%31%32%37.0.0.1", "[::ffff:0x7f.1]", "[not:an:address]",
    "metadata.google.internal", "[fd00:ec2::254]", "100.100.100.200", "192.0.0.170",
    "[::]", "[fe80::1%25eth0]", "255.255.255.255", "198.18.0.1",
])
def test_numeric_lookalikes_metadata_and_reserved_hosts_are_refused(host: str) -> None:
    with pytest.raises(CallbackRefusedError):
        CallbackPolicy().check_url(f"https://{host}/hook")


def test_non_ascii_hosts_are_refused_before_idna_can_turn_them_into_loopback() -> None:
    with pytest.raises(CallbackRefusedError, match="ASCII"):
        CallbackPolicy().check_url("https://\uff11\uff12\uff17.0.0.1/")


@pytest.mark.parametrize("host", [
    "8.8.8.8", "134744072", "0x8080808", "010.010.010.010", "8.526344", "[::ffff:8.8.8.8]",
    "[64:ff9b::8.8.8.8]", "[2002:808:808::1]", "[2606:4700:4700::1111]",
])
def test_public_addresses_in_any_spelling_are_allowed(host: str) -> None:
    CallbackPolicy().check_url(f"https://{host}/hook")


def test_allowed_networks_cover_the_embedded_address_too() -> None:
    loop = CallbackPolicy.parse("http", "", "127.0.0.0/8")
    for host in ["127.1", "2130706433", "[::ffff:127.0.0.1]", "[64:ff9b::7f00:1]"]:
        loop.check_url(f"http://{host}:9000/")
    with pytest.raises(CallbackRefusedError):
        loop.check_url("http://[64:ff9b::a00:1]/")


def test_submit_and_delivery_use_the_same_classifier() -> None:
    strict = CallbackPolicy.parse("http")
    for url in ["http://2130706433:1/", "http://[64:ff9b::a00:5]:1/", "http://127.1:1/"]:
        with pytest.raises(CallbackRefusedError):
            strict.check_url(url)
        with pytest.raises(CallbackRefusedError):
            strict.check_resolved(url)  # no DNS needed: the literal is the address
    assert list(resolve("0x7f.1", 80)) == [ipaddress.IPv4Address("127.0.0.1")]


def _spellings(ip: ipaddress.IPv4Address) -> list[str]:
    """Every way a URL can name ``ip``: numeric IPv4 forms and IPv6 embeddings."""
    n = int(ip)
    a, b, c, d = ip.packed
    spellings = [
        str(ip), str(n), hex(n), ".".join(f"0{x:o}" for x in ip.packed),
        f"{a}.{b}.{n & 0xFFFF}", f"{a}.{n & 0xFFFFFF}", f"{a:#x}.0{b:o}.{c}.{d}",
        f"[::ffff:{ip}]", f"[64:ff9b::{ip}]", f"[64:ff9b:1::{ip}]",
        f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::1]",
        # Teredo, as the client (server public) and as the server (client public)
        f"[2001:0:808:808:0:0:{(n ^ 0xFFFFFFFF) >> 16:x}:{(n ^ 0xFFFFFFFF) & 0xFFFF:x}]",
        f"[2001:0:{n >> 16:x}:{n & 0xFFFF:x}:0:0:f7f7:f7f7]",
        f"[::ffff:0:{ip}]",  # SIIT
        f"[2606:4700::5efe:{ip}]", f"[2606:4700::200:5efe:{ip}]",  # ISATAP, public /64
    ]
    if n > 1:  # ::0.0.0.0 and ::0.0.0.1 are IPv6's own unspecified and loopback
        spellings.append(f"[::{ip}]")
    return spellings


_DENIED_V4 = [net for net in DENIED_NETWORKS if net.version == 4]


@st.composite
def _denied_ipv4(draw: st.DrawFn) -> ipaddress.IPv4Address:
    net = draw(st.sampled_from(_DENIED_V4))
    offset = draw(st.integers(0, net.num_addresses - 1))
    return ipaddress.IPv4Address(int(net.network_address) + offset)


@settings(max_examples=300, deadline=None)
@given(_denied_ipv4())
def test_property_every_spelling_of_a_denied_ipv4_is_refused(ip: ipaddress.IPv4Address) -> None:
    policy = CallbackPolicy()
    for host in _spellings(ip):
        with pytest.raises(CallbackRefusedError):
            policy.check_url(f"https://{host}/")


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses(v=4).filter(is_public))
def test_property_every_spelling_of_a_public_ipv4_is_allowed(ip: ipaddress.IPv4Address) -> None:
    policy = CallbackPolicy()
    for host in _spellings(ip):
        policy.check_url(f"https://{host}/")



# --- every IPv4-embedding form against every range it must not reach -------------------

def _teredo_client(obfuscated: int) -> str:
    """A Teredo address whose client (stored XOR all-ones) is the IPv4 address."""
    return f"[2001:0:808:808::{obfuscated >> 16:x}:{obfuscated & 0xFFFF:x}]"


#: (form, how a URL host spells IPv4 ``ip`` in it); all are unwrapped to ``ip``.
EMBEDDINGS: list[tuple[str, Any]] = [
    ("mapped", lambda ip: f"[::ffff:{ip}]"),
    ("mapped-hex", lambda ip: f"[::ffff:{int(ip) >> 16:x}:{int(ip) & 0xFFFF:x}]"),
    ("siit", lambda ip: f"[::ffff:0:{ip}]"),
    ("compatible", lambda ip: f"[::{ip}]"),
    ("nat64", lambda ip: f"[64:ff9b::{ip}]"),
    ("nat64-local", lambda ip: f"[64:ff9b:1::{ip}]"),
    ("nat64-local-subnet", lambda ip: f"[64:ff9b:1:abcd::{ip}]"),
    ("6to4", lambda ip: f"[2002:{int(ip) >> 16:x}:{int(ip) & 0xFFFF:x}::1]"),
    ("teredo-client", lambda ip: _teredo_client(int(ip) ^ 0xFFFFFFFF)),
    ("teredo-server", lambda ip: f"[2001:0:{int(ip) >> 16:x}:{int(ip) & 0xFFFF:x}::f7f7:f7f7]"),
    ("isatap", lambda ip: f"[::5efe:{ip}]"),
    ("isatap-global", lambda ip: f"[2606:4700:1:2:200:5efe:{ip}]"),
    ("isatap-in-6to4", lambda ip: f"[2002:808:808:1:0:5efe:{ip}]"),
]
#: One address in each private, loopback, link-local and metadata range.
FORBIDDEN: list[tuple[str, str]] = [
    ("private-10", "10.0.0.5"), ("private-172", "172.16.3.4"), ("private-192", "192.168.0.1"),
    ("loopback", "127.0.0.1"), ("loopback-other", "127.9.9.9"), ("this-network", "0.1.2.3"),
    ("link-local", "169.254.10.20"), ("metadata", "169.254.169.254"),
    ("metadata-alibaba", "100.100.100.200"), ("cgnat", "100.64.0.1"),
]


@pytest.mark.parametrize(("form", "spell"), EMBEDDINGS, ids=[f for f, _ in EMBEDDINGS])
@pytest.mark.parametrize(("where", "ip"), FORBIDDEN, ids=[w for w, _ in FORBIDDEN])
def test_every_embedding_of_every_forbidden_range_is_refused_at_submit_and_delivery(
        form: str, spell: Any, where: str, ip: str) -> None:
    """http allowed, as where the issue saw a 202: refused by ``check_url`` (what the SDK
    and the gateway run at submit) and by ``check_resolved`` (the webhook job's)."""
    url = f"http://{spell(ipaddress.IPv4Address(ip))}:8080/hook"
    policy = CallbackPolicy.parse("http,https")
    with pytest.raises(CallbackRefusedError, match=ip.replace(".", r"\.")):
        policy.check_url(url)
    with pytest.raises(CallbackRefusedError, match=ip.replace(".", r"\.")):
        policy.check_resolved(url)


@pytest.mark.parametrize(("form", "spell"), EMBEDDINGS, ids=[f for f, _ in EMBEDDINGS])
def test_every_embedding_of_a_public_address_is_allowed(form: str, spell: Any) -> None:
    host = spell(ipaddress.IPv4Address("8.8.8.8"))
    assert CallbackPolicy().check_url(f"https://{host}/")[0] == host.strip("[]")


@pytest.mark.parametrize("url", [
    "https://[::ffff:0:10.0.0.5]/", "https://[::ffff:0:127.0.0.1]/",
    "https://[::ffff:0:169.254.169.254]/", "https://[::5efe:a00:5]/",
])
def test_the_issue_urls_are_refused(url: str) -> None:
    with pytest.raises(CallbackRefusedError):
        CallbackPolicy.parse("http,https").check_url(url)


def test_an_isatap_address_is_judged_by_its_prefix_too() -> None:
    """ISATAP's prefix is a real network (a translation prefix is not): a link-local or
    unique-local /64 is refused even when the IPv4 address inside is public."""
    for host in ["[fe80::200:5efe:8.8.8.8]", "[fd00:ec2::5efe:8.8.8.8]"]:
        with pytest.raises(CallbackRefusedError):
            CallbackPolicy().check_url(f"https://{host}/")
