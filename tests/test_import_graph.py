"""tuneup's modules import one another in one direction (DESIGN.md, "One direction of flow"): no import
circle between modules or between the packages of the layers, and the layers that read runs keep off torch
and the trainers. Every import statement counts, wherever it stands: at the top, inside a function or a
method, under `if TYPE_CHECKING:`. An import inside a function only hides a circle until the day two
modules are imported in the other order; a TYPE_CHECKING import is still a dependency a reader and a type
checker follow.

The graph is read from the source with `ast` (nothing is imported), so the test takes milliseconds and sees
the code as it is written, not as one import order happens to execute it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source directory -> the package name it is installed as (pyproject's package-dir).
SOURCES = {"tuneup": ROOT / "tuneup", "tuneup.plugins": ROOT / "plugins"}
TRAINERS = ("lightning", "pytorch_lightning")
HEAVY = ("torch", *TRAINERS)
# The layers that read runs: a report is made on a laptop, in CI or on another machine, from files alone.
READING_LAYERS = (
    "tuneup.analyze",
    "tuneup.advise",
    "tuneup.report",
    "tuneup.record",
    "tuneup.catalog",
    "tuneup.cost",
)
RECORDER = "tuneup.recording"  # trainer-agnostic: every adapter imports it, it imports no adapter


@dataclass
class ImportGraph:
    modules: dict[str, Path]
    # (importer, imported tuneup module) -> where: "path:line" of each statement.
    edges: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    # importer -> {top-level name of an outside package: where}.
    external: dict[str, dict[str, list[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def successors(self, module: str) -> list[str]:
        return sorted(dst for (src, dst) in self.edges if src == module)


def _module_names() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The tuneup module a dotted name loads: itself, or the longest package prefix that exists
    (`tuneup.report.format.plural` is an attribute of tuneup.report.format)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def build_graph() -> ImportGraph:
    graph = ImportGraph(_module_names())
    modules = graph.modules
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        where_base = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    package = package[: len(package) - (node.level - 1)]
                    base = ".".join([*package, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                # `from tuneup.report import advice` loads the submodule; `from tuneup.report import
                # ReportError` the package.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            where = f"{where_base}:{getattr(node, 'lineno', '?')}"
            for target in dict.fromkeys(targets):  # `from m import a, b` is one import of m
                resolved = _resolve(target, modules) if target.split(".")[0] == "tuneup" else None
                if resolved is not None:
                    if resolved != module:
                        graph.edges[(module, resolved)].append(where)
                elif target.split(".")[0] != "tuneup":
                    graph.external[module][target.split(".")[0]].append(where)
    return graph


def strongly_connected(nodes: list[str], successors: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (a circle), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in successors.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return sorted(found)


def _circles_text(components: list[list[str]], edges: dict[tuple[str, str], list[str]]) -> str:
    lines = []
    for component in components:
        lines.append(f"circle of {len(component)}: {', '.join(component)}")
        members = set(component)
        for (src, dst), where in sorted(edges.items()):
            if src in members and dst in members:
                lines.append(f"  {src} -> {dst}  ({', '.join(where)})")
    return "\n".join(lines)


def _layer(module: str) -> str:
    """The package a module belongs to for the layering: `tuneup.analyze.model` -> `tuneup.analyze`,
    `tuneup.plugins.lightning.callback` -> `tuneup.plugins.lightning`; a top-level module is its own."""
    parts = module.split(".")
    depth = 3 if parts[:2] == ["tuneup", "plugins"] else 2
    return ".".join(parts[:depth])


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return build_graph()


def test_the_graph_sees_every_kind_of_import(graph: ImportGraph) -> None:
    # The reader itself: a module-level import, one inside a function, a TYPE_CHECKING one, a relative-free
    # `from package import submodule`, and plugins/ read as tuneup.plugins.
    assert "tuneup.plugins.lightning.callback" in graph.modules
    assert ("tuneup", "tuneup.record") in graph.edges  # top of tuneup/__init__.py
    assert ("tuneup.cli", "tuneup.report") in graph.edges  # inside a function, and under TYPE_CHECKING
    assert ("tuneup.report.sections", "tuneup.report.sections.cost") in graph.edges  # from pkg import mod
    assert "torch" in graph.external["tuneup.collect.comm"]  # inside functions only


def test_no_module_import_circle(graph: ImportGraph) -> None:
    successors: dict[str, list[str]] = defaultdict(list)
    for src, dst in graph.edges:
        successors[src].append(dst)
    circles = strongly_connected(sorted(graph.modules), successors)
    assert not circles, "import circles between modules:\n" + _circles_text(circles, graph.edges)


def test_no_import_circle_between_packages(graph: ImportGraph) -> None:
    # One layer calling up into another that imports it back is a circle even where no two modules are in
    # one: analyze.analysis -> cost.figures -> analyze.model was one.
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (src, dst), where in graph.edges.items():
        a, b = _layer(src), _layer(dst)
        if a != b and a != "tuneup" and b != "tuneup":  # the root package's lazy re-exports join no layer
            edges[(a, b)].extend(f"{src} -> {dst} {w}" for w in where)
    successors: dict[str, list[str]] = defaultdict(list)
    for src, dst in edges:
        successors[src].append(dst)
    circles = strongly_connected(sorted({_layer(m) for m in graph.modules}), successors)
    assert not circles, "import circles between packages:\n" + _circles_text(circles, edges)


def _heavy_imports(graph: ImportGraph, prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{module} imports {name} ({', '.join(where)})"
        for module in sorted(graph.modules)
        if module == prefix or module.startswith(prefix + ".")
        for name, where in sorted(graph.external.get(module, {}).items())
        if name in forbidden
    ]


@pytest.mark.parametrize("layer", READING_LAYERS)
def test_reading_layers_import_no_torch_or_trainer(graph: ImportGraph, layer: str) -> None:
    assert any(m.startswith(layer) for m in graph.modules), f"{layer} is gone: update READING_LAYERS"
    bad = _heavy_imports(graph, layer, HEAVY)
    # Nor through tuneup's own modules that do: the collectors and the trainer adapters.
    bad += [
        f"{src} imports {dst} ({', '.join(where)})"
        for (src, dst), where in sorted(graph.edges.items())
        if _layer(src) == layer and _layer(dst) in ("tuneup.collect", "tuneup.plugins.lightning")
    ]
    assert not bad, "\n".join(bad)


def test_the_recorder_imports_no_adapter_and_no_trainer(graph: ImportGraph) -> None:
    assert any(m.startswith(RECORDER + ".") for m in graph.modules), f"{RECORDER} is gone: update RECORDER"
    bad = _heavy_imports(graph, RECORDER, TRAINERS)
    bad += [
        f"{src} imports {dst} ({', '.join(where)})"
        for (src, dst), where in sorted(graph.edges.items())
        if (src == RECORDER or src.startswith(RECORDER + ".")) and dst.startswith("tuneup.plugins")
    ]
    assert not bad, "\n".join(bad)
