"""The deploy stack (deploy/) agrees with the daemon it deploys.

* every metric the alert rules and the Grafana dashboard query is one the metrics module defines, with
  labels it has (and one a live daemon exports: checked in tests/integration/daemon/test_metrics.py);
* the compose service and the Kubernetes Deployment configure the daemon with names its config model
  accepts: their TOML, the image's environment and theirs load with ``load_settings``;
* the Kubernetes objects hang together (probes on /live and /ready, one replica replaced with Recreate,
  non-root, ports, volumes, the token file), and compose's Kafka is a consistent single KRaft node.

Nothing is run in Docker or Kubernetes here (no engine, no cluster): files are parsed and cross-checked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
PREFIX = "source_backfill_"
METRIC = re.compile(r"\bsource_backfill_[a-z_]+")
SELECTOR = re.compile(r"\b(source_backfill_[a-z_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
#: SOURCE_BACKFILL_* variables that are not configuration: read by connectors/jars.py.
NOT_CONFIG = {"SOURCE_BACKFILL_JARS", "SOURCE_BACKFILL_JVM_POM"}


# -- what the alerts and the dashboard query ---------------------------------------------------------------
def _alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _dashboard() -> dict[str, Any]:
    import json

    return json.loads((DEPLOY / "grafana" / "source-backfill.json").read_text())


def _dashboard_exprs() -> list[str]:
    board = _dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def _queried() -> set[str]:
    return {m for e in _alert_exprs() + _dashboard_exprs() for m in METRIC.findall(e)}


def _defined() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposition name -> (type, label names) of every metric in source_backfill/metrics.py."""
    from source_backfill import metrics

    found = {}
    for value in vars(metrics).values():
        if not hasattr(value, "_labelnames") or not hasattr(value, "_type"):
            continue
        kind, name = value._type, value._name  # noqa: SLF001
        found[f"{name}_total" if kind == "counter" else name] = (kind, tuple(value._labelnames))  # noqa: SLF001
    return found


def test_the_dashboard_is_what_its_generator_writes():
    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "grafana" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (DEPLOY / "grafana" / "source-backfill.json").read_text(), \
        "deploy/grafana/source-backfill.json is stale: run python deploy/grafana/dashboard.py"


def test_the_alerts_and_the_dashboard_cover_what_operators_watch():
    alerts = {m for e in _alert_exprs() for m in METRIC.findall(e)}
    assert {PREFIX + m for m in ("job_rows", "job_backfilling", "job_lag_offsets", "source_errors_total",
                                 "epoch_duration_seconds_bucket", "epoch_lag_seconds",
                                 "job_data_loss_offsets_total", "job_failed")} <= alerts
    board = {m for e in _dashboard_exprs() for m in METRIC.findall(e)}
    assert {PREFIX + m for m in ("job_rows", "job_eta_seconds", "job_splits", "job_lag_offsets",
                                 "job_split_lag_max_offsets", "split_lag_offsets",
                                 "epoch_duration_seconds_bucket", "source_errors_total", "job_failed",
                                 "job_data_loss_offsets_total", "commit_conflicts_total",
                                 "history_reads_ahead_total")} <= board


def test_every_dashboard_panel_on_job_series_follows_the_job_variable():
    """A panel that reads a per-job metric shows only the jobs chosen at the top (its selector uses $job)."""
    defined = _defined()
    board = _dashboard()
    for p in board["panels"]:
        for t in p.get("targets", []):
            filtered = {name for name, matchers in SELECTOR.findall(t["expr"]) if "$job" in matchers}
            for name in METRIC.findall(t["expr"]):
                base = name if name in defined else name.rsplit("_", 1)[0]
                if "job" in defined.get(base, ("", ()))[1]:
                    assert name in filtered, f'panel "{p["title"]}": {name} not filtered by $job'
    names = {p["title"] for p in board["panels"]}
    assert {"Table rows/s by stage", "Table jobs: versions behind", "Live latency p50 / p99"} <= names
    state = next(p for p in board["panels"] if p["title"] == "Job state")
    words = {m["text"] for m in state["fieldConfig"]["defaults"]["mappings"][0]["options"].values()}
    assert words == {"finished", "backfilling", "failed"}  # a word per state, not a raw 0/1 line


