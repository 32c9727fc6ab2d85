"""The team server's figures in Prometheus text format (``GET /metrics``), written by hand.

Counters and histograms live in one ``Metrics`` per server (tests run several in a process):
requests by route template, method and status; request latency by route; per-stage
latency (the search legs and team chat's stages); the wait for a pooled database
connection; answer-cache lookups by tier; refusals by error code (``rate_limited`` is a cap
refusal, ``team_busy`` the pool's wait bound). Labels come from fixed sets (route templates,
codes, stage names), never from a path or a query, so the series stay few.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

#: Seconds: from a cache hit to a slow streamed answer.
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

FAMILIES = {
    "localkb_team_requests_total": ("counter", "HTTP requests answered, by route template and status"),
    "localkb_team_request_seconds": ("histogram", "time to answer a request (a stream: to its end)"),
    "localkb_team_errors_total": ("counter", "error replies by code (rate_limited: a cap refusal)"),
    "localkb_team_pool_wait_seconds": ("histogram", "wait for a pooled database connection"),
    "localkb_team_stage_seconds": ("histogram", "time in one stage of a search or a chat turn"),
    "localkb_team_chat_cache_total": ("counter", "team chat turns by answer-cache result"),
    "localkb_team_inflight": ("gauge", "requests being answered now"),
    "localkb_team_pool_connections": ("gauge", "pooled database connections by state"),
}

Labels = tuple[tuple[str, str], ...]


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join('{}="{}"'.format(k, v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
                     for k, v in labels)
    return "{" + inner + "}"


class Metrics:
    """Thread-safe counters and histograms, rendered on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, Labels], float] = {}
        self._hists: dict[tuple[str, Labels], list[float]] = {}  # bucket counts, then sum, count
        #: Gauges read when scraped: name -> () -> {labels: value}.
        self.gauges: dict[str, Callable[[], Mapping[Labels, float]]] = {}

    def inc(self, name: str, by: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + by

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            h = self._hists.get(key)
            if h is None:
                h = self._hists[key] = [0.0] * (len(BUCKETS) + 2)
            for i, le in enumerate(BUCKETS):
                if seconds <= le:
                    h[i] += 1
            h[-2] += seconds
            h[-1] += 1

    # -- what the server reports -----------------------------------------------------------
    def request(self, method: str, route: str, status: int, seconds: float, code: str | None) -> None:
        self.inc("localkb_team_requests_total", method=method, route=route, status=str(status))
        self.observe("localkb_team_request_seconds", seconds, route=route)
        if code:
            self.inc("localkb_team_errors_total", code=code)

    def stages_ms(self, stages: Mapping[str, object], prefix: str = "") -> None:
        """Stage timings in milliseconds (``{"embed": 3.1}`` or a search trace's ``embed_ms``)."""
        for name, ms in stages.items():
            if isinstance(ms, int | float) and not isinstance(ms, bool) and name != "total":
                self.observe("localkb_team_stage_seconds", float(ms) / 1000,
                             stage=prefix + name.removesuffix("_ms"))

    def query(self, kind: str, cache: str | None, stages: Mapping[str, object] | None) -> None:
        """One query-log row: its stages, and for a chat turn the answer cache's result."""
        if kind == "team-chat":
            self.inc("localkb_team_chat_cache_total", result=cache or "miss")
            self.stages_ms(stages or {}, "chat_")

    def render(self) -> str:
        with self._lock:
            counters = dict(self._counters)
            hists = {k: list(v) for k, v in self._hists.items()}
        gauges = {name: read() for name, read in self.gauges.items()}
        out: list[str] = []
        for family, (kind, help_) in FAMILIES.items():
            out += [f"# HELP {family} {help_}", f"# TYPE {family} {kind}"]
            if kind == "counter":
                out += [f"{family}{_labels(lab)} {v:g}" for (n, lab), v in sorted(counters.items())
                        if n == family]
            elif kind == "gauge":
                out += [f"{family}{_labels(lab)} {v:g}" for lab, v in sorted(gauges.get(family, {}).items())]
            else:
                for (n, lab), h in sorted(hists.items()):
                    if n != family:
                        continue
                    for le, count in zip(BUCKETS, h, strict=False):
                        out.append(f"{family}_bucket{_labels((*lab, ('le', f'{le:g}')))} {count:g}")
                    out.append(f"{family}_bucket{_labels((*lab, ('le', '+Inf')))} {h[-1]:g}")
                    out.append(f"{family}_sum{_labels(lab)} {h[-2]:.6f}")
                    out.append(f"{family}_count{_labels(lab)} {h[-1]:g}")
        return "\n".join(out) + "\n"
