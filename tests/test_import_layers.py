"""The modules form layers without import cycles: every module of ``hf_unlearn`` belongs to one layer of
:data:`LAYERS`, imports only modules of its own layer or below (imports inside functions and under ``TYPE_CHECKING``
count), and no two modules import each other, directly or around a cycle; the lab (``benchmarks/unlearn_bench``)
has no import cycle either. That the library never imports the lab is ``test_import_graph``'s."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from test_import_graph import import_from_target

PACKAGE = Path(__file__).resolve().parents[1] / "hf_unlearn"

#: Bottom to top. A module's layer is that of the longest prefix naming it.
LAYERS = (
    ("foundation", ("hf_unlearn.assets", "hf_unlearn.registry", "hf_unlearn.result", "hf_unlearn.artifact_kinds", "hf_unlearn.locking",
                    "hf_unlearn.write_gate", "hf_unlearn.integrity", "hf_unlearn.model_shape",
                    "hf_unlearn.safe_output", "hf_unlearn.devices", "hf_unlearn.partitioning", "hf_unlearn.console",
                    "hf_unlearn.jsonutil", "hf_unlearn._import_utils", "hf_unlearn.model_files",
                    "hf_unlearn.model_copy")),
    ("data", ("hf_unlearn.data", "hf_unlearn.logprobs", "hf_unlearn.scoring_pass")),
    ("measures", ("hf_unlearn.evaluation", "hf_unlearn.selection")),
    ("publishing", ("hf_unlearn.hub",)),
    ("methods", ("hf_unlearn.methods",)),
    ("running", ("hf_unlearn.run", "hf_unlearn.options", "hf_unlearn.preconditions", "hf_unlearn.scripts",
                 "hf_unlearn.demo", "hf_unlearn.model_options", "hf_unlearn.memory_plan")),
    ("front", ("hf_unlearn.cli",)),
    ("package", ("hf_unlearn",)),
)


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def _module_files(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if "__pycache__" not in parts:
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` imports, at any depth (function-local and ``TYPE_CHECKING``
    imports too), relative imports resolved against ``module``: ``from X import y`` is an import of ``X.y`` when
    that is a module, else of ``X``; an import of a name no module has resolves to its longest known prefix."""

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(known(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = import_from_target(node, package)
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else known(target))
    return {m for m in found if m}


def import_edges(files: dict[str, Path], ignore: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, at any depth, each import resolved to the longest module name
    the package has; a module's own packages above it (imported implicitly) and the modules under ``ignore`` are
    left out, except the top-level package: a name taken from its ``__init__`` is an import of the top layer."""

    edges = {}
    for module, path in files.items():
        found = imported_names(path.read_text(), module, path.name == "__init__.py", set(files))
        top = module.split(".")[0]
        edges[module] = {m for m in found if m and m != module and (m == top or not module.startswith(m + "."))
                         and not any(m == i or m.startswith(i + ".") for i in ignore)}
    return edges


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    """The scan sees an import inside a function: two modules that import each other only there form a circle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text(textwrap.dedent("""
        def later():
            from .a import thing
            return thing
    """))
    (pkg / "c.py").write_text("from .a import x\n")
    edges = import_edges(_module_files(pkg))
    assert edges["pkg.b"] == {"pkg.a"}
    assert import_cycles(edges) == [["pkg.a", "pkg.b"]]


def test_the_package_and_the_lab_have_no_import_cycle():
    lab = PACKAGE.parent / "benchmarks" / "unlearn_bench"
    cycles = import_cycles(import_edges(_module_files(PACKAGE)))
    lab_cycles = import_cycles(import_edges(_module_files(lab)))
    assert len(_module_files(lab)) > 10
    assert not cycles and not lab_cycles, cycles + lab_cycles


def test_every_module_has_a_layer_and_imports_none_above_it():
    files = _module_files(PACKAGE)
    unassigned = sorted(m for m in files if layer_of(m) is None)
    assert not unassigned, f"give these modules a layer in LAYERS: {unassigned}"
    upward = []
    for module, targets in import_edges(files).items():
        upward += [f"{module} [{LAYERS[layer_of(module)][0]}] -> {t} [{LAYERS[layer_of(t)][0]}]"
                   for t in sorted(targets) if layer_of(t) > layer_of(module)]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)
