"""``batchfleet rollout set | promote | rollback | status | report``: versions in production.

Every change is recorded with who (``--who``, default ``user@host``), when and why
(``--why``), and bumps the policy epoch workers report in their heartbeats.
See docs/rollout.md for the walkthrough. Output follows :mod:`batchfleet.output`:
``-o json`` (``--json``) and ``-o yaml`` carry the wire documents unchanged, tables fold
(whole worker IDs) and show local times; ``-o wide`` adds the workers holding each
version and the full history policy.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Annotated, Any, TypeVar

import typer

from batchfleet.connectors.control_plane import Rollouts
from batchfleet.connectors.rollout import RolloutStatus, default_who
from batchfleet.options import (
    BrokerOpt,
    JsonOpt,
    NamespaceOpt,
    ResultsOpt,
    fail,
    run_against,
)
from batchfleet.output import (
    Column,
    NoHeadersOpt,
    OutputOpt,
    console,
    dump,
    human_time,
    iso_times,
    output_format,
    table,
)
from batchfleet.schemas.registry import GuardThresholds, RolloutPolicy
from batchfleet.schemas.settings import DEFAULT_NAMESPACE

T = TypeVar("T")

rollout_app = typer.Typer(
    help="Canary, shadow, promote and roll back a model's versions.\n\nExamples:\n\n"
         "    batchfleet rollout set demo-mlp --stable default --canary v2 --percent 20\n\n"
         "    batchfleet rollout rollback demo-mlp",
    no_args_is_help=True, rich_markup_mode="markdown")

ModelArg = Annotated[str, typer.Argument(help="The model's name.")]
WhyOpt = Annotated[str, typer.Option("--why", help="Why: kept in the policy history.")]
WhoOpt = Annotated[str | None, typer.Option(
    "--who", envvar="BATCHFLEET_WHO", help="Who: kept in the history. Default: user@host.")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Go ahead even though the version's recorded shadow arg-max agreement "
    "with stable is below --guard-agreement.")]


def _run(broker: str, results: str | None, namespace: str,
         body: Callable[[Rollouts], Awaitable[T]]) -> T:
    """Run ``body`` against the fleet's rollouts; our errors exit 1 with one line."""
    return run_against(lambda plane: plane.rollouts, broker, results, namespace, body)


def _changed(policy: RolloutPolicy, output: str) -> None:
    """The new policy: its wire document (JSON, YAML) or one line (table, wide)."""
    if output in ("json", "yaml"):
        dump(policy.to_wire(), output)
    else:
        typer.echo(f"epoch {policy.epoch}: {describe(policy)}")


def guard_with(old: GuardThresholds, given: dict[str, float | int | None]) -> GuardThresholds:
    """The thresholds ``old`` with the flags given; a 0 turns an optional check off."""
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    for key in ("psi", "nan_points", "agreement"):
        if changes.get(key) == 0:
            changes[key] = None
    return replace(old, **changes)


def describe_guard(g: GuardThresholds) -> str:
    """``errors +5 points, p99 2x, window 200, PSI off, NaN off, agreement off``."""
    def opt(value: float | None, unit: str = "") -> str:
        return "off" if value is None else f"{value:g}{unit}"

    return (f"errors +{g.error_points:g} points, p99 {g.p99_ratio:g}x, window "
            f"{g.min_window} requests, PSI {opt(g.psi)}, NaN +{opt(g.nan_points, ' points')}, "
            f"agreement {opt(g.agreement)}").replace("+off", "off")


def describe(policy: RolloutPolicy) -> str:
    """``stable v1, canary v2 at 20%, shadow v3``: a policy in one line."""
    parts = [f"stable {policy.stable}"]
    if policy.canary is not None:
        parts.append(f"canary {policy.canary} at {policy.percent:g}%")
    if policy.shadow is not None:
        parts.append(f"shadow {policy.shadow}")
    return ", ".join(parts)


