"""An import-linter contract type ortgen's own contracts use: ``public_api``.

import-linter's ``forbidden`` contract lists what a package may not import; the rule for
the built-in plugins is the other way round ("ortgen.plugins imports ortgen's public
API and nothing else of ortgen"), and a forbidden list would let every module added
later through. So this contract lists what is allowed:

    [[tool.importlinter.contracts]]
    type = "public_api"
    source_modules = ["ortgen.plugins"]
    public_modules = ["ortgen", "ortgen.protocols", ...]

Every direct import made by a module of a source package of a module of the root package
must be one of ``public_modules`` exactly (``ortgen`` is the package's ``__init__``, not
everything under it) or inside the source package itself. Indirect imports do not count:
``from ortgen import load`` imports the package, and what the package imports is its own
business. Other packages (numpy, onnxruntime) are not checked, nor imports under ``if
TYPE_CHECKING:`` (annotations, as ``exclude_type_checking_imports`` says for the graph).

``ortgen.plugins`` lives in ``plugins/`` (setuptools' ``package-dir``), outside the
``framework/`` folder import-linter's graph is built from, so a source package missing
from the graph is read here, from the files its import spec points at. Registered in
``[tool.importlinter] contract_types``; ``lint-imports`` runs from the repository root,
which it puts on ``sys.path``, so ``tests.import_contracts`` imports.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from importlinter import Contract, ContractCheck, fields, output


class PublicApiContract(Contract):
    """Source packages may import, of the root package, only the listed public modules."""

    type_name = "public_api"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    public_modules = fields.ListField(subfield=fields.ModuleField())

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        public = {module.name for module in self.public_modules}  # type: ignore[attr-defined]
        missing = sorted(name for name in public if name not in graph.modules)
        roots = {name.split(".")[0] for name in graph.modules}
        illegal: list[dict[str, Any]] = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            package = _package_modules(source.name, graph)
            known = set(graph.modules) | set(package)
            for importer, path in sorted(package.items()):
                for imported, line in _imports(importer, path, known):
                    if imported.split(".")[0] not in roots:
                        continue  # another package
                    if imported in package or imported in public:
                        continue
                    link = {"importer": importer, "imported": imported, "line": line}
                    if link not in illegal:  # one line may import several names
                        illegal.append(link)
        return ContractCheck(
            kept=not illegal and not missing,
            metadata={"illegal": illegal, "missing": missing, "public": sorted(public)},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for name in check.metadata["missing"]:
            output.print_error(f"public module {name} does not exist", bold=False)
            output.new_line()
        for link in check.metadata["illegal"]:
            output.print_error(
                f"{link['importer']} -> {link['imported']} (l.{link['line']}): not public API",
                bold=False,
            )
            output.new_line()
        output.print_error(
            "Import only these of ortgen (docs/plugins.md, 'What a plugin may import'): "
            + ", ".join(check.metadata["public"]),
            bold=False,
        )
        output.new_line()


def _package_modules(name: str, graph: Any) -> dict[str, Path | None]:
    """Every module of package ``name`` (itself included), with its file when the graph
    does not hold it (then it is read from the package's folder)."""
    if name in graph.modules:
        return {module: None for module in {name, *graph.find_descendants(name)}}
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"public_api contract: {name} is not an importable package")
    folder = Path(next(iter(spec.submodule_search_locations)))
    modules: dict[str, Path | None] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((name, *parts))] = path
    return modules


def _imports(module: str, path: Path | None, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for each import ``module`` makes at run time; a module in
    the graph is asked there, one read from ``path`` is parsed."""
    if path is None:
        return  # in the graph: the layers contracts cover those; sources here are read
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    for node in _runtime_nodes(tree.body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.module, node.level)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield (child if child in known else base), node.lineno


def _runtime_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included, except those under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_nodes(node.orelse)
            continue
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _runtime_nodes([child])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, is_package: bool, name: str | None, level: int) -> str:
    """The absolute name ``from <level dots><name> import`` refers to inside ``module``."""
    if level == 0:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)
