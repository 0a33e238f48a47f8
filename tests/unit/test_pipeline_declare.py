"""Pipeline declarations, pure: the TOML and --steps forms, the graph rules, the codec,
the edge spec check, and the memory:// registry's shared namespace with models."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from batchfleet.connectors.memory_plane import MemoryControlPlane, open_memory_control_plane
from batchfleet.connectors.memory_state import reset_memory
from batchfleet.connectors.pipelines import declare_checked
from batchfleet.schemas.envelopes import ErrorInfo, Request, Result
from batchfleet.schemas.errors import ValidationError
from batchfleet.schemas.names import Names
from batchfleet.schemas.pipeline import (
    Node,
    Pipeline,
    check_edges,
    decode,
    from_steps,
    from_toml,
    specs_from_records,
)
from batchfleet.schemas.pipeline_flow import advance, entry_requests, join_outputs
from batchfleet.schemas.registry import Declaration, ModelRecord, ModelVersion
from batchfleet.schemas.tensor_spec import TensorSpec

I64, F64, F1 = (TensorSpec("int64", (64,)), TensorSpec("float32", (64,)),
                TensorSpec("float32", (1,)))

FAN_OUT = """
keep_intermediate_s = 60
[[step]]
name = "a"
model = "demo-mlp"
from = "input"
[[step]]
name = "b"
model = "demo-mlp@v2"
from = "input"
[[step]]
name = "avg"
join = "mean"
from = ["a", "b"]
"""


def test_steps_shorthand_is_a_chain_named_after_its_models() -> None:
    p = from_steps("chain", "demo-tokenize, demo-encoder@v3,demo-tokenize")
    assert [(n.name, n.target, n.sources) for n in p.nodes] == [
        ("demo-tokenize", "demo-tokenize", ("input",)),
        ("demo-encoder", "demo-encoder@v3", ("demo-tokenize",)),
        ("demo-tokenize-2", "demo-tokenize", ("demo-encoder",))]
    assert p.output.name == "demo-tokenize-2"
    assert [n.name for n in p.entry] == ["demo-tokenize"]
    assert p.successors("demo-tokenize") == (p.nodes[1],)


def test_toml_fan_out_and_join_round_trip_through_the_codec() -> None:
    p = from_toml("ens", FAN_OUT)
    assert p.keep_intermediate_s == 60
    assert [n.name for n in p.entry] == ["a", "b"]
    assert p.output == Node("avg", ("a", "b"), join="mean")
    assert p.node("b").version == "v2"
    assert decode(p.encode()) == p
    assert from_toml("ens", FAN_OUT, keep_intermediate_s=5).keep_intermediate_s == 5


@pytest.mark.parametrize(("text", "words"), [
    ('[[step]]\nmodel = "m"\n[[step]]\nname = "x"\nmodel = "n"\nfrom = "nope"\n', "'nope'"),
    ('[[step]]\nname = "x"\nmodel = "m"\n[[step]]\nname = "j"\njoin = "mean"\n'
     'from = ["x", "c"]\n[[step]]\nname = "b"\nmodel = "n"\n[[step]]\nname = "c"\n'
     'model = "n"\n', "cycle through b, c, j"),
    ('[[step]]\nname = "a"\nmodel = "m"\n[[step]]\nname = "b"\nmodel = "n"\nfrom = "input"\n',
     "must end in one step"),
    ('[[step]]\nmodel = "m"\n[[step]]\nname = "j"\njoin = "mean"\nfrom = "m"\n',
     "at least two sources"),
    ('[[step]]\nname = "a"\nmodel = "m"\n[[step]]\nname = "b"\nmodel = "m"\nfrom = "input"\n'
     '[[step]]\nname = "j"\njoin = "median"\nfrom = ["a", "b"]\n', "module:function"),
    ('[[step]]\nname = "a"\nmodel = "m"\n[[step]]\nname = "a"\nmodel = "n"\n', "used twice"),
    ('[[step]]\nmodel = "m"\njoin = "mean"\n', "exactly one of model or join"),
    ('[[step]]\nmodel = "m"\ncolour = "red"\n', "colour"),
    ('steps = 1\n', "unknown key"),
    ('[[step]]\nmodel = "bad name"\n', "model name"),
])
def test_bad_graphs_are_refused_in_one_line(text: str, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        from_toml("p", text)


def test_a_model_step_takes_one_source() -> None:
    with pytest.raises(ValidationError, match="takes one source"):
        Pipeline("p", (Node("a", ("input",), "m"), Node("b", ("input",), "m"),
                       Node("c", ("a", "b"), "m")))


def test_an_incompatible_edge_is_refused_naming_it() -> None:
    p = from_steps("p", "tok,enc")
    with pytest.raises(ValidationError, match=r"^edge tok -> enc: tok outputs int64\[64\], "
                                              r"enc takes float32\[64\]$"):
        check_edges(p, {"tok": (None, I64), "enc": (F64, F1)})
    assert check_edges(p, {"tok": (None, F64), "enc": (F64, F1)}) == []
    # an end without a declared spec is left for the first request that crosses it
    assert check_edges(p, {"tok": (None, None), "enc": (F64, F1)}) == ["tok -> enc"]


def test_join_specs_are_derived_and_checked() -> None:
    p = from_toml("ens", FAN_OUT.replace('"mean"', '"stack"') + '[[step]]\nmodel = "sink"\n')
    assert check_edges(p, {"demo-mlp": (F64, F1), "demo-mlp@v2": (F64, F1),
                           "sink": (TensorSpec("float32", (2, 1)), None)}) == []
    with pytest.raises(ValidationError, match=r"edge avg -> sink"):
        check_edges(p, {"demo-mlp": (F64, F1), "demo-mlp@v2": (F64, F1), "sink": (F1, None)})
    with pytest.raises(ValidationError, match=r"edge b -> avg: mean of"):
        check_edges(from_toml("ens", FAN_OUT), {"demo-mlp": (F64, F1), "demo-mlp@v2": (F64, I64)})


def test_specs_come_from_declared_then_versions_and_unknown_models_are_refused() -> None:
    p = from_steps("p", "tok,enc@v2")
    records = {"tok": ModelRecord("tok", declared=Declaration(0.0, None, I64)),
               "enc": ModelRecord("enc", versions={"v2": ModelVersion("v2", "h", F64)})}
    assert specs_from_records(p, records) == {"tok": (None, I64), "enc@v2": (F64, None)}
    with pytest.raises(ValidationError, match="model 'enc' is not in the registry"):
        specs_from_records(p, {"tok": records["tok"]})
    with pytest.raises(ValidationError, match="no version 'v2'"):
        specs_from_records(p, {**records, "enc": ModelRecord(
            "enc", versions={"default": ModelVersion("default", "h")})})


@pytest.fixture
def plane() -> Iterator[MemoryControlPlane]:
    url = f"memory://pipes-{uuid.uuid4().hex[:8]}"
    yield open_memory_control_plane(url, Names("pp"))
    reset_memory(url)


async def test_memory_registry_shares_the_model_namespace(plane: MemoryControlPlane) -> None:
    await plane.models.declare("tok", Declaration(0.0, None, I64))
    await plane.models.declare("enc", Declaration(0.0, F64, F1))
    with pytest.raises(ValidationError, match="edge tok -> enc"):
        await declare_checked(plane.models, plane.pipelines, from_steps("p", "tok,enc"))
    assert await plane.pipelines.names() == set()  # refused: nothing written
    await plane.models.declare("tok", Declaration(0.0, None, F64))
    assert await declare_checked(plane.models, plane.pipelines, from_steps("p", "tok,enc")) == []
    assert await plane.pipelines.get("p") == from_steps("p", "tok,enc")
    with pytest.raises(ValidationError, match="'tok' is a model"):
        await plane.pipelines.declare(from_steps("tok", "enc"))
    with pytest.raises(ValidationError, match="'p' is a pipeline"):
        await plane.models.declare("p", Declaration(0.0))
    assert [x.name for x in await plane.pipelines.all()] == ["p"]
    assert await plane.pipelines.remove("p") and not await plane.pipelines.remove("p")


def test_join_outputs_and_a_shape_that_does_not_fit() -> None:
    a, b = np.ones(3, np.float32), np.full(3, 3.0, np.float32)
    node = Node("j", ("x", "y"), join="mean")
    assert join_outputs(node, [a, b]).tolist() == [2.0, 2.0, 2.0]
    assert join_outputs(Node("j", ("x", "y"), join="stack"), [a, b]).shape == (2, 3)
    assert join_outputs(Node("j", ("x", "y"), join="concatenate"), [a, b]).shape == (6,)
    assert join_outputs(Node("j", ("x", "y"), join="builtins:len"), [a, b]) == 2
    with pytest.raises(ValidationError, match=r"^join j \(mean\): "):
        join_outputs(node, [a, np.ones(4, np.float32)])
    with pytest.raises(ValidationError, match=r"^join j \(json:loads\): TypeError: "):
        join_outputs(Node("j", ("x", "y"), join="json:loads"), [a, b])  # a user's that fails


async def test_memory_join_counts_a_re_put_once(plane: MemoryControlPlane) -> None:
    assert await plane.pipelines.join("r", "j", "a", b"1", 2) is None
    assert await plane.pipelines.join("r", "j", "a", b"2", 2) is None  # redelivered
    assert await plane.pipelines.join("r", "j", "b", b"3", 2) == {"a": b"2", "b": b"3"}


def test_a_step_refusing_its_input_fails_the_caller_naming_the_edge() -> None:
    """An edge with no declared specs is checked on the first request to cross it: the
    step's intake refuses the input, and the caller's error names the edge."""
    p = from_steps("p", "tok,enc")
    caller = Request("r1", "p", np.zeros(3, np.float32), enqueued_at=1.0)
    (first,) = entry_requests(p, caller)
    assert first.request_id == "r1:tok" and first.pipeline and first.pipeline["step"] == "tok"
    out = Result("r1:tok", "succeeded", np.zeros(4, np.int64), model="tok", attempts=1)
    (second,) = advance(p, first, out, 2.0).requests
    assert second.request_id == "r1:enc" and second.deadline_at == caller.deadline_at
    refused = Result("r1:enc", "failed", error=ErrorInfo("validation_error", "wrong dtype"),
                     model="enc", attempts=1)
    final = advance(p, second, refused, 3.0).final
    assert final is not None and final.request_id == "r1" and final.status == "failed"
    assert final.error == ErrorInfo("validation_error",
                                    "edge tok -> enc: step 'enc' (model enc): wrong dtype")
    assert [s["step"] for s in final.steps or []] == ["tok", "enc"]
