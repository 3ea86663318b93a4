"""ServerAPI metrics: Prometheus text at ``/v1/metrics?format=prometheus``, Nomad's JSON without.

One ``Metrics`` object per process (a server process runs one ``ServerAPI``),
kept in its own ``CollectorRegistry`` so tests and libraries that use the
global prometheus registry never see our series and vice versa.

Two kinds of series:

* Events counted as they happen (request counts and latencies, FSM apply
  latency, GC reaps, snapshot durations). Their producers call small hooks
  here; every hook is optional and never raises into its caller, so a module
  works the same with metrics absent or broken.
* State read at scrape time from the bound server (raft role, term, commit
  and applied index, journal subscribers and lag, eval broker depth), so a
  scrape always shows the present, and nothing polls when nobody scrapes.

Hooks for modules that land later (the eval broker, operator snapshots):
``register_gauge(name, help, fn)`` adds a gauge read at scrape time (the
broker registers its depth with it); ``observe_snapshot(op, seconds)``
records a snapshot save/restore/install duration.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from node.core.api import ServerAPI

PROMETHEUS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# The *_created series double the output and no Caravan dashboard needs them.
disable_created_metrics()

# Request latencies: sub-millisecond local reads up to blocking queries (minutes).
REQUEST_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
# One entry's apply inside the tick thread: microseconds to a few milliseconds.
APPLY_BUCKETS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.1,
    1.0,
)
SNAPSHOT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

GaugeFn = Callable[[], float | dict[str, float]]


class MetricsError(Exception):
    """A metrics hook was used wrongly (a programming error, never a request error)."""


class _ServerState(Collector):
    """Gauges read from the bound server when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        server = self.metrics.server
        if server is not None:
            for gauges in (_raft_gauges,):
                try:
                    found = list(gauges(server))
                except Exception:  # noqa: BLE001 - a module mid-change must not break the scrape
                    continue
                yield from found
        for name, (help_text, label, fn) in list(self.metrics.sources.items()):
            try:
                value = fn()
            except Exception:  # noqa: BLE001 - a broken source must not break the scrape
                continue
            if isinstance(value, dict):
                family = GaugeMetricFamily(name, help_text, labels=[label])
                for key, v in value.items():
                    family.add_metric([str(key)], float(v))
            else:
                family = GaugeMetricFamily(name, help_text, value=float(value))
            yield family


# (metric, help, raft status field): the plain numbers of raft status, as gauges.
_RAFT_STATUS_GAUGES = (
    ("caravan_raft_term", "Current raft term", "term"),
    ("caravan_raft_commit_index", "Highest raft index known committed", "commit_index"),
    ("caravan_raft_applied_index", "Highest raft index applied by pysyncobj", "applied_index"),
    ("caravan_raft_last_log_index", "Last index in this server's raft log", "last_log_index"),
    (
        "caravan_raft_tick_busy_ratio",
        "Share of the last second the raft tick thread spent working rather than waiting for messages",
        "tick_busy",
    ),
)


def _raft_gauges(server: ServerAPI) -> Iterator[Metric]:
    raft = getattr(server, "raft", None)
    if raft is None:
        return
    try:
        status = raft.status()
    except Exception:  # noqa: BLE001 - raft stopping
        return
    role = status.get("role") or "unknown"
    roles = GaugeMetricFamily(
        "caravan_raft_role", "1 for this server's current raft role", labels=["role"]
    )
    for name in ("leader", "follower", "candidate"):
        roles.add_metric([name], 1.0 if role == name else 0.0)
    yield roles
    yield GaugeMetricFamily(
        "caravan_raft_leader",
        "1 while this server is the raft leader",
        value=1.0 if role == "leader" else 0.0,
    )
    for name, help_text, key in _RAFT_STATUS_GAUGES:
        yield GaugeMetricFamily(name, help_text, value=float(status.get(key) or 0))
    yield CounterMetricFamily(
        "caravan_raft_tick_stalls",
        "Raft ticks that started later than half the shortest election timeout",
        value=float(status.get("tick_stalls") or 0),
    )
    yield GaugeMetricFamily(
        "caravan_fsm_applied_index",
        "Highest raft index committed to the state store",
        value=float(server.fsm.applied_index),
    )


