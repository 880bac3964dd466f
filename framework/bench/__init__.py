"""``ortgen bench``: speed, memory and output quality measured apart.

- ``speed``: one request's prefill and decode timings, peak RSS and KV bytes
  (``run_bench``), and the report's table (``format_report``);
- ``caches``: KV-cache backends side by side, each in a fresh process;
- ``quality``: teacher-forced perplexity and top-1 agreement on a fixed text.
"""

from .speed import BenchSettings, format_report, run_bench

__all__ = ["BenchSettings", "format_report", "run_bench"]
