"""What a job's rows were done under, kept with its output, so that a rerun under other
settings stops instead of mixing rows of two kinds in one output.

A job's fingerprint covers everything besides the row itself that decides a row's
result: the model's identity (:func:`model_identity`), the generation config resolved
from the pipeline and the job's settings (library defaults < ``[generation]`` <
flags), the processor chain and sampler that config builds, its constraint, and ortgen's
output format. Its id is a hash of all that; ``OUT.run.json`` beside the output (for
``out.parquet``: ``out.parquet.run.json``), written before the job's first row, keeps the
id and what a message needs to name a change (the model's files, the settings that are
not the library's defaults, the processors' names). Each result line carries
``"fingerprint"``: the job's id, or for a row with settings of its own a hash of the
job's id and those settings, so a rerun knows of every row done whether it was done
under the settings asked for now. An OpenAI batch output's lines are OpenAI's shape and
have no such key: it keeps each row's fingerprint beside them (:func:`prints_path`,
``openai_batch.BatchOutput``), and the job format's rows (``formats.JobFormat``) are
what a fingerprint is taken of, in either format.

A rerun whose rows were done under other settings stops before any row with one line
naming what changed (:class:`SettingsChanged`); ``rerun_changed`` (``--rerun-changed``)
drops those rows' lines instead and does them again, keeping the rest. Both engines
compute the same fingerprints (the driver, not a Ray worker, stamps each line), so they
can still take turns on one output.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import config as config_mod
from ..errors import OutputError
from ..model.manifest import MANIFEST_NAME
from ..model.paths import default_model_dir
from ..plugin_host.chains import processor_specs, sampler_spec
from ..request.prompts import ROW_PROMPT_KEYS
from ..structured.settings import constraint
from .embedding import EMBED_INPUT, EmbedOptions
from .results import FINGERPRINT
from .rows import InputRow, id_key

if TYPE_CHECKING:
    from .results import ResultLog

__all__ = [
    "OUTPUT_FORMAT",
    "JobPrint",
    "SettingsChanged",
    "job_print",
    "model_identity",
    "prints_path",
    "reconcile",
    "record_path",
    "stamp",
]

#: the shape of a result line; a change that makes old lines read differently bumps it
OUTPUT_FORMAT = 1
_RECORD_SUFFIX = ".run.json"
_PRINTS_SUFFIX = ".prints.jsonl"
_SHOWN = 40  # longest value written out in a message
_DEFAULTS = config_mod.GenerationConfig().to_dict()
#: a row's input, not its settings: what a row's fingerprint leaves out
_INPUT_KEYS = (*ROW_PROMPT_KEYS, EMBED_INPUT)


class SettingsChanged(OutputError):
    """Rows of the output were done under other settings than the job asks for now."""

    def __init__(self, message: str, *, rows: int) -> None:
        super().__init__(message)
        self.rows = rows  # how many rows of the input are done under other settings


@dataclass(frozen=True)
class JobPrint:
    """A job's fingerprint: its id (a hash of everything it covers) and ``record``, what
    the output keeps of it to name a change: the format, the model's identity, the
    settings that differ from the library defaults and the names of the processors."""

    record: dict[str, Any]
    id: str

    def row(self, row: InputRow) -> str:
        """The fingerprint of ``row``'s result: the job's, and the row's own settings when
        it has some (a row that is not even JSON has none)."""
        request = row.request or {}
        own = {k: v for k, v in request.items() if k not in _INPUT_KEYS}
        return _hash([self.id, own]) if own else self.id


def job_print(
    model: str | Path | None,
    pipeline: Mapping[str, Any],
    settings: Mapping[str, Any],
    *,
    embedding: EmbedOptions | None = None,
) -> JobPrint:
    """The fingerprint of a job on ``model`` (None: the default model) with the pipeline
    layer ``pipeline`` and the job's own ``settings``. The model's own config files are
    not resolved here (a Ray driver does not load the model): they are part of the
    model's identity. An embed job's (``embedding``: its pooling options) covers the
    model and those options, not the generation settings its rows do not use."""
    if embedding is not None:
        record = {
            "format": OUTPUT_FORMAT,
            "task": "embed",
            "model": model_identity(model),
            "settings": embedding.to_dict(),
            "chain": [],
        }
        return JobPrint(_as_stored(record), _hash(record))
    with warnings.catch_warnings():  # the job resolved these settings already, and warned
        warnings.simplefilter("ignore")
        layers = [("pipeline", dict(pipeline)), ("call", dict(settings))]
        config = config_mod.resolve(layers).config
    values = config.to_dict()
    chain = processor_specs(config)
    record = {
        "format": OUTPUT_FORMAT,
        "model": model_identity(model),
        "settings": {k: v for k, v in values.items() if v != _DEFAULTS.get(k)},
        "chain": [name for name, _ in chain] + [sampler_spec(config)[0]],
    }
    every = {**record, "config": values, "chain": [chain, sampler_spec(config)]}
    every["constraint"] = constraint(config)
    return JobPrint(_as_stored(record), _hash(every))


def model_identity(model: str | Path | None) -> dict[str, Any]:
    """What the model is, cheaply (no byte of the weights is read): each file's size, and
    either the sha256 of the folder's ``ortgen_manifest.json`` (an export's record of what
    made it, which a copy keeps) or, without one, each file's modification time. A GGUF
    file: its size and modification time. A path that cannot be read here (a Ray driver
    without the model): the path itself."""
    path = Path(model if model is not None else default_model_dir()).expanduser()
    try:
        if path.is_file():
            info = path.stat()
            return {"file": path.name, "size": info.st_size, "mtime_ns": info.st_mtime_ns}
        manifest = path / MANIFEST_NAME
        digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
        files: dict[str, Any] = {}
        for folder, names, found in os.walk(path):
            names[:] = sorted(n for n in names if not n.startswith("."))
            for name in sorted(n for n in found if not n.startswith(".")):
                info = Path(folder, name).stat()
                relative = Path(folder, name).relative_to(path).as_posix()
                files[relative] = info.st_size if digest else [info.st_size, info.st_mtime_ns]
    except OSError:
        return {"folder": str(path)}
    if not files:
        return {"folder": str(path)}
    return {"manifest": digest, "files": files} if digest else {"files": files}


def record_path(output: str | Path) -> Path:
    """Where an output's fingerprint is kept: ``OUT.run.json`` beside it."""
    output = Path(output)
    return output.with_name(output.name + _RECORD_SUFFIX)


