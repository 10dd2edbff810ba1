"""The package's import graph: no module cycles, and layers import downwards only.

mechanisms (pure NumPy) <- storage (the device ledger) <- datasets <- schemas <- transforms (Beam)
<- plots, brokers <- pipelines (jobs) <- bench, cli (the verbs); the runtime room under them all.
Read from the source with ``ast`` (every ``import``/``from`` statement,
function-level ones included), so a deferred import cannot hide a cycle.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kvldp"
LEVELS = [["mechanisms"], ["storage"], ["datasets"], ["schemas"], ["transforms"], ["plots", "brokers"],
          ["pipelines"], ["bench", "cli"]]
LAYERS = {room: level for level, rooms in enumerate(LEVELS) for room in rooms}

# What the jobs may take from the command line's room: the parsers of durations, instants and paths
# that a job's config reads too (``units``).
PIPELINES_MAY_IMPORT_FROM_CLI = {"kvldp.cli.units"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The kvldp modules ``path`` imports (resolved to modules, not packages' names)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("kvldp")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("kvldp"):
                continue
            for a in node.names:     # "from kvldp.x import y": y may be a module
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m != me}


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}
GRAPH = {m: imports_of(p) for m, p in MODULES.items()}


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], -1) if len(parts) > 1 else -1


def test_the_graph_is_read():
    assert "kvldp.mechanisms.protocol" in GRAPH["kvldp.mechanisms.kv.pckv"]
    assert "kvldp.transforms.rounds" in GRAPH["kvldp.pipelines.graphs"]


def test_no_module_cycle():
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(n):], n]))
            if n in GRAPH and not state.get(n):
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if not state.get(m):
            visit(m)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("kvldp.runtime.")))
def test_the_runtime_room_imports_nothing_of_kvldp_but_itself(module):
    """The runtime room (the local runner and the process it runs in) sits
    under every layer: only the command's start (``runtime.start``) reaches
    up, to the CLI it starts."""
    outside = sorted(n for n in GRAPH[module] if not n.startswith("kvldp.runtime"))
    assert outside == ([] if module != "kvldp.runtime.start" else ["kvldp.cli.commands"]), outside


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) >= 0))
def test_layers_import_downwards_only(module):
    allowed = PIPELINES_MAY_IMPORT_FROM_CLI if module.startswith("kvldp.pipelines.") else set()
    upward = sorted(n for n in GRAPH[module] if layer(n) > layer(module) and n not in allowed)
    assert upward == [], f"{module} imports a higher layer: {upward}"


def test_one_top_level_package():
    """``pip install`` puts one name into site-packages: kvldp (no generic
    ``mechanisms``/``pipelines``/``schemas`` to collide with a user's own)."""
    from setuptools import find_packages

    found = find_packages(str(ROOT), exclude=["tests", "tests.*"])
    assert {p.split(".")[0] for p in found} == {"kvldp"}, found
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert 'find_packages(include=["kvldp", "kvldp.*"])' in setup
