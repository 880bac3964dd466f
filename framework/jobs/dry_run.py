"""``ortgen run --dry-run``: check a job without loading the model.

The pipeline is checked by loading it; the job's settings and each row's own settings
are resolved over the pipeline layer exactly as a request would resolve them (the
model's own config files are left out: reading them is cheap, but the point is to check
a job before the model is even there); every bad row is listed with its line number.
A row's own structured-output constraint (a ``regex``, a ``json_schema`` of its own) is
compiled too, without the model, as the pipeline's was when it loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import config as config_mod
from ..config import GenerationConfig
from ..config.pipeline import Pipeline
from ..loop.blame import CUTOFFS
from ..model.paths import has_model_config, not_a_model_folder
from ..plugin_host.chains import processor_specs
from ..request import row_settings
from ..structured.check import check_constraint
from ..structured.settings import CONSTRAINT_FIELDS, constraint
from .formats import job_format
from .ray_engine import RAY_MISSING, ray_available

__all__ = ["cut_before_constraint", "dry_run"]


def dry_run(
    pipeline: Pipeline,
    input_path: str | Path,
    settings: Mapping[str, Any],
    *,
    model: str | Path | None = None,
    engine: str = "local",
    input_format: str | None = None,
    task: str = "generate",
) -> tuple[list[str], bool]:
    """The report's lines, and whether everything is good. Raises ConfigError when the
    job's own settings are bad (no row could run). ``input_format`` and ``task`` as
    ``run_job`` takes them; OpenAI batch lines are checked as the rows their bodies make,
    an embed job's rows as texts to embed."""
    layers = [("pipeline", pipeline.settings)]
    job = config_mod.resolve([*layers, ("call", dict(settings))]).config
    warnings = cut_before_constraint(job)
    rows_cut: dict[str, int] = {}  # a row's own constraint after the job's cut-offs

    def check_settings(own: dict[str, Any]) -> None:
        config = config_mod.resolve([*layers, ("call", row_settings(settings, own))]).config
        found = constraint(config)
        if found is not None and any(key in own for key in CONSTRAINT_FIELDS):
            check_constraint(*found)
        for warning in cut_before_constraint(config):
            if warning not in warnings:
                rows_cut[warning] = rows_cut.get(warning, 0) + 1

    problems = []
    if engine == "ray" and not ray_available():
        problems.append(RAY_MISSING)
    model = model or pipeline.model_path()
    if model is not None and not has_model_config(model):
        problems.append(f"model {not_a_model_folder(model)}")
    fmt = job_format(input_path, input_format, task=task)
    report = fmt.scan(input_path, check_settings)
    where = pipeline.path or "pipeline"
    bad = report.problems
    kind = " (OpenAI batch lines)" if fmt.name == "openai" else ""
    lines = [
        f"pipeline {where}: {'; '.join(problems) or 'ok'}",
        *(f"  warning: {warning}" for warning in warnings),
        *(f"  warning: {n} row{'s' if n > 1 else ''}: {w}" for w, n in rows_cut.items()),
        f"input {input_path}{kind}: {report.rows} rows, {len(bad) or 'none'} bad",
        *(f"  {at}: {why}" for at, why in bad),
    ]
    return lines, not (problems or bad)


def cut_before_constraint(config: GenerationConfig) -> list[str]:
    """A warning for each cut-off processor (top_k, top_p, min_p, typical_p,
    epsilon_cutoff, eta_cutoff) given in ``logits_processors`` when the request has a
    constraint: those run before it in the chain (``processor_specs``), and may remove
    every token it allows, which fails the row at that step. As settings they run after
    the constraint, among the tokens it allows."""
    found = constraint(config)
    names = [name for name, _ in processor_specs(config)]
    if found is None or "grammar" not in names:
        return []
    before = names[: names.index("grammar")]
    return [
        f"logits_processors[{i}] ({spec['name']}) runs before the {found[0]} constraint "
        "and may remove every token it allows (such a row fails at that step): give "
        f"{spec['name']} as a setting, which runs after the constraint, or drop it"
        for i, spec in enumerate(config.logits_processors)
        if spec["name"] in CUTOFFS and spec["name"] in before
    ]
