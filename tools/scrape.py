"""A running server's Prometheus metrics, read over HTTP with `prometheus_client`'s own parser:
how the compatibility report and the benchmarks watch a server from outside its process."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(url: str, timeout: float = 10.0) -> list[Sample] | None:
    """Every sample `url`'s `/metrics` exposes now; None when it does not answer one."""
    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout).raise_for_status().text
    except httpx.HTTPError:
        return None
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def sample_value(url: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` with exactly these labels; None if there is none."""
    for s in scrape(url) or []:
        if s.name == name and s.labels == labels:
            return s.value
    return None
