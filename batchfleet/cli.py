"""The ``batchfleet`` command line: the one place settings are read from the environment.

Every option that has a ``BATCHFLEET_*`` variable reads it here, through
typer's ``envvar``; everything below receives plain values or a settings object.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import structlog
import typer
from typer._click import exceptions as click_errors  # typer vendors click
from typer.core import TyperGroup, TyperOption

from batchfleet import __version__
from batchfleet.cli_bench import bench
from batchfleet.cli_bulk import bulk_app
from batchfleet.cli_console import console_command
from batchfleet.cli_control import cancel, check, lane_app
from batchfleet.cli_dlq import dlq_app
from batchfleet.cli_gateway import gateway_app
from batchfleet.cli_models import models_app
from batchfleet.cli_pipelines import pipelines_app
from batchfleet.cli_requests import result, submit
from batchfleet.cli_rollout import rollout_app
from batchfleet.cli_status import status
from batchfleet.cli_webhooks import webhooks_app
from batchfleet.options import (
    EXIT_FAILED,
    JsonOpt,
    ResultsOpt,
    error_line,
    exit_code,
    fail,
    handled,
    missing_extra,
)
from batchfleet.output import OutputOpt, output_format
from batchfleet.schemas.settings import BROKER


class _Commands(TyperGroup):
    """The one place every command's errors become one line and an exit code.

    Subcommands import their extras lazily; a missing one is one line naming the extra.
    The project's errors, and driver or network errors that reach this far, are one
    line too (the README's "Exit codes"); ``--debug`` re-raises for the traceback.
    """

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        """A usage error (unknown flag or command, bad value) is the same one ``error:``
        line and exit 2 as every other refusal, not click's boxed usage block."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args,
                                **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args,
                                **extra)
        except click_errors.NoArgsIsHelpError as exc:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except click_errors.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            message = " ".join(exc.format_message().split()).rstrip(".") + where
            status = exc.exit_code
        except click_errors.ClickException as exc:
            message, status = " ".join(exc.format_message().split()), exc.exit_code
        except typer.Abort:
            message, status = "aborted", EXIT_FAILED
        else:
            sys.exit(code if isinstance(code, int) else 0)
        # printed here, not with ``fail``: that one returns the Exit a command raises
        typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
        sys.exit(status)

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        try:
            return super().invoke(ctx)
        except typer.Exit as done:
            # a command that turned an error into its one line (``raise fail(...) from
            # exc``): with --debug, the traceback of what it caught comes first
            cause = done.__cause__
            if ctx.meta.get(_DEBUG) and done.exit_code and cause is not None:
                traceback.print_exception(cause, file=sys.stderr)
            raise
        except ModuleNotFoundError as exc:
            exit_ = missing_extra(ctx.invoked_subcommand or "", exc)
            if exit_ is None:
                raise
            raise exit_ from None
        except BrokenPipeError:  # `batchfleet ... | head`: the reader left; nothing to say
            _quiet_stdout()
            raise SystemExit(0) from None
        except (Exception, BaseExceptionGroup) as exc:  # filtered just below
            if not handled(exc) or ctx.meta.get(_DEBUG):
                raise
            message, code = error_line(exc)
            raise fail(message, code) from None


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush into the closed pipe
    does not print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """A flag takes no value: no ``<bool>`` beside it in --help (``--json true`` is wrong)."""
    if self.is_flag and self.metavar is None:
        return None
    return _option_type(self, ctx) if _option_type is not None else None


# typer 0.29 added this hook; an older typer (pyproject admits 0.26) keeps its own help
# text rather than failing at import.
_option_type: Callable[[TyperOption, Any], str | None] | None = getattr(
    TyperOption, "display_type_rich", None)
if _option_type is not None:
    TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def _default_text(self: TyperOption, *, ctx: Any, show_default_is_str: bool,
                  default_value: Any) -> str:
    """``[default: 64]`` whether the default is a value or a described one (the worker's
    options describe theirs: their real default is None, "not given"); click would
    write ``[default: (64)]`` for the second."""
    if show_default_is_str:
        return str(self.show_default)
    return _default_string(self, ctx=ctx, show_default_is_str=False,
                           default_value=default_value)


_default_string = TyperOption._get_default_string
TyperOption._get_default_string = _default_text  # type: ignore[method-assign]
_DEBUG = "batchfleet.debug"
#: Commands that run on and log as they go; the others are one-shot.
_SERVICES = frozenset({"worker", "gateway", "console", "webhooks", "bulk", "bench", "demo"})


