"""The Ray Serve app's Grafana dashboard (``integrations/ray_serve/grafana_dashboard.json``):
its queries, and a scrape-based evaluator for tests and the live benchmark.

`queries` lists every PromQL expression of the dashboard, `metric_names` the metrics an
expression reads (every metric here is namespaced, ``vllm:`` or ``policies:``), and
`scrape` reads a Prometheus endpoint the way Prometheus does, adding the target's labels
(``replica``, ``role``, ... from the app's metrics targets). `Series` keeps scrapes over
time and `evaluate` computes the dashboard's expressions on them (the subset they use:
``sum [by (labels)] (...)``, ``rate(m[window])``, ``histogram_quantile(q, ...)``,
``a / b``), so the dashboard's panels can be drawn from a live run without a Prometheus
server (see ``benchmarks/ray_serve_live.py``).
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

import integrations.ray_serve

DASHBOARD_PATH = Path(integrations.ray_serve.__file__).with_name("grafana_dashboard.json")
_METRIC = re.compile(r"(?<![\w:])([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+)")
_TOKEN = re.compile(r"\s*(\d+\.\d+|\d+|\$__\w+|[A-Za-z_][\w:]*|\[[^\]]*\]|\{[^}]*\}|[(),/])")
DEFAULT_WINDOW_S = 30.0
"""What ``$__rate_interval`` stands for when evaluating without Grafana."""

Labels = tuple[tuple[str, str], ...]


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict:
    """The dashboard JSON."""
    return json.loads(Path(path).read_text())


def queries(dashboard: Mapping) -> list[tuple[str, str, str]]:
    """(panel title, PromQL expression, legend format) of every query, in panel order."""
    return [(panel["title"], target["expr"], target.get("legendFormat", ""))
            for panel in dashboard["panels"] for target in panel.get("targets", ())]


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads (sample names, e.g. ``vllm:prefix_cache_hits_total``)."""
    return set(_METRIC.findall(expr))


Sample = tuple[str, Labels, float]


