"""Operator settings from DDPJOB_OPERATOR_* environment variables, validated at startup.

A bad value stops the operator with a message naming the variable and the fix (no traceback).
The Helm chart sets the first four; the rest can be set with the chart's `extraEnv`.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:  # `ddpjob validate` and `render` read Settings without importing kopf (0.5 s of CPU)
    import kopf

PREFIX = "DDPJOB_OPERATOR_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SettingsError(ValueError):
    """One or more invalid variables; the message lists each with its fix."""


@dataclass(frozen=True)
class Settings:
    watch_namespaces: tuple[str, ...] = ()  # empty: all namespaces (cluster-wide)
    log_level: str = "INFO"
    health_port: int = 8080  # kopf liveness endpoint /healthz; 0 disables it
    metrics_port: int = 9090  # Prometheus /metrics; 0 disables it; AUTO_PORT ("auto"): any free one, logged
    resync_seconds: float = 30.0  # every job is reconciled at least this often
    stuck_terminating_seconds: float = 300.0  # then a Terminating pod is force-deleted
    cannot_start_seconds: float = 300.0  # then a pod stuck on a bad image or missing secret fails its job
    incident_settle_seconds: float = 10.0  # an incident gathers the exits it causes this long at most
    # ...and this long when survivors timed out on a silent peer still seen Running on a node (node loss?)
    silent_peer_settle_seconds: float = 60.0
    # A job with a checkpoint interval whose workers all ran this long without a progress report is warned of
    # (ProgressNotReported: the HF/Lightning callback or job.report missing).
    unreported_warning_seconds: float = 180.0
    request_timeout_seconds: float = 30.0  # one Kubernetes API call
    retry_seconds: float = 2.0  # after a failed reconcile (API error), try again this soon
    coalesce_seconds: float = 0.01  # a job triggered during its reconcile runs again this much later
    # Jobs reconciled at once; the rest of a burst (startup, a relist, many new jobs) waits its turn
    # instead of all holding their manifests and API calls in memory at once (bench/operator_memory.py).
    max_concurrent_reconciles: int = 32
    bind_address: str = "0.0.0.0"  # of the health and metrics endpoints
    heartbeat_seconds: float = 60.0  # status.lastReconcileTime is refreshed when it is this old
    # Leader election (leader.py): off without a Lease name (one replica that always acts).
    lease_name: str = ""
    lease_namespace: str = ""  # default: POD_NAMESPACE (the chart sets it from the downward API)
    lease_duration_seconds: int = 15
    lease_renew_deadline_seconds: float = 10.0
    lease_retry_period_seconds: float = 2.0
    identity: str = ""  # holderIdentity: POD_NAME (the chart's downward API), else <hostname>-<pid>
    # The progress endpoint (progress.py): trainers POST their progress there. 0: off; AUTO_PORT ("auto"): any
    # free one, logged.
    progress_port: int = 0
    # What worker pods get as DDPJOB_PROGRESS_URL's base (the chart: its Service); empty: workers get none.
    progress_url: str = ""
    progress_audience: str = "progress.elastic.ddp.dev"  # the projected token's audience, checked by TokenReview
    progress_write_seconds: float = 5.0  # a job's status.progress is written at most this often
    # With leader election: the acting replica labels its own pod (PROGRESS_LEADER_LABEL, true) so that the
    # progress Service, which selects that label, routes reports to it alone (the chart turns it on).
    progress_leader_label: bool = False
    # HTTPS for the progress endpoint: its certificate chain and key (PEM files; reloaded when they change,
    # as cert-manager renews them), and the CA (PEM file) worker pods verify it with (DDPJOB_PROGRESS_CA).
    progress_tls_cert_file: str = ""
    progress_tls_key_file: str = ""
    progress_ca_file: str = ""

    @property
    def leader_election(self) -> bool:
        return bool(self.lease_name)

    @property
    def clusterwide(self) -> bool:
        return not self.watch_namespaces

    @property
    def liveness_endpoint(self) -> str | None:
        return f"http://{self.bind_address}:{self.health_port}/healthz" if self.health_port else None


def _namespaces(raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    bad = [n for n in names if not NAMESPACE_PATTERN.match(n) or len(n) > 63]
    if bad:
        raise ValueError(f"invalid namespace name(s) {', '.join(bad)}; use comma-separated DNS-1123 labels "
                         f"such as `team-a,team-b`, or leave it empty to watch all namespaces")
    return names


def _level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
    return level


AUTO_PORT = -1  # "auto": a port the kernel picks, logged at start (tests running several operators at once)


def _port_or_auto(raw: str) -> int:
    return AUTO_PORT if raw.strip() == "auto" else _port(raw)


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ValueError("must be a whole number 0-65535 (0 turns the endpoint off)") from None
    if not 0 <= port <= 65535:
        raise ValueError("must be a whole number 0-65535 (0 turns the endpoint off)")
    return port


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number of seconds, e.g. 30 or 0.5") from None
    if not value > 0:
        raise ValueError("must be a number of seconds greater than 0")
    return value


def _positive_count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a whole number, at least 1, e.g. 32") from None
    if value < 1:
        raise ValueError("must be a whole number, at least 1, e.g. 32")
    return value


def _whole_seconds(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be a whole number of seconds (a Lease stores leaseDurationSeconds as an "
                         "integer), e.g. 15") from None
    if value < 1:
        raise ValueError("must be a whole number of seconds, at least 1")
    return value


def _url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    if url and not re.match(r"^https?://[^\s/]+(:[0-9]+)?(/[^\s]*)?$", url):
        raise ValueError("must be an http(s) URL such as http://ddpjob-operator-progress.ddpjob-system.svc:8090, "
                         "or empty (workers then report to nobody)")
    return url


def _audience(raw: str) -> str:
    audience = raw.strip()
    if not audience or any(c.isspace() for c in audience):
        raise ValueError("must be a non-empty audience without spaces, e.g. progress.elastic.ddp.dev")
    return audience


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", ""):
        raise ValueError("must be true or false")
    return value in ("true", "1")


def _lease_name(raw: str) -> str:
    name = raw.strip()
    if name and (len(name) > 253 or not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name)):
        raise ValueError("must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.'), e.g. "
                         "ddpjob-operator, or empty to turn leader election off (one replica)")
    return name


def _lease_namespace(raw: str) -> str:
    name = raw.strip()
    if name and (len(name) > 63 or not NAMESPACE_PATTERN.match(name)):
        raise ValueError("must be a namespace name (a DNS-1123 label), e.g. ddpjob-system")
    return name


PARSERS: dict[str, tuple[str, Callable[[str], object]]] = {
    "WATCH_NAMESPACES": ("watch_namespaces", _namespaces),
    "LOG_LEVEL": ("log_level", _level),
    "HEALTH_PORT": ("health_port", _port),
    "METRICS_PORT": ("metrics_port", _port_or_auto),
    "RESYNC_SECONDS": ("resync_seconds", _seconds),
    "STUCK_TERMINATING_SECONDS": ("stuck_terminating_seconds", _seconds),
    "CANNOT_START_SECONDS": ("cannot_start_seconds", _seconds),
    "INCIDENT_SETTLE_SECONDS": ("incident_settle_seconds", _seconds),
    "SILENT_PEER_SETTLE_SECONDS": ("silent_peer_settle_seconds", _seconds),
    "UNREPORTED_WARNING_SECONDS": ("unreported_warning_seconds", _seconds),
    "REQUEST_TIMEOUT_SECONDS": ("request_timeout_seconds", _seconds),
    "RETRY_SECONDS": ("retry_seconds", _seconds),
    "COALESCE_SECONDS": ("coalesce_seconds", _seconds),
    "MAX_CONCURRENT_RECONCILES": ("max_concurrent_reconciles", _positive_count),
    "BIND_ADDRESS": ("bind_address", str),
    "HEARTBEAT_SECONDS": ("heartbeat_seconds", _seconds),
    "LEASE_NAME": ("lease_name", _lease_name),
    "LEASE_NAMESPACE": ("lease_namespace", _lease_namespace),
    "LEASE_DURATION_SECONDS": ("lease_duration_seconds", _whole_seconds),
    "LEASE_RENEW_DEADLINE_SECONDS": ("lease_renew_deadline_seconds", _seconds),
    "LEASE_RETRY_PERIOD_SECONDS": ("lease_retry_period_seconds", _seconds),
    "PROGRESS_PORT": ("progress_port", _port_or_auto),
    "PROGRESS_URL": ("progress_url", _url),
    "PROGRESS_AUDIENCE": ("progress_audience", _audience),
    "PROGRESS_WRITE_SECONDS": ("progress_write_seconds", _seconds),
    "PROGRESS_LEADER_LABEL": ("progress_leader_label", _flag),
    "PROGRESS_TLS_CERT_FILE": ("progress_tls_cert_file", str.strip),
    "PROGRESS_TLS_KEY_FILE": ("progress_tls_key_file", str.strip),
    "PROGRESS_CA_FILE": ("progress_ca_file", str.strip),
}


def _progress_tls_errors(values: dict[str, object]) -> list[str]:
    """HTTPS settings that only make sense together."""
    cert, key = values.get("progress_tls_cert_file"), values.get("progress_tls_key_file")
    errors = []
    if bool(cert) != bool(key):
        errors.append(f"{PREFIX}PROGRESS_TLS_CERT_FILE and {PREFIX}PROGRESS_TLS_KEY_FILE: set both (the endpoint's "
                      f"certificate and its key, e.g. tls.crt and tls.key of a kubernetes.io/tls Secret) or neither")
    url = str(values.get("progress_url") or "")
    if cert and url.startswith("http://"):
        errors.append(f"{PREFIX}PROGRESS_URL={url!r}: the endpoint serves HTTPS ({PREFIX}PROGRESS_TLS_CERT_FILE is "
                      f"set), so workers must use an https:// URL")
    return errors


def _leader_election_errors(values: dict[str, object], env: Mapping[str, str]) -> list[str]:
    """The Lease settings that only make sense together; fills in the namespace and identity."""
    if not values.get("lease_name"):
        return []
    errors = []
    if not values.get("lease_namespace"):
        namespace = (env.get("POD_NAMESPACE") or "").strip()
        if not namespace:
            errors.append(f"{PREFIX}LEASE_NAMESPACE: required with {PREFIX}LEASE_NAME; set it, or POD_NAMESPACE "
                          f"(the chart sets POD_NAMESPACE from the downward API), to the operator's namespace")
        else:
            try:
                values["lease_namespace"] = _lease_namespace(namespace)
            except ValueError as exc:
                errors.append(f"POD_NAMESPACE={namespace!r}: {exc}")
    values["identity"] = (env.get("POD_NAME") or "").strip() or f"{socket.gethostname()}-{os.getpid()}"
    duration = values.get("lease_duration_seconds", Settings.lease_duration_seconds)
    deadline = values.get("lease_renew_deadline_seconds", Settings.lease_renew_deadline_seconds)
    retry = values.get("lease_retry_period_seconds", Settings.lease_retry_period_seconds)
    if not float(retry) < float(deadline) < float(duration):  # type: ignore[arg-type]
        errors.append(f"{PREFIX}LEASE_RETRY_PERIOD_SECONDS={retry} < {PREFIX}LEASE_RENEW_DEADLINE_SECONDS={deadline} "
                      f"< {PREFIX}LEASE_DURATION_SECONDS={duration} must hold: the leader stops acting at its renew "
                      f"deadline, before a standby may take the Lease over (e.g. 2 < 10 < 15)")
    return errors


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    errors = []
    for suffix, (attr, parse) in PARSERS.items():
        name = PREFIX + suffix
        if name not in env:
            continue
        try:
            values[attr] = parse(env[name])
        except ValueError as exc:
            errors.append(f"{name}={env[name]!r}: {exc}")
    unknown = sorted(k for k in env if k.startswith(PREFIX) and k[len(PREFIX):] not in PARSERS)
    for name in unknown:
        known = ", ".join(PREFIX + s for s in PARSERS)
        errors.append(f"{name}: unknown setting; remove it or use one of {known}")
    if not errors:
        errors = _leader_election_errors(values, env) + _progress_tls_errors(values)
    if errors:
        raise SettingsError("invalid operator settings:\n  " + "\n  ".join(errors))
    return Settings(**values)  # type: ignore[arg-type]


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: Settings) -> None:
    """kopf runs the process (start-up, clean-up, credentials, the probe, signals) and watches nothing: the
    operator's informers list and watch jobs and pods (informer.py), so no kopf state is ever stored."""
    # No kopf peering: replicas elect the active one on a Lease of their own (leader.py), which fences.
    kopf_settings.peering.standalone = True
    kopf_settings.peering.clusterwide = settings.clusterwide
    # Without scanning kopf needs no access to CRDs or Namespaces (see permissions.py).
    kopf_settings.scanning.disabled = True
    # kopf posts handler problems as Events; lifecycle Events are posted by the operator itself.
    kopf_settings.posting.level = logging.WARNING
    kopf_settings.networking.request_timeout = settings.request_timeout_seconds