app = typer.Typer(
    name="batchfleet",
    cls=_Commands,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"batchfleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option(
        "--debug", envvar="BATCHFLEET_DEBUG",
        help="On an error, show the full traceback, not just one line.")] = False,
) -> None:
    """Asynchronous micro-batching PyTorch inference workers fed by Redis Streams or Kafka.

    Exit codes: 0 ok, 1 the operation failed (or Redis/Kafka could not be reached),
    2 refused, nothing done (a bad flag, URL, input or setting); 3 pending, 4 no such ID
    (see each command's --help and the README's table).

    Examples:

        batchfleet demo

        batchfleet --debug status --broker redis://localhost:6379/0
    """
    ctx.meta[_DEBUG] = debug
    # logs go to stderr, so stdout is only the command's output and pipes into jq (the
    # worker and bulk configure their own, on stderr too). A one-shot command's error is
    # its one line: the SDK's reconnect warnings before it show only with --debug.
    saved = structlog.get_config()
    ctx.call_on_close(lambda: structlog.configure(**saved))
    quiet = not debug and ctx.invoked_subcommand not in _SERVICES
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.ERROR if quiet else logging.NOTSET))
    if ctx.invoked_subcommand != "worker":
        # a client's own one-line error says it all; aiokafka would log its raw connect
        # failure first (the worker configures its logging itself and keeps these)
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


class _WorkerCommand(typer.core.TyperCommand):
    """The worker command, its options generated from the settings on first use.

    Generating them imports the worker package (torch), so it waits until ``worker``
    itself is parsed or helped: the other commands, and a slim install, never pay it.
    """

    _generated = False

    def _generate(self) -> None:
        if self._generated:
            return
        from typer.main import get_command_from_info
        from typer.models import CommandInfo

        from batchfleet.cli_worker import worker_function

        inner = get_command_from_info(CommandInfo(callback=worker_function(_run_worker)),
                                      pretty_exceptions_short=True, rich_markup_mode="markdown")
        self.params = list(inner.params)
        self.callback = inner.callback
        self._generated = True

    def get_params(self, ctx: Any) -> Any:
        self._generate()
        return super().get_params(ctx)


@app.command(cls=_WorkerCommand)
def worker() -> None:
    """Run a worker: fetch, micro-batch, compute, write results, ack.

    Every option also reads its BATCHFLEET_* variable; a flag wins over the variable,
    the variable over the default. Per-model options take VALUE (every model) or
    MODEL[@VERSION]=VALUE (one model), repeatable; their variable takes the same
    entries comma-separated, e.g. BATCHFLEET_RETRY="demo-mlp=5:0.1,demo-encoder=2".

    Examples:

        batchfleet worker --broker redis://localhost:6379/0 --model demo-mlp

        batchfleet worker --broker kafka://kafka:9092 --results redis://redis:6379/0 -m demo-encoder

        batchfleet worker --broker redis://localhost:6379/0 --model fraud=mypkg.models:build

        batchfleet worker -m net=model.pt2 --input-spec net=float32[3,224,224] --app-dir src

        batchfleet worker -m demo-mlp -m demo-encoder --retry 5 --retry demo-encoder=2:0.2:10

        batchfleet worker -m demo-encoder --device cuda --processes 2 --metrics-port 9100

        batchfleet worker -m fraud=mypkg.models:build --fallback 'fraud=rules:mypkg.rules:score'

        batchfleet worker --broker redis://:secret@localhost:6379/0 --print-config
    """


def _no_raw_connect_failures(record: logging.LogRecord) -> bool:
    """aiokafka's own "Unable connect to ..." line: the worker's error line names the
    broker and what to do, so this one only comes first and in another format."""
    return not str(record.msg).startswith("Unable connect")


