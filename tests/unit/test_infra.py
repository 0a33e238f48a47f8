"""Every config file in infra/ and docker-compose.yml parses, validates and agrees with the code.

* Kubernetes manifests are checked against the Kubernetes OpenAPI schemas with
  ``kubernetes-validate`` (offline, strict: unknown fields fail).
* KEDA ScaledObjects are custom resources whose schemas ``kubernetes-validate`` does
  not ship, so they are checked structurally here: the fields KEDA's CRD defines,
  string-only trigger metadata (the CRD's ``map[string]string``), and triggers that
  name exactly the streams, topics and consumer group ``schemas.names`` builds.
* ``promtool`` is not available, so the alert rules are checked for the rule-file
  structure Prometheus expects, and every expression is parsed by ``promql-parser``.
* Every metric an alert or the dashboard uses must be one ``WorkerMetrics`` exports,
  and every exported metric must be on the dashboard and in docs/operations.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml

from batchfleet.schemas.names import LANES, Names
from batchfleet.workers.metrics import WorkerMetrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
ALERTS = INFRA / "prometheus" / "alerts.yml"
DASHBOARD = INFRA / "grafana" / "dashboards" / "batchfleet.json"
OPERATIONS = ROOT / "docs" / "operations.md"
#: Oldest Kubernetes the manifests must be valid for (CronJob timeZone and the PDB's
#: unhealthyPodEvictionPolicy are GA by then).
K8S_VERSION = "1.31"
#: Metrics the rules may use that come from elsewhere: Prometheus itself and KEDA's operator.
EXTERNAL_METRICS = {"up", "keda_scaler_active"}
#: What the issue asks the alerts to cover.
REQUIRED_ALERTS = {"BatchfleetInteractiveRequestsWaiting", "BatchfleetDeadLettersGrowing",
                   "BatchfleetBreakerOpen", "BatchfleetHighErrorRate", "BatchfleetNoWorkers"}
#: ScaledObject spec fields in KEDA's CRD (keda.sh/v1alpha1).
SCALED_OBJECT_FIELDS = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "idleReplicaCount",
                        "minReplicaCount", "maxReplicaCount", "advanced", "fallback", "triggers",
                        "initialCooldownPeriod"}
TRIGGER_FIELDS = {"type", "name", "metadata", "authenticationRef", "metricType",
                  "useCachedMetrics"}
#: The trigger metadata our ScaledObjects may use, per scaler (KEDA's documented parameters).
KEDA_METADATA = {
    "kafka": {"bootstrapServers", "consumerGroup", "topic", "lagThreshold",
              "activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers",
              "scaleToZeroOnInvalidOffset", "excludePersistentLag", "limitToPartitionsWithLag",
              "version", "partitionLimitation", "sasl", "tls"},
    "redis-streams": {"address", "host", "port", "stream", "consumerGroup", "pendingEntriesCount",
                      "streamLength", "lagCount", "activationLagCount", "databaseIndex",
                      "enableTLS", "unsafeSsl", "addressFromEnv", "hostFromEnv", "portFromEnv",
                      "usernameFromEnv", "passwordFromEnv"},
    "prometheus": {"serverAddress", "query", "threshold", "activationThreshold", "namespace",
                   "customHeaders", "ignoreNullValues", "queryParameters", "unsafeSsl",
                   "authModes"},
}


# --- helpers ---------------------------------------------------------------------


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _documents() if doc["kind"] == kind]


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in _by_kind(kind) if d["metadata"]["name"] == name]
    return found


def _exported() -> dict[str, set[str]]:
    """Metric family -> the names it is exposed under (``_total``, ``_bucket``, ...)."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count", "_created")}
    return {family.name: {family.name + s for s in suffixes[family.type]}
            for family in WorkerMetrics().registry.collect()}


def _exposed_names() -> set[str]:
    return set().union(*_exported().values())


