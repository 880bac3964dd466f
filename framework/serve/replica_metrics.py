"""``/metrics`` of ``ortgen serve --ray``: every replica's series, labelled by replica, and
their total.

Each replica scrapes its own counters (the single-process server's
:class:`~ortgen.serve.metrics.ServerCollector`) and swaps them with the other replicas'
through the hub (``ray_replica``), about once a second. A scrape, whichever replica the
proxy sends it to, gives that replica's series as they are now and the others' as of
their last report (at most ~1 s old): each series once per replica with a ``replica``
label (Ray Serve's replica id), then once more with ``replica="all"``: the sum over the
replicas (the largest for a peak; a summary's quantiles cannot be combined and are left
out of the total: the histogram of the same samples can be). A replica that stops
reporting (killed, replaced) leaves the scrape after a few seconds, and the totals drop
with it, as a counter does when its process restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

#: the label that names a replica, and its value on the totals
LABEL = "replica"
ALL = "all"
#: series whose total is the largest replica's value, not the sum
_LARGEST = {"ortgen_peak_batch_size"}


@dataclass
class Report:
    """What a replica tells the hub: its id, its series now, its requests in flight,
    and whether it drains."""

    replica: str
    families: list[Metric]
    in_flight: int
    draining: bool


class ReplicasCollector(Collector):
    """The series of every replica (this one's read now, the others' last reports), and
    their totals."""

    def __init__(
        self, own: CollectorRegistry, replica: str, others: Callable[[], list[Report]]
    ) -> None:
        self.own = own
        self.replica = replica
        self.others = others

    def collect(self) -> Iterator[Metric]:
        reports = [(self.replica, list(self.own.collect()))]
        reports += [(r.replica, r.families) for r in self.others() if r.replica != self.replica]
        merged: dict[str, Metric] = {}
        totals: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for replica, families in sorted(reports, key=lambda item: item[0]):
            for family in families:
                out = merged.get(family.name)
                if out is None:
                    out = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = out
                    totals[family.name] = {}
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, LABEL: replica}, sample.value)
                    if "quantile" in sample.labels:
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    table = totals[family.name]
                    if key not in table:
                        table[key] = sample.value
                    elif family.name in _LARGEST:
                        table[key] = max(table[key], sample.value)
                    else:
                        table[key] += sample.value
        for name, out in merged.items():
            for (sample_name, labels), value in totals[name].items():
                out.add_sample(sample_name, {**dict(labels), LABEL: ALL}, value)
            yield out


def registry(
    own: CollectorRegistry, replica: str, others: Callable[[], list[Report]]
) -> CollectorRegistry:
    """A replica's ``/metrics`` registry: its own (the app's) and the others'."""
    combined = CollectorRegistry()
    combined.register(ReplicasCollector(own, replica, others))
    return combined
