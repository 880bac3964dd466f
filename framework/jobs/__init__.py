"""Batch jobs (``ortgen run``): a file of requests in, one result line per row out.

- ``rows``: reading and checking input rows (JSONL, or Parquet with pyarrow);
- ``formats``: the input's format (ortgen's rows, or OpenAI's batch lines:
  ``openai_batch``) and the output lines that go with it;
- ``check``: counting rows, bad rows and duplicate ids without generating;
- ``dry_run``: ``ortgen run --dry-run``, the pipeline and the rows checked, no model;
- ``results``: the append-only output that a killed job resumes from;
- ``runner``: batching, sorting by length, retrying a failed batch row by row;
- ``embedding``: embedding rows (``task = "embed"``, OpenAI's ``/v1/embeddings`` lines);
- ``ray_engine``: the same rows on a pool of Ray actors (imports Ray only when it runs);
- ``progress``: the live line on a terminal and the summary.
"""

from __future__ import annotations

from pathlib import Path

from .check import InputReport, scan_rows
from .formats import job_format
from .progress import JobSummary
from .rows import InputRow, RowChecker, SettingsCheck, read_rows
from .runner import RowRunner, run_job

__all__ = [
    "InputReport",
    "InputRow",
    "JobSummary",
    "RowChecker",
    "RowRunner",
    "check_input",
    "read_rows",
    "run_job",
    "scan_rows",
]


def check_input(
    path: str | Path, check_settings: SettingsCheck | None = None, input_format: str | None = None
) -> InputReport:
    """Read every row of ``path`` without generating.

    ``check_settings(own)`` raises ConfigError for a row's bad settings (for example the
    pipeline's config resolved with them), so they are reported with the row.
    ``input_format``: as ``run_job`` takes it (None: by the first line)."""
    return job_format(path, input_format).scan(path, check_settings)