def parse_samples(text: str, extra_labels: Mapping[str, str] | None = None) -> list[Sample]:
    """Every sample of a Prometheus text exposition, with ``extra_labels`` added."""
    from prometheus_client.parser import text_string_to_metric_families

    extra = dict(extra_labels or {})
    return [(s.name, tuple(sorted({**s.labels, **extra}.items())), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(address: str, extra_labels: Mapping[str, str] | None = None,
           timeout_s: float = 10.0) -> list[Sample]:
    """Scrape ``http://address/metrics`` (or a full URL), adding ``extra_labels``."""
    url = address if address.startswith("http") else f"http://{address}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return parse_samples(answer.read().decode(), extra_labels)


@attrs.define(eq=False)
class Series:
    """Scrapes over time: ``add(t, samples)`` per scrape round (all targets together)."""

    times: list[float] = attrs.field(factory=list)
    rounds: list[dict[tuple[str, Labels], float]] = attrs.field(factory=list)

    def add(self, t: float, samples: Iterable[Sample]) -> None:
        """Record one scrape round taken at ``t`` seconds."""
        self.times.append(t)
        self.rounds.append({(name, labels): value for name, labels, value in samples})

    def at(self, t: float) -> dict[tuple[str, Labels], float]:
        """The latest round taken at or before ``t`` ({} before the first)."""
        found: dict[tuple[str, Labels], float] = {}
        for when, values in zip(self.times, self.rounds, strict=True):
            if when > t:
                break
            found = values
        return found


Vector = dict[Labels, float]


def evaluate(expr: str, series: Series, t: float, window_s: float = DEFAULT_WINDOW_S) -> Vector:
    """``expr`` at time ``t`` over ``series`` (label set -> value; empty when undefined)."""
    tokens = [m.group(1) for m in _TOKEN.finditer(expr)]
    if "".join(tokens).replace(" ", "") != expr.replace(" ", ""):
        raise ValueError(f"cannot tokenize {expr!r}")
    parser = _Parser(tokens, series, t, window_s)
    value = parser.expression()
    if parser.position != len(tokens):
        raise ValueError(f"unexpected {tokens[parser.position]!r} in {expr!r}")
    return value


@attrs.define
class _Parser:
    tokens: list[str]
    series: Series
    t: float
    window_s: float
    position: int = 0

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r}, got {token!r}")
        self.position += 1
        return token

    def expression(self) -> Vector:
        left = self.term()
        while self.peek() == "/":
            self.take("/")
            right = self.term()
            left = {k: v / right[k] for k, v in left.items()
                    if k in right and right[k] != 0}
        return left

    def term(self) -> Vector:
        token = self.peek()
        if token == "sum":
            self.take()
            by: tuple[str, ...] = ()
            if self.peek() == "by":
                self.take()
                self.take("(")
                while self.peek() != ")":
                    name = self.take()
                    if name != ",":
                        by += (name,)
                self.take(")")
            self.take("(")
            inner = self.expression()
            self.take(")")
            out: Vector = {}
            for labels, value in inner.items():
                key = tuple((k, v) for k, v in labels if k in by)
                out[key] = out.get(key, 0.0) + value
            return out
        if token == "rate":
            self.take()
            self.take("(")
            name, matchers = self.selector()
            window = self.take()
            self.take(")")
            return self.rate(name, matchers, _window_s(window, self.window_s))
        if token == "histogram_quantile":
            self.take()
            self.take("(")
            quantile = float(self.take())
            self.take(",")
            buckets = self.expression()
            self.take(")")
            return _quantiles(quantile, buckets)
        if token == "(":
            self.take()
            value = self.expression()
            self.take(")")
            return value
        name, matchers = self.selector()
        return {labels: value for (metric, labels), value in self.series.at(self.t).items()
                if metric == name and _matches(labels, matchers)}

    def selector(self) -> tuple[str, dict[str, str]]:
        name = self.take()
        matchers: dict[str, str] = {}
        if self.peek().startswith("{"):
            for part in filter(None, self.take()[1:-1].split(",")):
                key, _, value = part.partition("=")
                matchers[key.strip()] = value.strip().strip('"')
        return name, matchers

    def rate(self, name: str, matchers: dict[str, str], window_s: float) -> Vector:
        now, before = self.series.at(self.t), self.series.at(self.t - window_s)
        times = [w for w in self.series.times if w <= self.t]
        earlier = [w for w in times if w <= self.t - window_s]
        if not times or not earlier:
            return {}
        span = times[-1] - earlier[-1]
        out = {}
        for (metric, labels), value in now.items():
            if metric == name and _matches(labels, matchers) and span > 0:
                start = before.get((metric, labels), 0.0)
                out[labels] = max(0.0, value - start) / span  # a reset counts from 0
        return out


def _matches(labels: Labels, matchers: Mapping[str, str]) -> bool:
    present = dict(labels)
    return all(present.get(k) == v for k, v in matchers.items())


def _window_s(token: str, default_s: float) -> float:
    text = token.strip("[]")
    if text.startswith("$__"):
        return default_s
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


def _quantiles(quantile: float, buckets: Vector) -> Vector:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, count in buckets.items():
        rest = tuple((k, v) for k, v in labels if k != "le")
        bound = dict(labels).get("le")
        if bound is not None:
            groups.setdefault(rest, []).append((float(bound), count))
    out = {}
    for labels, pairs in groups.items():
        pairs.sort()
        total = pairs[-1][1] if pairs else 0.0
        if total <= 0:
            continue
        rank, lower, below = quantile * total, 0.0, 0.0
        for bound, count in pairs:
            if count >= rank:
                if math.isinf(bound):
                    out[labels] = lower
                else:
                    share = (rank - below) / (count - below) if count > below else 1.0
                    out[labels] = lower + (bound - lower) * share
                break
            lower, below = bound, count
    return out
