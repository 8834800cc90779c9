"""The dependency rules of docs/architecture.md, checked on the source: no import cycles, no arrow from a
lower layer to a higher one, and no policy family or algorithm named in generic code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (setup.py's package_dir)
PACKAGES = {
    "embodrl": "embodrl",
    "policies": "embodrl.policies",
    "sims": "embodrl.sims",
    "deploy": "embodrl.deploy",
}
# (importer, imported it must never reach)
FORBIDDEN = [
    ("embodrl.policies", "embodrl.engine"),
    ("embodrl.policies", "embodrl.parallel"),
    ("embodrl.policies", "embodrl.train"),
    ("embodrl.policies", "embodrl.algos"),
    ("embodrl.policies", "embodrl.sims"),
    ("embodrl.sims", "embodrl.engine"),
    ("embodrl.sims", "embodrl.parallel"),
    ("embodrl.sims", "embodrl.train"),
    ("embodrl.sims", "embodrl.algos"),
    ("embodrl.sims", "embodrl.policies"),
    ("embodrl.algos", "embodrl.engine"),
    ("embodrl.algos", "embodrl.train"),
    ("embodrl.algos", "embodrl.sims"),
    ("embodrl.algos", "embodrl.policies"),
    ("embodrl.deploy", "embodrl.train"),
    ("embodrl.deploy", "embodrl.engine"),
    ("embodrl.deploy", "embodrl.parallel"),
    ("embodrl.deploy", "embodrl.algos"),
    ("embodrl.engine", "embodrl.train"),
    ("embodrl.parallel", "embodrl.train"),
    ("embodrl.parallel", "embodrl.engine"),
    ("embodrl.data", "embodrl.train"),
    ("embodrl.data", "embodrl.engine"),
    ("embodrl.rewards", "embodrl.train"),
    ("embodrl.rewards", "embodrl.engine"),
    ("embodrl.rewards", "embodrl.parallel"),
    ("embodrl.rewards", "embodrl.algos"),
    # the network split sits beside the commands: nothing under it reaches up to it
    *[
        (f"embodrl.{lower}", "embodrl.remote")
        for lower in ("policies", "sims", "algos", "engine", "train", "data", "parallel", "rewards")
    ],
]
GENERIC = ("embodrl.engine", "embodrl.train", "embodrl.algos", "embodrl.parallel")
FAMILIES = ("gaussian", "flow", "autoregressive", "diffusion", "vla")
ALGORITHMS = ("ppo", "grpo", "sac", "dsrl_na")


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def imports_of(name: str, path: Path) -> set[str]:
    """The project modules `name` imports anywhere in its file (function-level imports included)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in MODULES:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_layer_imports_a_higher_one():
    breaks = [
        f"{importer} imports {imported}"
        for importer, targets in GRAPH.items()
        for imported in targets
        for low, high in FORBIDDEN
        if within(importer, low) and within(imported, high)
    ]
    assert not breaks, "\n".join(sorted(breaks))


def test_no_import_cycles():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(" <-> ".join(sorted(component)))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not cycles, "\n".join(cycles)


def named_in_code(path: Path, names: tuple[str, ...]) -> list[str]:
    """String constants equal to one of `names`, and attributes named like one (e.g. `cfg.flow`)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in names:
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in names:
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    return hits


@pytest.mark.parametrize("names", [FAMILIES, ALGORITHMS], ids=["families", "algorithms"])
def test_generic_code_names_no_family_or_algorithm(names):
    exempt = ("registry", "config")  # the tables that map names to code, and the configs that choose them
    own = "embodrl.algos"  # the algorithms' own package implements them by name
    hits = [
        hit
        for name, path in MODULES.items()
        if any(within(name, prefix) for prefix in GENERIC)
        and path.stem not in exempt
        and not (names is ALGORITHMS and within(name, own))
        for hit in named_in_code(path, names)
    ]
    assert not hits, "\n".join(hits)
