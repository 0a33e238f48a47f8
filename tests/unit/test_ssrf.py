"""The callback URL allowlist (SSRF guard), without the network."""

from __future__ import annotations

import pytest

from connectors.ssrf import CallbackPolicy
from schemas.errors import CallbackRefusedError, ConfigError

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
