"""The model repository's rules (``workers.models.repository``): which version folders are
complete, which one is served, and how ``model.toml`` maps onto per-model settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.per_model import PerModel
from batchfleet.workers.models.repository import (
    ModelEntry,
    Repository,
    complete_versions,
    from_repository,
    with_repository,
)
from batchfleet.workers.settings import WorkerSettings

pytestmark = pytest.mark.unit


def test_only_folders_holding_ready_count_numbers_in_numeric_order() -> None:
    found = {"1": ["model.pt", "READY"], "10": ["model.pt", "READY"], "2": ["READY"],
             "3": ["model.pt"], ".4": ["READY"], "_5": ["READY"], "beta": ["READY"]}
    assert complete_versions(found) == ("1", "2", "10", "beta")
    assert ModelEntry("m", {}, complete_versions(found)).latest == "beta"


def test_a_local_scan_reads_model_toml_and_complete_versions(tmp_path: Path) -> None:
    (tmp_path / "a" / "1").mkdir(parents=True)
    (tmp_path / "a" / "1" / "READY").write_text("")
    (tmp_path / "a" / "2").mkdir()  # being written
    (tmp_path / "a" / "model.toml").write_text('weights = "model.pt"\n')
    (tmp_path / "no-toml" / "1").mkdir(parents=True)
    snapshot = Repository(str(tmp_path)).scan()
    assert list(snapshot.models) == ["a"]
    assert snapshot.models["a"].versions == ("1",)
    assert snapshot.models["a"].config == {"weights": "model.pt"}


def _settings(**overrides: object) -> WorkerSettings:
    return WorkerSettings.from_url("redis://127.0.0.1:1/0", **overrides)


def test_model_toml_maps_onto_per_model_settings_under_the_command_line() -> None:
    entry = ModelEntry("clf", {"weights": "m.pt", "input_spec": "float32[3,4]",
                               "cache-ttl-s": 60, "latency_slo_ms": 20}, ("1",))
    given = _settings(models=("demo-mlp",))
    # as the command line builds it (validated after the repository is read)
    cli = replace(given, cache_ttl_s=PerModel(0, ((("clf", None), 5),)))
    from batchfleet.workers.models.repository import Snapshot

    out = with_repository(cli, Snapshot({"clf": entry}), only_repository=True)
    assert out.models == ("clf=@repository",) and from_repository(out.models[0])
    assert out.input_spec_for("clf") is not None
    assert out.input_spec.for_model("clf") == "float32[3,4]"
    assert out.latency_slo_ms.for_model("clf") == 20.0
    assert out.cache_ttl_s.for_model("clf") == 5  # the command line's own entry wins
    kept = with_repository(given, Snapshot({"clf": entry}), only_repository=False)
    assert kept.models == ("demo-mlp", "clf=@repository")
    assert out.validated() is out


def test_an_unknown_key_is_refused_naming_the_known_ones() -> None:
    from batchfleet.workers.models.repository import Snapshot

    entry = ModelEntry("clf", {"weights": "m.pt", "max_batch": 8}, ("1",))
    with pytest.raises(ConfigError, match=r"unknown key 'max_batch'; known: .*cache_ttl_s"):
        with_repository(_settings(), Snapshot({"clf": entry}), only_repository=True)


def test_a_model_without_a_complete_version_is_not_served_yet() -> None:
    from batchfleet.workers.models.repository import Snapshot

    out = with_repository(_settings(), Snapshot({"x": ModelEntry("x", {}, ())}),
                          only_repository=True)
    assert out.models == ()