@rollout_app.command("set")
def set_(
    model: ModelArg, broker: BrokerOpt,
    stable: Annotated[str, typer.Option(help="The version label taking traffic.")],
    canary: Annotated[str | None, typer.Option(
        help="A version taking --percent of the traffic.")] = None,
    percent: Annotated[float, typer.Option(
        min=0.0, max=100.0, help="The canary's share of requests, 0-100.")] = 0.0,
    shadow: Annotated[str | None, typer.Option(
        help="A version run on copies of live batches; its answers are never returned.")
    ] = None,
    guard_error_points: Annotated[float | None, typer.Option(
        help="Roll back when the canary's error rate exceeds stable's by this many points "
        "(and significantly: docs/rollout.md, How the guard decides).")
    ] = None,
    guard_p99_ratio: Annotated[float | None, typer.Option(
        help="Roll back when the canary's p99 compute exceeds stable's this many times "
        "(over 100+ batches each, significantly, at two evaluations in a row).")
    ] = None,
    guard_window: Annotated[int | None, typer.Option(
        help="Judge the canary only after this many of its requests.")] = None,
    guard_psi: Annotated[float | None, typer.Option(
        min=0.0, help="Roll back when the PSI of the canary's outputs against stable's on "
        "the same traffic exceeds this (0: off, the default; 0.25 is a large shift).")
    ] = None,
    guard_nan_points: Annotated[float | None, typer.Option(
        min=0.0, max=100.0, help="Roll back when the canary's share of requests with a NaN "
        "output exceeds stable's by this many points (0: off, the default).")] = None,
    guard_agreement: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Refuse to make canary or promote a version whose recorded "
        "shadow arg-max agreement with stable is below this share, 0-1, unless --force "
        "(0: off, the default).")] = None,
    force: ForceOpt = False,
    why: WhyOpt = "", who: WhoOpt = None,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False,
    output: OutputOpt = "table",
) -> None:
    """Set a model's rollout policy. The versions must be ones a worker registered (once any
    has); every change bumps the epoch workers report.

    Examples:

        batchfleet rollout set demo-mlp --stable default --canary v2 --percent 20 --why "try v2"

        batchfleet rollout set demo-mlp --stable default --shadow v2 --broker redis://localhost:6379/0

        batchfleet rollout set demo-mlp --stable default --canary v2 --percent 5 --guard-psi 0.25
    """
    output = output_format(output, as_json)
    if canary is not None and percent == 0.0:
        raise fail("--canary needs --percent P (the share of requests it takes, 0-100)")

    given = {"error_points": guard_error_points, "p99_ratio": guard_p99_ratio,
             "min_window": guard_window, "psi": guard_psi, "nan_points": guard_nan_points,
             "agreement": guard_agreement}

    async def body(rollouts: Rollouts) -> RolloutPolicy:
        guard = None
        if any(v is not None for v in given.values()):
            old = (await rollouts.status(model, history=0)).policy.guard
            guard = guard_with(old, given)
        return await rollouts.set(model, stable=stable, canary=canary, percent=percent,
                                  shadow=shadow, guard=guard, who=who or default_who(),
                                  why=why, force=force)

    _changed(_run(broker, results, namespace, body), output)


@rollout_app.command()
def promote(model: ModelArg, broker: BrokerOpt, force: ForceOpt = False, why: WhyOpt = "",
            who: WhoOpt = None, results: ResultsOpt = None,
            namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False,
            output: OutputOpt = "table") -> None:
    """Make the canary the stable version (the old stable is kept for a rollback). Refused,
    with the reason, when the policy's --guard-agreement is set and the canary's recorded
    shadow arg-max agreement with stable is below it, unless --force.

    Example:

        batchfleet rollout promote demo-mlp --why "v2 matched stable over 10k requests"
    """
    output = output_format(output, as_json)
    _changed(_run(broker, results, namespace, lambda r: r.promote(
        model, who=who or default_who(), why=why, force=force)), output)


@rollout_app.command()
def rollback(model: ModelArg, broker: BrokerOpt, why: WhyOpt = "", who: WhoOpt = None,
             results: ResultsOpt = None, namespace: NamespaceOpt = DEFAULT_NAMESPACE,
             as_json: JsonOpt = False, output: OutputOpt = "table") -> None:
    """Turn the canary and shadow off; with neither set, go back to the previous stable.

    Example:

        batchfleet rollout rollback demo-mlp --why "v2 p99 doubled"
    """
    output = output_format(output, as_json)
    _changed(_run(broker, results, namespace, lambda r: r.rollback(
        model, who=who or default_who(), why=why)), output)