def _run_worker(ctx: typer.Context, values: dict[str, Any]) -> None:
    import os

    from batchfleet.cli_worker import config_lines, resolve, source_of
    from batchfleet.schemas.errors import BatchfleetError, ConfigError

    try:
        settings, process = resolve(values)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    if values.get("print_config"):
        for line in config_lines(settings, process, source_of(ctx)):
            typer.echo(line)
        raise typer.Exit(0)

    if process.processes > 1:  # a parent that runs the workers, and never torch itself
        from batchfleet.worker_group import run_group

        if "worker" not in sys.argv[1:]:  # called in-process: no command line to repeat
            raise fail("--processes runs from the batchfleet command line only")
        options = sys.argv[sys.argv.index("worker", 1) + 1:]
        raise typer.Exit(run_group(options, process.processes, settings.worker_id,
                                   settings.metrics_port, settings.metrics_host,
                                   settings.grace_s))

    # OpenMP reads these once, when torch loads it: set them before anything imports torch.
    from batchfleet.workers.openmp import openmp_defaults

    os.environ.update(openmp_defaults(os.environ, process.torch_threads))

    from batchfleet.workers import Worker
    from batchfleet.workers.logs import configure_logging

    try:
        configure_logging(process.log_format, process.log_level)
        if process.log_level != "debug":  # our own line says the broker is unreachable
            logging.getLogger("aiokafka").addFilter(_no_raw_connect_failures)
        Worker(settings).run()
    except KeyboardInterrupt:  # before the worker handles signals itself: models loading
        compute = sys.modules.get("batchfleet.workers.compute")
        if compute is not None:
            compute.abandon_loading_models()
        raise
    except BatchfleetError as exc:
        # a port taken, a store or broker not answering, a model that will not load: one
        # line says which (exit 2 when a setting is wrong, as a model no one can load);
        # the traceback helps only whoever debugs batchfleet itself
        if process.debug:
            raise
        raise fail(str(exc), exit_code(exc)) from exc


@app.command()
def demo(
    broker: Annotated[str | None, typer.Option(
        BROKER.flag, envvar=BROKER.env, metavar=BROKER.metavar,
        help=f"{BROKER.help} 'kafka' starts the bundled Kafka-compatible broker. "
             "Default: an embedded Redis on a free port.")] = None,
    results: ResultsOpt = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="How many requests.")
                        ] = 10_000,
    model: Annotated[str, typer.Option("--model", "-m", help="demo-mlp or demo-encoder.")
                     ] = "demo-mlp",
    max_batch_size: Annotated[int, typer.Option(help="Worker's max batch size.")] = 64,
    max_wait_ms: Annotated[float, typer.Option(help="Worker's max wait.")] = 5.0,
    timeout_s: Annotated[float, typer.Option(help="Give up waiting after this long.")] = 300.0,
    output: OutputOpt = "table",
    as_json: JsonOpt = False,
) -> None:
    """Run the whole pipeline end to end and print throughput and latency.

    With no broker configured it starts a real Redis on a free loopback port,
    a worker process, submits --requests requests and waits for every result.
    Exits non-zero if any request lacks a terminal result.

    Examples:

        batchfleet demo

        batchfleet demo --requests 2000 --model demo-encoder

        batchfleet demo --broker kafka

        batchfleet demo --broker redis://localhost:6379/0
    """
    from batchfleet.connectors.urls import BrokerURL, results_url_for
    from batchfleet.demo import DemoOptions, demo_inputs, run_demo
    from batchfleet.schemas.errors import ConfigError

    fmt = output_format(output, as_json)
    if fmt == "yaml":
        raise fail("demo prints -o table (or wide) or -o json")
    try:  # what was asked, checked before anything starts: exit 2
        if requests < 1:
            raise ConfigError("--requests must be at least 1")
        demo_inputs(model, 1)
        if broker not in (None, "kafka"):
            results_url_for(BrokerURL.parse(broker), results)
        elif results is not None:
            results_url_for(BrokerURL.parse("redis://127.0.0.1:6379/0"), results)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    try:  # past the checks, a worker that cannot start is a failed run
        code = run_demo(DemoOptions(broker, results, requests, model, max_batch_size,
                                    max_wait_ms, timeout_s, fmt == "json"))
    except ConfigError as exc:
        raise fail(str(exc), EXIT_FAILED) from exc
    raise typer.Exit(code)


app.add_typer(dlq_app, name="dlq")
app.add_typer(bulk_app, name="bulk")
app.add_typer(gateway_app, name="gateway")
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(models_app, name="models")
app.add_typer(rollout_app, name="rollout")
app.add_typer(pipelines_app, name="pipelines")
app.command()(submit)
app.command()(result)
app.command()(bench)
app.command()(status)
app.command("console")(console_command)
app.command()(cancel)
app.command()(check)
app.add_typer(lane_app, name="lane")


def main() -> None:
    app(prog_name="batchfleet")


if __name__ == "__main__":
    main()
