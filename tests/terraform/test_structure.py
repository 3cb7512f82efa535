#!/usr/bin/env python3
"""Structure test of terraform/ (and the Dockerfile it deploys), without a cloud account.

Parses every .tf file with python-hcl2 and asserts what the deployment promises
(docs/deploy.md): ElastiCache in cluster mode with failover, Multi-AZ and encryption; MSK and
RDS encrypted in transit and at rest, RDS forcing TLS; no data port reachable from an address
range open to the world; and an output for every WAITROOM_* value the service needs, derived
from src/config.rs. Each check is printed with its outcome; the exit status is 1 when any
failed.

    python test_structure.py [--terraform DIR] [--repo DIR]

scripts/check-terraform runs it in its python-hcl2 venv, and once more per deliberately broken
copy of terraform/ to show that it fails.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import hcl2

# Ports of the data stores: Redis, the Kafka listeners (plaintext, TLS, SASL/SCRAM, IAM, and
# their public variants: MSK uses 9092-9098) and PostgreSQL.
DATA_PORTS = [(6379, 6379), (9092, 9098), (5432, 5432)]
WORLD = {"0.0.0.0/0", "::/0"}
CIDR_ATTRS = ("cidr_blocks", "ipv6_cidr_blocks", "cidr_ipv4", "cidr_ipv6")

# Settings the TLS work of issue 14 adds to the service (not in src/config.rs yet): the
# deployment must provide them too.
TLS_SETTINGS = [
    "WAITROOM_REDIS_MODE",
    "WAITROOM_REDIS_PASSWORD",
    "WAITROOM_KAFKA_TOPIC",
    "WAITROOM_KAFKA_SECURITY_PROTOCOL",
    "WAITROOM_KAFKA_SASL_MECHANISM",
    "WAITROOM_KAFKA_SASL_USERNAME",
    "WAITROOM_KAFKA_SASL_PASSWORD",
]

RESULTS: list[tuple[bool, str]] = []


def check(ok: bool, what: str, detail: str = "") -> bool:
    """Records and prints one check."""
    ok = bool(ok)
    RESULTS.append((ok, what))
    line = f"{'ok  ' if ok else 'FAIL'} {what}"
    if detail and not ok:
        line += f"  [{detail}]"
    print(line, flush=True)
    return ok


# --- the parsed tree ---------------------------------------------------------------------


def unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == '"' and s[-1] == '"' else s


def norm(x):
    """python-hcl2 keeps the quotes of strings and labels and marks blocks; drop both."""
    if isinstance(x, dict):
        return {unquote(k): norm(v) for k, v in x.items() if k != "__is_block__"}
    if isinstance(x, list):
        return [norm(i) for i in x]
    if isinstance(x, str):
        return unquote(x)
    return x


class Module:
    """The .tf files of one directory: resources, variables, locals, outputs, module calls."""

    def __init__(self, path: Path):
        self.path = path
        self.resources: dict[tuple[str, str], dict] = {}
        self.variables: dict[str, dict] = {}
        self.outputs: dict[str, dict] = {}
        self.locals: dict = {}
        self.calls: dict[str, dict] = {}
        self.files: list[Path] = []

    def load(self, file: Path) -> None:
        with file.open() as f:
            tree = norm(hcl2.load(f))
        self.files.append(file)
        for block in tree.get("resource", []):
            for rtype, named in block.items():
                for rname, body in named.items():
                    self.resources[(rtype, rname)] = body
        for block in tree.get("variable", []):
            self.variables.update(block)
        for block in tree.get("output", []):
            self.outputs.update(block)
        for block in tree.get("locals", []):
            self.locals.update(block)
        for block in tree.get("module", []):
            self.calls.update(block)

    def of_type(self, rtype: str) -> dict[str, dict]:
        return {n: b for (t, n), b in self.resources.items() if t == rtype}

    def default(self, name: str):
        return self.variables.get(name, {}).get("default")

    def resolve(self, value):
        """A literal, or the default of a variable referenced as `var.x` (else None)."""
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{var\.([A-Za-z0-9_]+)\}", value)
            if m:
                return self.default(m.group(1))
            if "${" in value:
                return None
        return value

    def rel(self, root: Path) -> str:
        return str(self.path.relative_to(root)) or "."


def load_modules(root: Path) -> dict[Path, Module]:
    modules: dict[Path, Module] = {}
    files = sorted(p for p in root.rglob("*.tf") if ".terraform" not in p.parts)
    for file in files:
        modules.setdefault(file.parent, Module(file.parent))
        try:
            modules[file.parent].load(file)
        except Exception as e:  # noqa: BLE001 - any parse error is a failed check
            check(False, f"{file.relative_to(root)} parses", f"{type(e).__name__}: {e}")
    return modules


def first(block):
    """The first instance of a nested block (hcl2 gives nested blocks as lists)."""
    if isinstance(block, list):
        return block[0] if block else {}
    return block or {}


def truthy(module: Module, value) -> bool:
    return module.resolve(value) is True


def find_module(modules: dict[Path, Module], rtype: str) -> tuple[Module, str, dict] | None:
    for module in modules.values():
        for name, body in module.of_type(rtype).items():
            return module, name, body
    return None


# --- checks per store --------------------------------------------------------------------


def check_elasticache(modules, root) -> None:
    found = find_module(modules, "aws_elasticache_replication_group")
    if not check(found is not None, "elasticache: a replication group exists"):
        return
    mod, name, rg = found
    where = f"{mod.rel(root)}: aws_elasticache_replication_group.{name}"

    groups = mod.of_type("aws_elasticache_parameter_group")
    check(len(groups) > 0, f"{mod.rel(root)}: a parameter group exists")
    for gname, group in groups.items():
        params = {p.get("name"): str(mod.resolve(p.get("value"))) for p in group.get("parameter", [])}
        check(params.get("cluster-enabled") == "yes",
              f"{mod.rel(root)}: parameter group {gname} sets cluster-enabled yes",
              f"cluster-enabled = {params.get('cluster-enabled')}")
        check(params.get("maxmemory-policy") == "noeviction",
              f"{mod.rel(root)}: parameter group {gname} sets maxmemory-policy noeviction",
              f"maxmemory-policy = {params.get('maxmemory-policy')}")
        family = mod.resolve(group.get("family"))
        check(family in ("valkey8", "redis7"),
              f"{mod.rel(root)}: parameter group {gname} family is valkey8 or redis7", f"family = {family}")
        check(f"aws_elasticache_parameter_group.{gname}." in str(rg.get("parameter_group_name")),
              f"{where} uses parameter group {gname}", f"parameter_group_name = {rg.get('parameter_group_name')}")

    check(mod.resolve(rg.get("cluster_mode")) == "enabled", f"{where}: cluster_mode = enabled",
          f"cluster_mode = {rg.get('cluster_mode')}")
    for knob, minimum in (("num_node_groups", 1), ("replicas_per_node_group", 1)):
        ref = rg.get(knob)
        m = re.fullmatch(r"\$\{var\.([A-Za-z0-9_]+)\}", str(ref))
        ok = m is not None and isinstance(mod.default(m.group(1)), int) and mod.default(m.group(1)) >= minimum
        check(ok, f"{where}: {knob} is a variable with a default of at least {minimum}", f"{knob} = {ref}")
    for flag in ("automatic_failover_enabled", "multi_az_enabled",
                 "at_rest_encryption_enabled", "transit_encryption_enabled"):
        check(truthy(mod, rg.get(flag)), f"{where}: {flag} = true", f"{flag} = {rg.get(flag)}")
    check(mod.resolve(rg.get("transit_encryption_mode")) == "required",
          f"{where}: transit_encryption_mode = required", f"= {rg.get('transit_encryption_mode')}")
    check("kms" in str(rg.get("kms_key_id", "")), f"{where}: at-rest encryption uses a KMS key",
          f"kms_key_id = {rg.get('kms_key_id')}")
    check("aws_secretsmanager_secret_version." in str(rg.get("auth_token", "")),
          f"{where}: the AUTH token comes from Secrets Manager", f"auth_token = {rg.get('auth_token')}")
    for window in ("maintenance_window", "snapshot_window"):
        check(mod.resolve(rg.get(window)) not in (None, ""), f"{where}: {window} is set")
    retention = mod.resolve(rg.get("snapshot_retention_limit"))
    check(isinstance(retention, int) and retention > 0, f"{where}: snapshots are kept",
          f"snapshot_retention_limit = {retention}")

    # The alarms mirror the operators' thresholds.
    metrics = {str(v.get("metric")) for v in mod.locals.get("node_alarms", {}).values() if isinstance(v, dict)}
    for metric in ("EngineCPUUtilization", "DatabaseMemoryUsagePercentage", "CurrConnections", "ReplicationLag"):
        check(metric in metrics and mod.of_type("aws_cloudwatch_metric_alarm"),
              f"{mod.rel(root)}: a CloudWatch alarm per node on {metric}", f"alarmed metrics: {sorted(metrics)}")
    for var, expected in (("engine_cpu_alarm_percent", 70), ("memory_alarm_percent", 80),
                          ("connections_alarm_count", 200)):
        check(mod.default(var) == expected, f"{mod.rel(root)}: {var} defaults to {expected}",
              f"default = {mod.default(var)}")


def check_msk(modules, root) -> None:
    found = find_module(modules, "aws_msk_cluster")
    if not check(found is not None, "msk: a cluster exists"):
        return
    mod, name, cluster = found
    where = f"{mod.rel(root)}: aws_msk_cluster.{name}"
    enc = first(cluster.get("encryption_info"))
    transit = first(enc.get("encryption_in_transit"))
    check(mod.resolve(transit.get("client_broker")) == "TLS", f"{where}: client_broker = TLS",
          f"client_broker = {transit.get('client_broker')}")
    check(truthy(mod, transit.get("in_cluster", True)), f"{where}: in_cluster encryption on",
          f"in_cluster = {transit.get('in_cluster')}")
    check("kms" in str(enc.get("encryption_at_rest_kms_key_arn", "")), f"{where}: at-rest encryption uses a KMS key",
          f"encryption_at_rest_kms_key_arn = {enc.get('encryption_at_rest_kms_key_arn')}")
    auth = first(cluster.get("client_authentication"))
    check(truthy(mod, first(auth.get("sasl")).get("scram")), f"{where}: SASL/SCRAM on")
    check(mod.resolve(auth.get("unauthenticated")) is False, f"{where}: unauthenticated access off",
          f"unauthenticated = {auth.get('unauthenticated')}")
    secrets = [s for s in mod.of_type("aws_secretsmanager_secret").values() if str(s.get("name", "")).startswith("AmazonMSK_")]
    check(len(secrets) == 1 and "kms" in str(secrets[0].get("kms_key_id", "")),
          f"{mod.rel(root)}: the SCRAM secret is named AmazonMSK_* and encrypted with a KMS key")
    check(len(mod.of_type("aws_msk_scram_secret_association")) == 1,
          f"{mod.rel(root)}: the SCRAM secret is associated with the cluster")
    for var in ("bookings_topic_partitions", "bookings_topic_replication_factor"):
        d = mod.default(var)
        check(isinstance(d, int) and d >= 1, f"{mod.rel(root)}: variable {var} (default {d})")
    check((mod.default("bookings_topic_replication_factor") or 0) >= 2,
          f"{mod.rel(root)}: bookings topic replicated at least twice by default")


def check_rds(modules, root) -> None:
    found = find_module(modules, "aws_db_instance")
    if not check(found is not None, "rds: a DB instance exists"):
        return
    mod, name, db = found
    where = f"{mod.rel(root)}: aws_db_instance.{name}"
    check(mod.resolve(db.get("engine")) == "postgres", f"{where}: engine = postgres")
    for flag in ("storage_encrypted", "multi_az", "deletion_protection", "performance_insights_enabled"):
        check(truthy(mod, db.get(flag)), f"{where}: {flag} = true", f"{flag} = {db.get(flag)}")
    check(mod.resolve(db.get("publicly_accessible")) is False, f"{where}: not publicly accessible")
    check("kms" in str(db.get("kms_key_id", "")), f"{where}: storage encrypted with a KMS key")
    retention = mod.resolve(db.get("backup_retention_period"))
    check(isinstance(retention, int) and retention > 0, f"{where}: backups kept ({retention} days)")
    forced = False
    for gname, group in mod.of_type("aws_db_parameter_group").items():
        params = {p.get("name"): str(p.get("value")) for p in group.get("parameter", [])}
        if params.get("rds.force_ssl") == "1" and f"aws_db_parameter_group.{gname}." in str(db.get("parameter_group_name")):
            forced = True
    check(forced, f"{where}: its parameter group sets rds.force_ssl = 1")
    urls = [str(v) for s in mod.of_type("aws_secretsmanager_secret_version").values() for v in [s.get("secret_string")]]
    check(any("sslmode=verify-full" in u for u in urls), f"{mod.rel(root)}: the database URL asks for sslmode=verify-full")


# --- security groups ---------------------------------------------------------------------


def ingress_rules(mod: Module):
    """(label, rule body, for_each) of every ingress rule, whatever its form."""
    for name, sg in mod.of_type("aws_security_group").items():
        for i, rule in enumerate(sg.get("ingress", []) or []):
            yield f"aws_security_group.{name} ingress[{i}]", rule, sg.get("for_each")
    for name, rule in mod.of_type("aws_security_group_rule").items():
        if mod.resolve(rule.get("type")) == "ingress":
            yield f"aws_security_group_rule.{name}", rule, rule.get("for_each")
    for name, rule in mod.of_type("aws_vpc_security_group_ingress_rule").items():
        yield f"aws_vpc_security_group_ingress_rule.{name}", rule, rule.get("for_each")


def cidr_values(mod: Module, rule: dict, for_each) -> tuple[set[str], bool]:
    """The address ranges a rule admits, and whether all of them could be determined."""
    values: set[str] = set()
    known = True
    for attr in CIDR_ATTRS:
        if attr not in rule:
            continue
        raw = rule[attr]
        items = raw if isinstance(raw, list) else [raw]
        for item in items:
            if isinstance(item, str) and re.fullmatch(r"\$\{each\.(value|key)\}", item):
                m = re.search(r"var\.([A-Za-z0-9_]+)", str(for_each))
                default = mod.default(m.group(1)) if m else None
                if isinstance(default, list):
                    values.update(map(str, default))
                else:
                    known = False
                continue
            resolved = mod.resolve(item)
            if isinstance(resolved, list):
                values.update(map(str, resolved))
            elif resolved is None:
                known = False
            else:
                values.add(str(resolved))
    return values, known


def port_range(mod: Module, rule: dict):
    protocol = str(mod.resolve(rule.get("ip_protocol", rule.get("protocol"))))
    if protocol in ("-1", "all"):
        return (0, 65535)
    lo, hi = mod.resolve(rule.get("from_port")), mod.resolve(rule.get("to_port"))
    if isinstance(lo, int) and isinstance(hi, int):
        return (lo, hi)
    return None


def check_security_groups(modules, root) -> None:
    data_rules = 0
    for mod in modules.values():
        for label, rule, for_each in ingress_rules(mod):
            where = f"{mod.rel(root)}: {label}"
            cidrs, known = cidr_values(mod, rule, for_each)
            has_cidr = any(a in rule for a in CIDR_ATTRS)
            ports = port_range(mod, rule)
            on_data = ports is None or any(lo <= p_hi and p_lo <= hi for (p_lo, p_hi) in DATA_PORTS for (lo, hi) in [ports])
            if not has_cidr:
                if rule.get("referenced_security_group_id") or rule.get("security_groups") or rule.get("source_security_group_id"):
                    if ports is None or on_data:
                        data_rules += 1
                continue
            open_to_world = bool(cidrs & WORLD) or not known
            span = "unknown ports" if ports is None else f"ports {ports[0]}-{ports[1]}"
            check(not (open_to_world and on_data),
                  f"{where}: no data port (6379, 9092-9098, 5432) open to 0.0.0.0/0 or ::/0 ({span}, from {sorted(cidrs) or 'unresolved ranges'})",
                  "admits the world on a data port" if ports is not None else "ports could not be resolved")
            if on_data and not open_to_world:
                check(False, f"{where}: data ports are opened to security groups, never to address ranges", f"admits {sorted(cidrs)}")
    check(data_rules >= 1, f"ingress on the data ports is granted to security groups ({data_rules} rule block(s))")

    found = find_module(modules, "aws_vpc_security_group_ingress_rule")
    if found:
        mod = found[0]
        stores = mod.locals.get("data_stores", {})
        ports = {k: mod.resolve(v.get("port")) for k, v in stores.items()} if isinstance(stores, dict) else {}
        check(ports == {"redis": 6379, "kafka": 9096, "postgres": 5432},
              f"{mod.rel(root)}: the data stores are Redis 6379, Kafka 9096 (SASL/SCRAM over TLS), PostgreSQL 5432",
              f"ports = {ports}")
        clients = str(mod.locals.get("data_clients", ""))
        check("aws_security_group.service.id" in clients and "cidr" not in clients,
              f"{mod.rel(root)}: the data stores admit the service's security group (and operator groups), no address range")


# --- the service and its settings --------------------------------------------------------


def required_settings(config_rs: Path) -> list[str]:
    """WAITROOM_* settings whose default is only right on a developer machine, or that have
    none: their value must come from the deployment."""
    text = config_rs.read_text()
    needed = []
    for m in re.finditer(r"#\[arg\(([^]]*?)env\s*=\s*\"(WAITROOM_[A-Z0-9_]+)\"(.*?)\)\]\s*(?:///[^\n]*\n\s*)*pub\s+\w+:\s*([^,\n]+)",
                         text, re.S):
        attr = m.group(1) + m.group(3)
        env, ty = m.group(2), m.group(4)
        local_default = "127.0.0.1" in attr or '"development"' in attr
        secret_without_default = "default" not in attr and "Secret" in ty
        if local_default or secret_without_default:
            needed.append(env)
    return needed


def check_service(modules, root, repo: Path) -> None:
    found = find_module(modules, "aws_ecs_task_definition")
    if not check(found is not None, "service: an ECS task definition exists"):
        return
    mod, name, task = found
    where = f"{mod.rel(root)}: aws_ecs_task_definition.{name}"
    containers = str(task.get("container_definitions", ""))
    check(re.search(r"readonlyRootFilesystem\s*=\s*true", containers), f"{where}: read-only root filesystem")
    user = re.search(r"\buser\s*=\s*var\.([a-z_]+)", containers)
    user_default = mod.default(user.group(1)) if user else None
    check(user_default is not None and str(user_default).split(":")[0] not in ("0", "root"),
          f"{where}: runs as a non-root user ({user_default})")
    check("healthcheck" in containers and "--url" in containers, f"{where}: container health check is `waitroom healthcheck --url`")
    check(re.search(r"secrets\s*=", containers), f"{where}: secrets are injected from Secrets Manager")
    check(task.get("requires_compatibilities") == ["FARGATE"], f"{where}: runs on Fargate")

    tgs = mod.of_type("aws_lb_target_group")
    check(any(first(tg.get("health_check")).get("path") == "/healthz" for tg in tgs.values()),
          f"{mod.rel(root)}: target group health check on /healthz")
    check(any(first(tg.get("stickiness")).get("type") == "lb_cookie" and truthy(mod, first(tg.get("stickiness")).get("enabled"))
              for tg in tgs.values()),
          f"{mod.rel(root)}: a client's polls go back to its task (lb_cookie stickiness, on by default)")
    listeners = mod.of_type("aws_lb_listener")
    check(listeners and all(mod.resolve(l.get("protocol")) == "HTTPS" for l in listeners.values()),
          f"{mod.rel(root)}: every load balancer listener is HTTPS")
    metrics = {first(first(p.get("target_tracking_scaling_policy_configuration")).get("predefined_metric_specification")).get("predefined_metric_type")
               for p in mod.of_type("aws_appautoscaling_policy").values()}
    check({"ECSServiceAverageCPUUtilization", "ALBRequestCountPerTarget"} <= metrics,
          f"{mod.rel(root)}: autoscaling on CPU and on requests per target", f"policies: {sorted(map(str, metrics))}")
    logs = mod.of_type("aws_cloudwatch_log_group")
    check(logs and all("kms" in str(g.get("kms_key_id", "")) and g.get("retention_in_days") for g in logs.values()),
          f"{mod.rel(root)}: log group encrypted with KMS and with a retention")

    # Every setting the service needs has an output in the example root.
    roots = [m for m in modules.values() if any("modules/service" in str(c.get("source", "")) for c in m.calls.values())]
    if not check(len(roots) >= 1, "an example root calls modules/service"):
        return
    example = roots[0]
    config_rs = repo / "src" / "config.rs"
    needed = required_settings(config_rs) if config_rs.exists() else []
    check(len(needed) >= 5, f"src/config.rs: settings the deployment must set: {', '.join(needed)}")
    for setting in needed + TLS_SETTINGS:
        base = setting.lower()
        names = [n for n in (base, f"{base}_secret_arn") if n in example.outputs]
        check(names, f"{example.rel(root)}: output for {setting} ({', '.join(names) or 'missing'})")
    for out, attr in (("waitroom_environment", "environment"), ("waitroom_secrets", "secret_settings")):
        check(out in example.outputs and f"module.service.{attr}" in str(example.outputs[out].get("value")),
              f"{example.rel(root)}: output {out} lists every {'plain' if attr == 'environment' else 'secret'} setting of the task")

    redis = find_module(modules, "aws_elasticache_replication_group")
    if redis:
        value = str(redis[0].outputs.get("redis_nodes", {}).get("value", ""))
        check(value.startswith("rediss://") and "configuration_endpoint_address" in value,
              f"{redis[0].rel(root)}: WAITROOM_REDIS_NODES is rediss:// on the configuration endpoint", value)
    msk = find_module(modules, "aws_msk_cluster")
    if msk:
        check("bootstrap_brokers_sasl_scram" in str(msk[0].outputs.get("bootstrap_brokers", {}).get("value", "")),
              f"{msk[0].rel(root)}: WAITROOM_KAFKA_BROKERS are the SASL/SCRAM (TLS) bootstrap brokers")


def check_dockerfile(modules, repo: Path) -> None:
    dockerfile = repo / "Dockerfile"
    if not check(dockerfile.exists(), "Dockerfile exists"):
        return
    text = dockerfile.read_text()
    check("cargo build --release --locked" in text, "Dockerfile: builds with cargo build --release --locked")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    check(users and users[-1].split(":")[0] not in ("0", "root"), f"Dockerfile: runs as a non-root user ({users[-1] if users else None})")
    check(re.search(r'^HEALTHCHECK .*"healthcheck", "--url"', text, re.M | re.S), "Dockerfile: HEALTHCHECK runs `waitroom healthcheck --url`")
    check(re.search(r"^EXPOSE 8080\b", text, re.M), "Dockerfile: EXPOSE 8080")
    check("WAITROOM_HTTP_ADDR=0.0.0.0:8080" in text, "Dockerfile: WAITROOM_HTTP_ADDR=0.0.0.0:8080")
    found = find_module(modules, "aws_ecs_task_definition")
    if found and users:
        check(found[0].default("container_user") == users[-1],
              f"the task's container_user matches the image's USER ({users[-1]})", f"container_user = {found[0].default('container_user')}")


def main() -> int:
    here = Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=here.parents[2], help="repository root (src/config.rs, Dockerfile)")
    ap.add_argument("--terraform", type=Path, default=None, help="terraform directory (default: REPO/terraform)")
    args = ap.parse_args()
    root = (args.terraform or args.repo / "terraform").resolve()

    modules = load_modules(root)
    count = sum(len(m.files) for m in modules.values())
    check(count > 0, f"parsed {count} .tf files in {len(modules)} directories under {root}")
    check_elasticache(modules, root)
    check_msk(modules, root)
    check_rds(modules, root)
    check_security_groups(modules, root)
    check_service(modules, root, args.repo)
    check_dockerfile(modules, args.repo)

    failed = [what for ok, what in RESULTS if not ok]
    print(f"structure: {len(RESULTS) - len(failed)} checks passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