def test_the_namespace_variable_chooses_the_jobs_every_job_panel_shows():
    """Namespaces (tenants): the job series carry no namespace label, and default's jobs no name prefix,
    so the namespace goes through the job variable: its options are the chosen namespaces' jobs (from
    job_namespace), its All their regex (not .*, which would be every job), and every job selector is
    ``job=~"$job"`` (the previous test: every job series has one)."""
    defined = _defined()
    assert defined[PREFIX + "job_namespace"][1] == ("job", "namespace")
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    names = list(variables)
    assert names.index("namespace") < names.index("job")  # job's query reads $namespace: refreshed after it
    namespace, job = variables["namespace"], variables["job"]
    assert namespace["query"] == f"label_values({PREFIX}job_namespace, namespace)"
    assert namespace["includeAll"] and namespace["multi"]
    assert job["query"] == f'label_values({PREFIX}job_namespace{{namespace=~"$namespace"}}, job)'
    assert job["includeAll"] and job["allValue"] is None
    for p in _dashboard()["panels"]:
        for t in p.get("targets", []):
            for _, matchers in SELECTOR.findall(t["expr"]):
                for label, value in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers):
                    if "$job" in value:  # through the job variable alone (the sources' own errors aside)
                        assert (label, value) in {("job", "$job"), ("job", "$job|")}, (p["title"], t["expr"])
                    assert "$namespace" not in value, (p["title"], t["expr"])  # no job series has it


def test_the_alerts_read_no_per_split_series():
    """Per-split series exist only for the splits metrics.per_split picks: a rule on them misses the rest."""
    per_split = {PREFIX + m for m in ("history_rows_total", "live_rows_total", "split_stage",
                                      "split_lag_offsets", "data_loss_offsets_total")}
    assert {m for e in _alert_exprs() for m in METRIC.findall(e)} & per_split == set()


def test_selectors_use_labels_the_metrics_have():
    defined = _defined()
    for expr in _alert_exprs() + _dashboard_exprs():
        for name, matchers in SELECTOR.findall(expr):
            base = name
            if name not in defined and name.endswith(HISTOGRAM_SUFFIXES):
                base = name.rsplit("_", 1)[0]
            assert base in defined, f"{name} is not defined in source_backfill/metrics.py ({expr})"
            allowed = set(defined[base][1]) | {"instance"} | ({"le"} if name.endswith("_bucket") else set())
            used = set(MATCHER.findall(matchers))
            assert used <= allowed, f"{name}{{{matchers}}}: labels {used - allowed} unknown ({expr})"


def _exported_families(text: str) -> set[str]:
    """Names a scrape of ``text`` makes queryable, from its ``# TYPE`` lines.

    prometheus_client writes HELP/TYPE for a labelled metric before any of its series exists, so families
    whose event has not happened in the run (job_failed, data_loss_offsets_total, ...) are there too.
    """
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update(name + s for s in HISTOGRAM_SUFFIXES)
    return names


# The check that every metric queried here is exported by a live daemon runs inside the daemon's metrics
# scenario (tests/integration/daemon/test_metrics.py), which already has one running: a daemon costs ~20 s.


# -- configuration the daemon receives ----------------------------------------------------------------------
def _config_field(name: str) -> bool:
    """Whether ``SOURCE_BACKFILL_<A>__<B>...`` names a field of the config model (dict fields: any key)."""
    from pydantic import BaseModel

    from source_backfill.config import Settings

    parts = name.removeprefix("SOURCE_BACKFILL_").lower().split("__")
    model: Any = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            return False
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        origin = getattr(annotation, "__origin__", None)
        return i == len(parts) - 1 or (origin is dict and i == len(parts) - 2)
    return False


def test_config_field_names():  # the helper the next tests rely on
    assert _config_field("SOURCE_BACKFILL_API__TOKEN")
    assert _config_field("SOURCE_BACKFILL_API__TOKEN_FILE")
    assert _config_field("SOURCE_BACKFILL_SPARK__CONF__spark.kubernetes.driver.pod.name")
    assert not _config_field("SOURCE_BACKFILL_API__TOKNE")
    assert not _config_field("SOURCE_BACKFILL_API_TOKEN")
    assert not _config_field("SOURCE_BACKFILL_JARS")


def _dockerfile_env() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, _, value = item.partition("=")
                env[key] = value
    assert env, "no ENV in the Dockerfile"
    return env


def _load(monkeypatch, toml: Path, env: dict[str, str]) -> Any:
    """``load_settings(toml)`` in a process environment of exactly the config variables of ``env``."""
    from source_backfill.config import load_settings

    for key in list(os.environ):
        if key.upper().startswith("SOURCE_BACKFILL_") and key not in NOT_CONFIG:
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("SOURCE_BACKFILL_"):
            if key in NOT_CONFIG:
                continue
            assert _config_field(key), f"{key} is not a setting of source_backfill/config/"
            monkeypatch.setenv(key, value)
    return load_settings(toml)


def _inside(path: str, root: Path) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(str(root)))


