"""The console's sign-in edges on its own app, over ``memory://``: an open console (loopback,
no keys) refuses a rebound DNS name and a foreign origin, a header never skips its CSRF
check, and a keys file caught missing or half-written keeps the last good keys."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from batchfleet.producers.console.app import create_console_app
from batchfleet.producers.console.sessions import KeySource, Sessions
from batchfleet.producers.console.settings import ConsoleSettings
from batchfleet.producers.gateway import hash_key
from batchfleet.schemas.errors import AuthError

pytestmark = pytest.mark.unit


def _open_console() -> TestClient:
    settings = ConsoleSettings(broker=f"memory://console-{uuid.uuid4().hex[:8]}")
    return TestClient(create_console_app(settings, None), base_url="http://127.0.0.1:8080")


def test_an_open_console_answers_only_loopback_names_and_origins() -> None:
    with _open_console() as http:
        assert http.get("/api/session").status_code == 200
        for host in ("localhost:8080", "[::1]:8080", "127.0.0.1"):
            assert http.get("/api/session", headers={"Host": host}).status_code == 200, host
        # a page that rebound its own name to 127.0.0.1 still says its name
        rebound = http.post("/api/session", json={}, headers={"Host": "attacker.example:8080"})
        assert rebound.status_code == 403 and "localhost" in rebound.json()["detail"]
        assert http.get("/api/overview",
                        headers={"Host": "attacker.example"}).status_code == 403
        foreign = http.post("/api/session", json={},
                            headers={"Origin": "http://attacker.example:8080"})
        assert foreign.status_code == 403
        signed = http.post("/api/session", json={}, headers={"Origin": "http://127.0.0.1:8080"})
        assert signed.status_code == 200


def test_an_open_console_never_lets_a_header_skip_the_csrf_token() -> None:
    with _open_console() as http:
        refused = http.post("/api/actions/cancel", json={"request_id": "x"},
                            headers={"X-API-Key": "anything"})
        assert refused.status_code == 403 and "CSRF" in refused.text


def test_a_keys_file_gone_or_half_written_keeps_the_last_good_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"root:{hash_key('k-root')}:*:scopes=admin\n")
    sessions = Sessions(KeySource(str(keys)))
    assert sessions.sign_in("k-root").who == "root"
    keys.write_text("root:not-a-hash")  # caught half-written
    assert sessions.sign_in("k-root").who == "root"
    keys.unlink()
    assert sessions.sign_in("k-root").who == "root"
    with pytest.raises(AuthError):
        sessions.sign_in("k-other")
    keys.write_text(f"ops:{hash_key('k-ops')}:*:scopes=admin\n")  # good again: read anew
    assert sessions.sign_in("k-ops").who == "ops"
    with pytest.raises(AuthError):
        sessions.sign_in("k-root")
