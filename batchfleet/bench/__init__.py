"""``batchfleet bench``: the fleet measured against its own ceiling and a naive RQ baseline.

Every number comes from one run on one machine, so the ratios are the headline:
end to end over Redis and Kafka, versus (a) the model alone in a tight loop at
the same batch size and (b) RQ doing one job per request on the same Redis.
Workers run as real subprocesses (``batchfleet.processes.WorkerProcess``), so
their CPU time can be read from ``/proc`` and they get their own GIL.

Modules, one job each: ``plan`` (what to run), ``procstat`` (CPU time of
processes), ``samples`` (per-request records and their summaries),
``ceiling``, ``naive_rq`` and ``rq_jobs`` (the baselines), ``fleet`` (servers
and a worker), ``closed_loop`` and ``open_loop`` (the two load shapes),
``scenario`` (one model on one transport), ``sweep``, ``plot``, ``profiling``
(py-spy), ``targets``, ``report`` and ``run`` (the whole thing).
"""