# -- compose ------------------------------------------------------------------------------------------------
COMPOSE = DEPLOY / "compose" / "compose.yaml"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _interpolate(value: str, given: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` with ``given`` as the shell."""
    def one(m: re.Match[str]) -> str:
        name, op, rest = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in given:
            return given[name]
        assert op != ":?", f"compose needs {name}: {rest}"
        return rest if op == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def _compose_env(service: dict[str, Any], token: str) -> dict[str, str]:
    """The image's environment overridden by the service's, the shell exporting the API token."""
    shell = {"SOURCE_BACKFILL_API_TOKEN": token}
    own = {k: _interpolate(str(v), shell) for k, v in service["environment"].items()}
    return {**_dockerfile_env(), **own}


def _mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        yield source, target


def test_compose_runs_the_daemon_on_its_kafka_with_settings_the_daemon_accepts(monkeypatch):
    compose = _compose()
    services = compose["services"]
    assert {"kafka", "source-backfill", "prometheus", "grafana"} <= set(services)
    app = services["source-backfill"]
    context = (COMPOSE.parent / app["build"]["context"]).resolve()
    assert (context / app["build"].get("dockerfile", "Dockerfile")).is_file()
    assert context == ROOT

    config = dict((t, s) for s, t in _mounts(app))["/etc/source-backfill/config.toml"]
    settings = _load(monkeypatch, COMPOSE.parent / config, _compose_env(app, "t0ken"))
    assert settings.api.token is not None and settings.api.token.get_secret_value() == "t0ken"
    assert settings.api.host == "0.0.0.0"
    state = dict((t, s) for s, t in _mounts(app))
    on_volume = any(_inside(str(settings.daemon.state_root), m) for m in state)
    assert on_volume, "the state root is not on a volume"
    for job in settings.jobs:
        assert settings.daemon.data_root is not None and _inside(job.sink_path, settings.daemon.data_root)
    published = {int(p.split(":")[1]) for p in app["ports"]}
    assert {settings.api.port, settings.metrics.port} <= published

    kafka = services["kafka"]
    kenv = {k: str(v) for k, v in kafka["environment"].items()}
    advertised = dict(item.split("://") for item in kenv["KAFKA_ADVERTISED_LISTENERS"].split(","))
    internal = advertised[kenv["KAFKA_INTER_BROKER_LISTENER_NAME"]]
    assert [s.bootstrap_servers for s in settings.sources] == [internal], \
        "the daemon's source does not read the kafka service"
    topics = {t for s in settings.sources for t in s.topics}
    assert topics <= set(re.findall(r"--topic (\S+)", services["kafka-init"]["command"]))


def test_compose_kafka_is_one_consistent_kraft_node():
    compose = _compose()
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    pom = (DEPLOY / "jvm" / "pom.xml").read_text()
    assert kafka["image"].split(":")[1] == re.search(r"<kafka.version>([^<]+)<", pom).group(1)
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocols)
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller in listeners
    voter_id, _, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert voter_id == node and voter.endswith(listeners[controller])
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert controller not in advertised and set(advertised) <= set(listeners)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert env[key] == "1", key  # one broker: no replication factor above 1 can be met
    host_ports = {p.split(":")[0] for p in kafka["ports"]}
    assert {a.rsplit(":", 1)[1] for n, a in advertised.items() if a.startswith("localhost:")} <= host_ports


def test_compose_prometheus_and_grafana_get_the_deploy_files(monkeypatch):
    compose = _compose()
    services = compose["services"]
    for name, service in services.items():
        for source, _ in _mounts(service):
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts {source}, which does not exist"

    prom_mounts = {t: (COMPOSE.parent / s).resolve() for s, t in _mounts(services["prometheus"])
                   if s.startswith(".")}
    assert prom_mounts["/etc/prometheus"] == DEPLOY / "prometheus"
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["honor_labels"] is True  # the daemon's `job` label stays `job` (alerts, dashboard)
    app = services["source-backfill"]
    settings = _load(monkeypatch, COMPOSE.parent / "config.toml", _compose_env(app, "x"))
    assert [t for c in job["static_configs"] for t in c["targets"]] == \
        [f"source-backfill:{settings.metrics.port}"]
    assert config["rule_files"] == ["alerts.yml"]

    graf = {t: (COMPOSE.parent / s).resolve() for s, t in _mounts(services["grafana"]) if s.startswith(".")}
    assert graf["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "source-backfill.yml")
                              .read_text())["providers"][0]
    path = provider["options"]["path"]
    assert graf[f"{path}/source-backfill.json"] == DEPLOY / "grafana" / "source-backfill.json"
    [source] = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
                              .read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]


# -- Kubernetes ---------------------------------------------------------------------------------------------
K8S = DEPLOY / "k8s"


def _objects(folder: Path = K8S, recursive: bool = False) -> list[dict[str, Any]]:
    files = sorted(folder.rglob("*.yaml") if recursive else folder.glob("*.yaml"))
    assert files, folder
    return [o for f in files for o in yaml.safe_load_all(f.read_text()) if o]


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def test_every_kubernetes_file_parses_into_named_objects():
    for o in _objects(recursive=True):
        assert {"apiVersion", "kind", "metadata"} <= set(o), o
        assert o["metadata"]["name"]


def test_the_deployment_is_one_non_root_pod_replaced_with_recreate_and_probed_on_live_and_ready():
    objects = _objects()
    deployment = _one(objects, "Deployment", "source-backfill")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container.get("startupProbe", {"httpGet": {"path": "/live"}})["httpGet"]["path"] == "/live"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["port"] in ("api", ports["api"]), probe
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert f"USER {pod['securityContext']['runAsUser']}" in (ROOT / "Dockerfile").read_text()
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    pvc = _one(objects, "PersistentVolumeClaim")
    assert mounts["/var/lib/source-backfill"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    configmap = _one(objects, "ConfigMap")
    assert mounts["/etc/source-backfill"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert container["args"][-2:] == ["--config", "/etc/source-backfill/config.toml"]
    assert pod["serviceAccountName"] == _one(objects, "ServiceAccount")["metadata"]["name"]

    service = _one(objects, "Service", "source-backfill")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"api", "metrics"}
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    driver = _one(objects, "Service", "source-backfill-driver")
    assert driver["spec"]["clusterIP"] == "None" and driver["spec"]["publishNotReadyAddresses"] is True
    assert {p["targetPort"] for p in driver["spec"]["ports"]} <= set(ports)

    monitor = _one(_objects(K8S / "monitoring"), "ServiceMonitor")
    assert "release" in monitor["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= driver["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics"}
    assert all(e.get("honorLabels") for e in monitor["spec"]["endpoints"])


def _pod_env(container: dict[str, Any], token_file: Path) -> dict[str, str]:
    """The container's environment as the kubelet would set it (downward API and $(VAR) resolved)."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            value = "source-backfill-5d8f7c9b4-x2x9q"  # a pod name
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], item["value"])
        env[item["name"]] = value
    env["SOURCE_BACKFILL_API__TOKEN_FILE"] = str(token_file)
    return env


@pytest.mark.parametrize("variant", ["local", "spark-on-k8s"])
def test_the_configmaps_load_with_the_pods_environment(variant, monkeypatch, tmp_path):
    objects = _objects()
    deployment = _one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    # the token file is where the Secret is mounted, under the Secret's key
    declared = next(e["value"] for e in container["env"] if e["name"] == "SOURCE_BACKFILL_API__TOKEN_FILE")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    folder, key = declared.rsplit("/", 1)
    # the Secret is an example outside what `kubectl apply -f deploy/k8s/` applies (it would overwrite the
    # real token docs/operations/deploy.md has the user create first with its placeholder)
    assert [o for o in objects if o["kind"] == "Secret"] == []
    secret = _one(_objects(K8S / "examples"), "Secret", mounted[folder]["secret"]["secretName"])
    assert key in secret["stringData"]
    token = tmp_path / "token"
    token.write_text(secret["stringData"][key] + "\n")

    configmap = _one(_objects() if variant == "local" else _objects(K8S / variant), "ConfigMap")
    assert configmap["metadata"]["name"] == mounted["/etc/source-backfill"]["configMap"]["name"]
    toml = tmp_path / "config.toml"
    toml.write_text(configmap["data"]["config.toml"])
    tomllib.loads(toml.read_text())
    settings = _load(monkeypatch, toml, {**_dockerfile_env(), **_pod_env(container, token)})

    assert settings.api.token is not None
    assert settings.api.token.get_secret_value() == secret["stringData"][key]
    assert settings.api.port == ports["api"] and settings.metrics.port == ports["metrics"]
    assert any(_inside(str(settings.daemon.state_root), m) for m in mounted)
    assert settings.daemon.data_root is not None
    assert all(_inside(j.sink_path, settings.daemon.data_root) for j in settings.jobs)
    conf = settings.spark.conf
    assert conf["spark.kubernetes.driver.pod.name"] == "source-backfill-5d8f7c9b4-x2x9q"
    if variant == "local":
        assert settings.spark.master.startswith("local")
        return
    assert settings.spark.master == "k8s://https://kubernetes.default.svc"
    driver = _one(objects, "Service", "source-backfill-driver")
    namespace = conf["spark.kubernetes.namespace"]
    assert conf["spark.driver.host"] == f"{driver['metadata']['name']}.{namespace}.svc"
    assert {int(conf["spark.driver.port"]), int(conf["spark.driver.blockManager.port"])} == \
        {p["port"] for p in driver["spec"]["ports"]}
    assert conf["spark.kubernetes.container.image"]
    extra = _objects(K8S / variant)
    binding = _one(extra, "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert binding["roleRef"]["name"] == _one(extra, "Role")["metadata"]["name"]
    claim = conf["spark.kubernetes.executor.volumes.persistentVolumeClaim.tables.options.claimName"]
    assert _one(extra, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