class _RPCStats(Collector):
    """RPC request counts and latencies by method and code, read at scrape time.

    ``observe`` runs for every RPC on the leader's loop. prometheus_client's
    Counter.inc and Histogram.observe took three locks a request there
    (about 1.5 us); a series here is a plain list that only the loop thread
    writes. A scrape from another thread copies each list at once under the
    GIL and derives the count from its buckets, so a sample is consistent.
    """

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = tuple(buckets) + (() if buckets[-1] == math.inf else (math.inf,))
        self.series: dict[tuple[str, str], list[Any]] = {}  # (method, code) -> [sum, count per bucket...]

    def observe(self, method: str, code: str, seconds: float) -> None:
        series = self.series.get((method, code))
        if series is None:
            series = self.series[(method, code)] = [0.0] + [0] * len(self.bounds)
        series[0] += seconds
        series[1 + bisect.bisect_left(self.bounds, seconds)] += 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "caravan_rpc_requests", "RPC requests served, by method and result code", labels=["method", "code"]
        )
        seconds = HistogramMetricFamily(
            "caravan_rpc_request_duration_seconds",
            "RPC request latency, by method and result code",
            labels=["method", "code"],
        )
        for (method, code), series in list(self.series.items()):
            total, *counts = list(series)
            cumulative = list(itertools.accumulate(counts))
            requests.add_metric([method, code], cumulative[-1])
            buckets = [(floatToGoString(b), c) for b, c in zip(self.bounds, cumulative, strict=True)]
            seconds.add_metric([method, code], buckets, total)
        yield requests
        yield seconds


