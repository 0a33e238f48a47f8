"""The servers and the worker one bench scenario runs against.

Redis (and, for Kafka scenarios, the bundled Tansu broker) are started on
free loopback ports unless URLs are given; each scenario gets its own worker
process and its own namespace, so no stream, topic or key is shared between
scenarios and a slow drain in one cannot leak into the next.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from batchfleet.bench.procstat import children, process_name
from batchfleet.connectors.embedded_redis import EmbeddedRedis
from batchfleet.connectors.redis_client import local_server_pid
from batchfleet.processes import WorkerProcess


@dataclass(frozen=True, slots=True)
class Services:
    """Where the broker(s) and the result store are; Kafka only when a scenario needs it.

    ``worker_env`` is added to every worker's environment (e.g. OMP_NUM_THREADS).
    """

    redis_url: str
    kafka_url: str | None
    worker_env: tuple[tuple[str, str], ...] = ()

    def broker_for(self, transport: str) -> str:
        if transport == "kafka":
            if self.kafka_url is None:
                raise RuntimeError("no Kafka broker was started for a kafka scenario")
            return self.kafka_url
        return self.redis_url

    def server_pids(self) -> dict[str, int]:
        """PIDs of the servers this process started, and of a ``--redis`` server running
        on this machine (its CPU would otherwise count as other people's load: windows
        retried as noisy, and the report's "machine was busy" warning). A remote one, or
        a Kafka given by URL, cannot be measured."""
        # /proc/PID/comm is cut at 15 characters ("tansu-v0.6.0-51"), so match prefixes.
        prefixes = (("redis-server", "redis"), ("tansu", "kafka"))
        found: dict[str, int] = {}
        for pid in children(os.getpid()):
            name = process_name(pid)
            for prefix, label in prefixes:
                if name.startswith(prefix):
                    found[label] = pid
        if "redis" not in found:
            local = local_redis_pid(self.redis_url)
            if local is not None:
                found["redis"] = local
        return found


_LOCAL_PIDS: dict[str, int | None] = {}


def local_redis_pid(url: str) -> int | None:
    """The PID of the Redis at ``url`` where it runs on this machine: a Unix socket or a
    loopback host whose ``INFO`` names a process here that is a ``redis-server``. None
    for anything else, or when it does not answer. Asked once per URL."""
    if url not in _LOCAL_PIDS:
        pid = local_server_pid(url)
        # another machine's PID (a tunnel, a container's port) is no process here
        _LOCAL_PIDS[url] = pid if pid is not None and process_name(pid).startswith(
            "redis-server") else None
    return _LOCAL_PIDS[url]


@contextmanager
def services(redis_url: str | None, kafka_url: str | None, need_kafka: bool,
             worker_env: tuple[tuple[str, str], ...] = ()) -> Iterator[Services]:
    """Start whatever was not given: an embedded Redis, and Tansu if Kafka is needed."""
    with ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(EmbeddedRedis()).url
        if need_kafka and kafka_url is None:
            from batchfleet.connectors.embedded_kafka import EmbeddedKafka

            kafka_url = stack.enter_context(EmbeddedKafka()).url
        yield Services(redis_url, kafka_url, worker_env)


def new_namespace(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:6]}"


@contextmanager
def worker(svc: Services, transport: str, model: str, max_batch_size: int,
           max_wait_ms: float, namespace: str, extra_args: tuple[str, ...] = ()
           ) -> Iterator[WorkerProcess]:
    """A real ``batchfleet worker`` subprocess, warmed up; SIGTERM-drained on exit.

    ``extra_args`` are further worker options (e.g. ``--latency-slo-ms 20``)."""
    with workers(svc, transport, model, max_batch_size, max_wait_ms, namespace,
                 extra_args) as procs:
        yield procs[0]


@contextmanager
def workers(svc: Services, transport: str, model: str, max_batch_size: int,
            max_wait_ms: float, namespace: str, extra_args: tuple[str, ...] = (),
            count: int = 1) -> Iterator[list[WorkerProcess]]:
    """``count`` workers on one namespace (one consumer group), started together.

    Several processes on one GPU are the remedy for a worker whose own Python is
    the bound (docs/performance.md, "On a GPU"): each has its own interpreter, so
    the compute threads no longer wait for one event loop's GIL.
    """
    with ExitStack() as stack:
        procs = [stack.enter_context(WorkerProcess(
            svc.broker_for(transport), svc.redis_url, models=(model,), namespace=namespace,
            log_level="warning", env=dict(svc.worker_env), keep_log=False, device="auto",
            extra_args=("--max-batch-size", str(max_batch_size),
                        "--max-wait-ms", str(max_wait_ms), *extra_args)))
            for _ in range(count)]
        for proc in procs:
            proc.wait_ready()
        yield procs