def prints_path(output: str | Path) -> Path:
    """Where an output whose lines have no room for a fingerprint (OpenAI's batch output
    lines, whose shape is OpenAI's) keeps each row's: ``OUT.prints.jsonl`` beside it, one
    ``{"custom_id", "fingerprint"}`` line per row written (``openai_batch.BatchOutput``)."""
    output = Path(output)
    return output.with_name(output.name + _PRINTS_SUFFIX)


def stamp(records: list[dict[str, Any]], prints: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each result line with its row's fingerprint (``prints``: id key -> fingerprint)."""
    for record in records:
        record[FINGERPRINT] = prints[id_key(record["id"])]
    return records


def reconcile(
    job: JobPrint,
    results: ResultLog,
    rows: Iterable[InputRow],
    output_path: str | Path,
    *,
    rerun_changed: bool = False,
) -> None:
    """Before any row runs (the output open and locked): compare the fingerprint of every
    row of the input already done (``rows``: the input as its job format reads it,
    without settings checks) with the one it has now. Rows done under other
    settings stop the job with :class:`SettingsChanged`, or with ``rerun_changed`` are
    dropped from the output to be done again. Then the output records ``job``."""
    path = record_path(output_path)
    old = _read_record(path)
    changed: set[str] = set()
    first: list[InputRow] = []
    if results.prints:
        for row in rows:
            key = id_key(row.id)
            stored = results.prints.get(key)
            if stored is not None and stored != job.row(row):
                changed.add(key)
                if len(first) < 3:
                    first.append(row)
    if changed and not rerun_changed:
        what = _what_changed(old, job, first, len(changed), path)
        count = f"{len(changed)} row{'s' if len(changed) > 1 else ''}"
        raise SettingsChanged(
            f"{what} since this output was written: rerun with --rerun-changed to redo the "
            f"{count} done under the old settings, or write to a new --output",
            rows=len(changed),
        )
    if changed:
        results.forget(changed)
    _write_record(path, job)


def _what_changed(
    old: dict[str, Any] | None, job: JobPrint, rows: list[InputRow], count: int, path: Path
) -> str:
    """What differs, as the start of one sentence."""
    if old is None or not isinstance(old.get("record"), dict):
        return (
            f"the settings changed (this output's record of them, {path.name}, is missing, "
            "so what changed cannot be named)"
        )
    if old.get("fingerprint") != job.id:
        found = list(_differences(old["record"], job.record))
        if not found:
            return (
                "the settings changed (as this ortgen resolves them: a default or a "
                "processor it builds differs from the one that wrote this output)"
            )
        shown = found[:3]
        more = len(found) - len(shown)
        tail = f" and {more} more setting{'s' if more > 1 else ''}" if more else ""
        return _join(shown) + tail
    listed = "; ".join(f"{row.where}, id {row.id!r}" for row in rows)
    others = f" and {count - len(rows)} more" if count > len(rows) else ""
    own = "the row's own settings" if count == 1 else "the rows' own settings"
    return f"{own} changed ({listed}{others})"


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> Iterable[str]:
    """What the records tell apart; nothing when only what they do not keep differs (a
    default of the library, a processor's parameters this ortgen sets otherwise)."""
    if old.get("format") != new["format"]:
        yield f"ortgen's output format changed from {old.get('format')} to {new['format']}"
    if old.get("task", "generate") != new.get("task", "generate"):
        task = new.get("task", "generate")
        yield f"the task changed from {old.get('task', 'generate')} to {task}"
        return
    if old.get("model") != new["model"]:
        yield _model_change(old.get("model") or {}, new["model"])
    before, after = old.get("settings") or {}, new["settings"]
    changed = False
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key, _DEFAULTS.get(key)), after.get(key, _DEFAULTS.get(key))
        if was != now:
            changed = True
            yield _change(key, was, now)
    if not changed and old.get("chain") != new["chain"]:
        yield "the processor chain changed"


def _model_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    if "folder" in old or "folder" in new or "file" in old or "file" in new:
        return "the model changed"
    before, after = old.get("files") or {}, new.get("files") or {}
    names = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if not names:  # only the manifest: the same files, exported again
        return f"the model changed ({MANIFEST_NAME} differs)"
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return f"the model changed ({shown} differ{'s' if len(names) == 1 else ''})"


def _change(key: str, old: Any, new: Any) -> str:
    before, after = json.dumps(old), json.dumps(new)
    if len(before) > _SHOWN or len(after) > _SHOWN:
        return f"{key} changed"
    return f"{key} changed from {before} to {after}"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _as_stored(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples as lists, odd values as text)."""
    return json.loads(json.dumps(value, default=str))


def _hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_record(path: Path, job: JobPrint) -> None:
    """The output's record of its settings, replaced whole (a kill leaves the old one)."""
    data = {"fingerprint": job.id, "record": job.record}
    partial = path.with_name(path.name + ".tmp")
    try:
        with partial.open("w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