class Metrics:
    """The process's metrics registry and the hooks that feed it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rpc = _RPCStats(REQUEST_BUCKETS)
        r.register(self.rpc)
        self.http_requests = Counter(
            "caravan_http_requests",
            "HTTP API requests served, by route, HTTP method and status code",
            ["route", "method", "code"],
            registry=r,
        )
        self.http_seconds = Histogram(
            "caravan_http_request_duration_seconds",
            "HTTP API request latency, by route, HTTP method and status code",
            ["route", "method", "code"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.http_streams = Gauge(
            "caravan_http_event_streams", "Open /v1/event/stream responses", registry=r
        )
        self.apply_seconds = Histogram(
            "caravan_fsm_apply_duration_seconds",
            "Time to apply one committed raft entry to the state store, by message type",
            ["type"],
            buckets=APPLY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "caravan_fsm_commit_duration_seconds",
            "Time to commit one tick's group of applied entries (LMDB commit)",
            buckets=APPLY_BUCKETS,
            registry=r,
        )
        self.gc_reaped = Counter(
            "caravan_gc_reaped_objects",
            "Objects removed by garbage collection, by kind",
            ["kind"],
            registry=r,
        )
        self.snapshot_seconds = Histogram(
            "caravan_snapshot_duration_seconds",
            "Snapshot operation durations, by operation",
            ["op"],
            buckets=SNAPSHOT_BUCKETS,
            registry=r,
        )
        self.sources: dict[str, tuple[str, str, GaugeFn]] = {}
        self._server: weakref.ReferenceType[ServerAPI] | None = None
        self._lock = threading.Lock()
        self._instrumented: weakref.WeakSet[Any] = weakref.WeakSet()
        r.register(_ServerState(self))

    # -- binding ------------------------------------------------------------------
    @property
    def server(self) -> ServerAPI | None:
        return self._server() if self._server is not None else None

    def bind(self, server: ServerAPI) -> None:
        """Read scrape-time state from ``server`` and count its RPCs and FSM applies."""
        self._server = weakref.ref(server)
        server.rpc.observer = self.observe_rpc
        self.instrument_fsm(server.fsm)

    def instrument_fsm(self, fsm: Any) -> None:
        """Time every ``fsm.apply`` and ``fsm.commit`` (wrapping this instance's methods).

        The raft adapter looks ``apply``/``commit`` up on the FSM object for
        every entry, so wrapping the instance is enough and the FSM itself
        stays free of metrics code. Observing never raises into the tick
        thread (an exception there would wedge the node).
        """
        with self._lock:
            if fsm in self._instrumented:
                return
            self._instrumented.add(fsm)
        apply, commit = fsm.apply, fsm.commit
        apply_hist, commit_hist = self.apply_seconds, self.commit_seconds

        def timed_apply(index: int, entry: bytes) -> Any:
            started = time.perf_counter()
            result = apply(index, entry)
            with contextlib.suppress(Exception):
                apply_hist.labels(_type_name(entry[0] if entry else -1)).observe(
                    time.perf_counter() - started
                )
            return result

        def timed_commit() -> None:
            started = time.perf_counter()
            commit()
            with contextlib.suppress(Exception):
                commit_hist.observe(time.perf_counter() - started)

        fsm.apply = timed_apply
        fsm.commit = timed_commit

    # -- hooks ----------------------------------------------------------------------
    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        self.rpc.observe(method, code, seconds)

    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        code = str(status)
        self.http_requests.labels(route, method, code).inc()
        self.http_seconds.labels(route, method, code).observe(seconds)

    def record_gc(self, counts: dict[str, int]) -> None:
        """Objects one GC sweep removed, per table (jobs, evals, allocs, ...)."""
        for kind, n in counts.items():
            if n:
                self.gc_reaped.labels(kind).inc(n)

    def observe_snapshot(self, op: str, seconds: float) -> None:
        self.snapshot_seconds.labels(op).observe(seconds)

    def register_gauge(self, name: str, help_text: str, fn: GaugeFn, *, label: str = "key") -> None:
        """A gauge read at scrape time: ``fn()`` returns a number, or {label value: number}."""
        if not name.startswith("caravan_") or not name.replace("_", "").isalnum():
            raise MetricsError(f"gauge name {name!r} must be caravan_<letters, digits, _>")
        self.sources[name] = (help_text, label, fn)

    def unregister_gauge(self, name: str) -> None:
        self.sources.pop(name, None)

    # -- exposition ---------------------------------------------------------------
    def prometheus(self) -> bytes:
        return generate_latest(self.registry)

    def nomad_json(self) -> dict[str, Any]:
        """Nomad's ``/v1/metrics`` JSON shape: Gauges, Counters and Samples (histograms)."""
        gauges: list[dict[str, Any]] = []
        counters: list[dict[str, Any]] = []
        samples: list[dict[str, Any]] = []
        for family in self.registry.collect():
            if family.type == "gauge":
                for s in family.samples:
                    gauges.append(
                        {"Name": s.name, "Value": _num(s.value), "Labels": dict(s.labels)}
                    )
            elif family.type == "counter":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        counters.append(_aggregate(s.name, dict(s.labels), s.value, s.value))
            elif family.type == "histogram":
                groups: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
                for s in family.samples:
                    labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    slot = groups.setdefault(labels, {})
                    if s.name.endswith("_count"):
                        slot["count"] = s.value
                    elif s.name.endswith("_sum"):
                        slot["sum"] = s.value
                for labels, slot in groups.items():
                    samples.append(
                        _aggregate(
                            family.name, dict(labels), slot.get("count", 0.0), slot.get("sum", 0.0)
                        )
                    )
        return {
            "Timestamp": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC"),
            "Gauges": gauges,
            "Counters": counters,
            "Samples": samples,
            "Points": [],
        }


def _num(value: float) -> float | int:
    if math.isfinite(value) and value == int(value):
        return int(value)
    return value


def _aggregate(name: str, labels: dict[str, str], count: float, total: float) -> dict[str, Any]:
    return {
        "Name": name,
        "Count": _num(count),
        "Sum": total,
        "Mean": total / count if count else 0.0,
        "Labels": labels,
    }


@functools.cache
def _type_name(code: int) -> str:
    from fsm.messages import MessageType

    try:
        return MessageType(code).name.lower()
    except ValueError:
        return f"type_{code}"


METRICS = Metrics()


# -- module-level hooks (what other modules call; all optional, none raises) --------
def record_gc(counts: dict[str, int]) -> None:
    """GC hook: objects removed by one sweep, per table."""
    with contextlib.suppress(Exception):
        METRICS.record_gc(counts)


def observe_snapshot(op: str, seconds: float) -> None:
    """Snapshot hook: how long one save / restore / install took."""
    with contextlib.suppress(Exception):
        METRICS.observe_snapshot(op, seconds)


def register_gauge(name: str, help_text: str, fn: GaugeFn, *, label: str = "key") -> None:
    """Feature hook: a gauge read at scrape time (e.g. ``caravan_eval_broker_depth``)."""
    METRICS.register_gauge(name, help_text, fn, label=label)
