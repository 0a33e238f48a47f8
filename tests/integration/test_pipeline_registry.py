"""Pipeline declarations against a real Redis, through the CLI: the documented layout,
the edge check, and the one namespace shared with models (refused both ways)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from typer.testing import CliRunner

from batchfleet.cli import app
from batchfleet.connectors.redis_client import redis_client
from batchfleet.connectors.redis_plane import open_redis_control_plane
from batchfleet.schemas.pipeline import Pipeline, from_toml

pytestmark = pytest.mark.integration

ENSEMBLE = """
[[step]]
name = "a"
model = "tok"
[[step]]
name = "b"
model = "tok"
from = "input"
[[step]]
name = "avg"
join = "mean"
from = ["a", "b"]
"""


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_declare_check_collide_list_and_layout(redis_url: str, tmp_path: Path) -> None:
    at = ("--broker", redis_url, "--namespace", "pl")
    assert cli("models", "declare", "tok", "--output-spec", "int64[64]", *at)[0] == 0
    assert cli("models", "declare", "enc", "--input-spec", "float32[64]", *at)[0] == 0
    code, out = cli("pipelines", "declare", "emb", "--steps", "tok,enc", *at)
    assert code == 1 and "edge tok -> enc: tok outputs int64[64], enc takes float32[64]" in out
    code, out = cli("pipelines", "declare", "emb", "--steps", "tok,ghost", *at)
    assert code == 1 and "model 'ghost' is not in the registry" in out
    assert cli("models", "declare", "enc", "--input-spec", "int64[64]", *at)[0] == 0
    code, out = cli("pipelines", "declare", "emb", "--steps", "tok,enc",
                    "--keep-intermediate-s", "30", *at)
    assert code == 0, out
    file = tmp_path / "ens.toml"
    file.write_text(ENSEMBLE)
    code, out = cli("pipelines", "declare", "ens", "--file", str(file), *at)
    assert code == 0 and "checked on the first request" not in out, out
    # one namespace: neither kind takes the other's name
    code, out = cli("pipelines", "declare", "tok", "--steps", "enc", *at)
    assert code == 1 and "'tok' is a model" in out
    code, out = cli("models", "declare", "emb", "--input-spec", "int64[64]", *at)
    assert code == 1 and "'emb' is a pipeline" in out
    code, out = cli("pipelines", "list", "--json", *at)
    assert code == 0 and [p["name"] for p in json.loads(out)] == ["emb", "ens"]
    # the layout docs/wire-format.md promises, read the way a raw client would
    raw, record, stored = asyncio.run(_read_back(redis_url))
    assert raw == {b"emb", b"ens"}
    assert record["v"] == 1 and record["keep_intermediate_s"] == 30
    assert [(n["name"], n["model"], n["from"]) for n in record["nodes"]] == [
        ("tok", "tok", ["input"]), ("enc", "enc", ["tok"])]
    assert stored == from_toml("ens", ENSEMBLE)
    assert cli("pipelines", "remove", "emb", *at)[0] == 0
    assert cli("models", "declare", "emb", "--input-spec", "int64[64]", *at)[0] == 0


async def _read_back(url: str) -> tuple[set[Any], dict[str, Any], Pipeline | None]:
    raw = redis_client(url)
    try:
        members = await raw.smembers("pl:pipelines")
        record = msgpack.unpackb(await raw.get("pl:pipeline:emb"))
        assert not await raw.exists("pl:model:emb")
    finally:
        await raw.aclose()
    plane = open_redis_control_plane(url, namespace="pl")
    try:
        return members, record, await plane.pipelines.get("ens")
    finally:
        await plane.close()