def _metric_names(expr: str) -> set[str]:
    found: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _yaml(ALERTS)["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    """Every panel query, with the dashboard's variables replaced by sample values."""
    dash = json.loads(DASHBOARD.read_text())
    values = {"__rate_interval": "5m", "model": ".*"}
    for var in dash["templating"]["list"]:
        if var["type"] == "custom":
            values[var["name"]] = var["current"]["value"]

    def substitute(expr: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)

    return [substitute(target["expr"]) for panel in dash["panels"]
            for target in panel.get("targets", [])]


def _env(doc: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in doc["data"].items()}


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --- every file parses --------------------------------------------------------------


def test_every_yaml_and_json_file_parses() -> None:
    files = [COMPOSE, *sorted(INFRA.rglob("*.y*ml")), *sorted(INFRA.rglob("*.json"))]
    assert len(files) >= 11
    for path in files:
        docs = (list(yaml.safe_load_all(path.read_text())) if path.suffix != ".json"
                else [json.loads(path.read_text())])
        assert docs and all(d is not None for d in docs), path


# --- Kubernetes ----------------------------------------------------------------------


def test_kubernetes_manifests_match_the_kubernetes_schemas() -> None:
    checked = set()
    for path, doc in _documents():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # custom resources: test_keda_scaled_objects_have_the_crd_shape
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked.add((path.name, doc["kind"]))
    assert {("worker-deployment.yaml", "Deployment"), ("worker-pdb.yaml", "PodDisruptionBudget"),
            ("worker-config.yaml", "ConfigMap"), ("bulk-cronjob.yaml", "CronJob")} <= checked


def test_the_schema_check_is_strict_enough_to_catch_a_typo() -> None:
    doc = _one("Deployment", "batchfleet-worker")
    doc["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_keda_scaled_objects_have_the_crd_shape() -> None:
    scaled = _by_kind("ScaledObject")
    assert {s["metadata"]["name"] for s in scaled} == {"batchfleet-worker-kafka",
                                                      "batchfleet-worker-redis"}
    deployments = {d["metadata"]["name"] for d in _by_kind("Deployment")}
    for so in scaled:
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        spec = so["spec"]
        assert set(spec) <= SCALED_OBJECT_FIELDS, set(spec) - SCALED_OBJECT_FIELDS
        assert spec["scaleTargetRef"]["name"] in deployments
        assert spec["minReplicaCount"] == 0 < spec["maxReplicaCount"]  # scale to zero
        for key in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
            assert isinstance(spec[key], int), key
        assert set(spec["fallback"]) == {"failureThreshold", "replicas"}
        assert set(spec["advanced"]) == {"horizontalPodAutoscalerConfig"}
        for trigger in spec["triggers"]:
            assert set(trigger) <= TRIGGER_FIELDS
            meta = trigger["metadata"]
            assert all(isinstance(v, str) for v in meta.values()), meta  # map[string]string
            assert set(meta) <= KEDA_METADATA[trigger["type"]], meta
            assert all(v.isdigit() for k, v in meta.items()
                       if k.endswith(("Threshold", "Length", "Count", "Index")))


def test_keda_triggers_cover_every_model_and_lane_with_the_codes_names() -> None:
    env = _env(_one("ConfigMap", "batchfleet-worker"))
    names = Names(env["BATCHFLEET_NAMESPACE"])
    models = env["BATCHFLEET_MODELS"].split(",")
    redis_host = env["BATCHFLEET_RESULTS"].split("://", 1)[1].split("/", 1)[0]

    kafka = _one("ScaledObject", "batchfleet-worker-kafka")["spec"]
    metas = [t["metadata"] for t in kafka["triggers"]]
    assert {t["type"] for t in kafka["triggers"]} == {"kafka"}
    assert sorted(m["topic"] for m in metas) == sorted(
        names.topic(m, lane) for m in models for lane in LANES)
    assert {m["consumerGroup"] for m in metas} == {names.consumer_group}
    assert {m["bootstrapServers"] for m in metas} == {
        env["BATCHFLEET_BROKER"].removeprefix("kafka://")}
    # workers start new groups at the earliest offset; KEDA must count lag the same way
    assert {m["offsetResetPolicy"] for m in metas} == {"earliest"}
    # KEDA caps replicas at a topic's partitions; a higher max would only mislead
    assert kafka["maxReplicaCount"] <= int(env["BATCHFLEET_KAFKA_PARTITIONS"])

    redis = _one("ScaledObject", "batchfleet-worker-redis")["spec"]
    metas = [t["metadata"] for t in redis["triggers"] if t["type"] == "redis-streams"]
    assert {t["type"] for t in redis["triggers"]} == {"redis-streams", "prometheus"}
    # sharded lanes (--lane-shards): KEDA takes the max across triggers, so one more trigger
    # scales on the backlog summed over every lane and shard (the gauge sums a lane's shards)
    (summed,) = [t["metadata"] for t in redis["triggers"] if t["type"] == "prometheus"]
    assert summed["query"].startswith("sum(") and "batchfleet_backlog" in summed["query"]
    assert sorted(m["stream"] for m in metas) == sorted(
        names.stream(m, lane) for m in models for lane in LANES)
    assert {m["address"] for m in metas} == {redis_host}
    # XLEN mode: a consumerGroup would switch to the pending list, which cannot wake from 0
    assert all("consumerGroup" not in m and "streamLength" in m for m in metas)


def test_worker_deployment_requests_a_gpu_and_outlasts_the_drain() -> None:
    env = _env(_one("ConfigMap", "batchfleet-worker"))
    deployment = _one("Deployment", "batchfleet-worker")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "replicas" not in deployment["spec"]  # KEDA owns it
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert env["BATCHFLEET_DEVICE"] == "cuda"
    assert {"configMapRef": {"name": "batchfleet-worker"}} in container["envFrom"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(env["BATCHFLEET_GRACE_S"])
    port = int(env["BATCHFLEET_METRICS_PORT"])
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pdb = _one("PodDisruptionBudget", "batchfleet-worker")
    assert pdb["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]


# --- Prometheus rules ----------------------------------------------------------------


def test_alert_rules_have_the_rule_file_structure_and_valid_promql() -> None:
    doc = _yaml(ALERTS)
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit", "labels"} and group["name"]
    rules = _rules()
    assert {r["alert"] for r in rules} >= REQUIRED_ALERTS
    assert len({r["alert"] for r in rules}) == len(rules)
    headings = {_slug(line.lstrip("#")) for line in OPERATIONS.read_text().splitlines()
                if line.startswith("### ")}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        promql_parser.parse(rule["expr"])  # raises on a syntax error
        if "for" in rule:
            promql_parser.parse_duration(rule["for"])
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor == rule["alert"].lower()
        assert anchor in headings, f"no runbook heading for {rule['alert']}"


def test_prometheus_config_loads_the_rules_and_scrapes_the_workers() -> None:
    config = _yaml(INFRA / "prometheus" / "prometheus.yml")
    compose = _yaml(COMPOSE)["services"]
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert "./infra/prometheus:/etc/prometheus:ro" in compose["prometheus"]["volumes"]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "batchfleet-worker"]
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) <= set(compose) and sd["port"] == 9100


# --- metric names ------------------------------------------------------------------------


def test_alerts_and_dashboard_use_only_metrics_the_workers_export() -> None:
    exposed = _exposed_names()
    assert {"batchfleet_requests_total", "batchfleet_batch_size_bucket",
            "batchfleet_backlog"} <= exposed
    used = {name for rule in _rules() for name in _metric_names(rule["expr"])}
    assert used - exposed <= EXTERNAL_METRICS, used - exposed - EXTERNAL_METRICS
    on_dashboard = {name for expr in _dashboard_exprs() for name in _metric_names(expr)}
    assert on_dashboard <= exposed, on_dashboard - exposed


def test_every_metric_is_on_the_dashboard_and_in_the_operations_doc() -> None:
    on_dashboard = {name for expr in _dashboard_exprs() for name in _metric_names(expr)}
    doc = OPERATIONS.read_text()
    for family, names in _exported().items():
        assert names & on_dashboard, f"{family} is on no dashboard panel"
        shown = f"`{family}_total`" if f"{family}_total" in names else f"`{family}`"
        assert shown in doc, f"{shown} is not listed in docs/operations.md"


# --- Grafana -------------------------------------------------------------------------------


def test_grafana_provisioning_points_at_the_dashboard_and_the_data_source() -> None:
    prov = INFRA / "grafana" / "provisioning"
    (source,) = _yaml(prov / "datasources" / "prometheus.yml")["datasources"]
    (provider,) = _yaml(prov / "dashboards" / "batchfleet.yml")["providers"]
    grafana = _yaml(COMPOSE)["services"]["grafana"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    assert f"./infra/grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]
    assert "./infra/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "batchfleet"
    sources = {json.dumps(p["datasource"], sort_keys=True) for p in dash["panels"]
               if "datasource" in p}
    assert sources == {json.dumps({"type": "prometheus", "uid": source["uid"]}, sort_keys=True)}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24


# --- Compose -----------------------------------------------------------------------------


def test_compose_runs_a_scalable_observable_fleet() -> None:
    compose = _yaml(COMPOSE)
    services = compose["services"]
    assert {"kafka", "redis", "worker", "gateway", "webhooks", "prometheus", "grafana"} <= set(
        services)
    assert services["gateway"]["command"][0] == "gateway"
    assert services["webhooks"]["command"][:2] == ["webhooks", "worker"]
    kafka_env = services["kafka"]["environment"]
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert "--appendonly" in services["redis"]["command"]
    for name in ("worker", "worker-redis"):
        worker = services[name]
        env = worker["environment"]
        assert "container_name" not in worker  # --scale worker=N
        assert env["BATCHFLEET_METRICS_PORT"] == "9100"
        grace = float(worker["stop_grace_period"].removesuffix("s"))
        assert grace > float(env["BATCHFLEET_GRACE_S"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), volume
            else:
                assert source in compose["volumes"], volume