@rollout_app.command()
def status(
    model: ModelArg, broker: BrokerOpt,
    history: Annotated[int, typer.Option(min=0, help="How many history entries to show.")
                       ] = 20,
    results: ResultsOpt = None,
    namespace: NamespaceOpt = DEFAULT_NAMESPACE, as_json: JsonOpt = False,
    output: OutputOpt = "table", no_headers: NoHeadersOpt = False,
) -> None:
    """Show the policy, its history (who, when, why) and each version's live counts, error
    rate and p50/p99 compute since the current epoch began.

    Examples:

        batchfleet rollout status demo-mlp

        batchfleet rollout status demo-mlp --json

        batchfleet rollout status demo-mlp -o wide
    """
    output = output_format(output, as_json)
    found = _run(broker, results, namespace, lambda r: r.status(model, history))
    if output in ("json", "yaml"):
        dump(iso_times(found.to_json()), output)
        return
    _print_status(found, wide=output == "wide", no_headers=no_headers)


VERSION_COLUMNS = (
    Column("version"), Column("role"), Column("workers"),
    Column("worker_ids", "worker IDs", wide=True), Column("as"), Column("requests"),
    Column("errors"), Column("error_rate", "error rate"), Column("p50", "p50 ms"),
    Column("p99", "p99 ms"))
HISTORY_COLUMNS = (
    Column("epoch"), Column("when", show=human_time), Column("who"), Column("action"),
    Column("policy"), Column("wire", "policy (wire)", wide=True), Column("why"))


def _version_rows(found: RolloutStatus, body: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, v in body["versions"].items():
        roles: dict[str, Any] = (v["stats"] or {}).get("roles") or {"—": None}
        epoch = (v["stats"] or {}).get("epoch")
        stale = f" (epoch {epoch})" if epoch not in (None, found.policy.epoch) else ""
        for as_role, s in roles.items():
            numbers = ({} if s is None else {
                "requests": str(s["requests"]), "errors": str(s["errors"]),
                "error_rate": f"{s['error_rate']:.2%}", "p50": _ms(s["p50_compute_ms"]),
                "p99": _ms(s["p99_compute_ms"])})
            rows.append({"version": label, "role": v["role"] or "—",
                         "workers": str(len(v["workers"])),
                         "worker_ids": ", ".join(v["workers"]), "as": as_role + stale,
                         **{k: "—" for k in ("requests", "errors", "error_rate", "p50", "p99")},
                         **numbers})
    return rows


def _print_status(found: RolloutStatus, *, wide: bool = False,
                  no_headers: bool = False) -> None:
    """The policy and convergence lines (not with ``no_headers``), versions, history."""
    body = found.to_json()
    out = console()
    if not no_headers:
        out.print(f"{found.record.name}: epoch {found.policy.epoch}, "
                  f"{describe(found.policy)}" + (f" (previous stable {found.policy.previous})"
                                                 if found.policy.previous else ""))
        out.print(f"guard: {describe_guard(found.policy.guard)}")
        applied = [w["epoch"] for w in body["workers"].values()]
        on_epoch = sum(e == found.policy.epoch for e in applied)
        out.print(f"workers: {on_epoch} of {len(applied)} live apply epoch "
                  f"{found.policy.epoch}" + ("" if found.converged
                                             else " (the others have not picked it up yet)"))
    out.print(table(_version_rows(found, body), VERSION_COLUMNS, wide=wide,
                    no_headers=no_headers, title="versions"))
    if not no_headers and not body["stats_available"]:
        out.print("stats: absent (no worker has published per-version stats yet)")
    elif not no_headers and _stale_any(body, found.policy.epoch):
        out.print("(epoch N): counted under an earlier policy; none yet under this one")
    out.print(table([{"epoch": str(h.policy.epoch), "when": h.at, "who": h.who,
                      "action": h.action, "policy": describe(h.policy),
                      "wire": json.dumps(h.policy.to_wire()), "why": h.why} for h in found.history],
                    HISTORY_COLUMNS, wide=wide, no_headers=no_headers,
                    title="history (newest first)"))


def _stale_any(body: dict[str, Any], epoch: int) -> bool:
    return any((v["stats"] or {}).get("epoch") not in (None, epoch)
               for v in body["versions"].values())


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


# ``rollout report`` (shadow comparisons) lives in its own module.
from batchfleet.cli_rollout_report import report  # noqa: E402

rollout_app.command()(report)

