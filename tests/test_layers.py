"""The package's layers, and imports that go one way through them.

This file is where the rule lives. Every import of a tflgpu module by another (at module level or inside a
function) must go from a higher layer to a lower one. Parts of one layer do not import each other (the CPU
kernels and the OpenCL generators share facts through ``ops``, never directly). And the module graph has
no cycle, so no function-local import is there to dodge one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tflgpu"

# top to bottom; names in one tuple are one layer
LAYERS = [
    ("__main__",),  # python -m tflgpu: the command line
    ("cli",),
    ("tuning_report",),
    ("trace",),
    ("benchmark",),
    ("zoo",),  # the corpus stand-ins: built with model.builder, calibrated by running the interpreter
    ("tflgpu",),  # the package's public face: Interpreter, GpuDelegate
    ("interpreter",),
    ("delegate",),
    ("runtime",),
    ("autotune",),
    ("cache",),
    ("kernels", "cpu"),
    ("graph",),
    ("ops",),
    ("model",),
    ("version",),
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported tflgpu module, line) for every import in the module, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "tflgpu"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "tflgpu":
                target = node.module
            else:
                continue
            for a in node.names:  # "from . import x" imports module x where there is one
                sub = f"{target}.{a.name}"
                found.append((sub if sub in MODULES else target, node.lineno))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_is_in_a_layer():
    assert sorted({_part(m) for m in MODULES} - set(RANK)) == []


def test_imports_go_down_the_layers():
    wrong: list[str] = []
    for name, path in sorted(MODULES.items()):
        src = _part(name)
        for target, line in _imports(name, path):
            dst = _part(target)
            if dst != src and RANK[dst] <= RANK[src]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} -> {target}")
    assert wrong == [], "imports against the layers:\n" + "\n".join(dict.fromkeys(wrong))


def test_no_import_cycles():
    graph = {name: {t for t, _ in _imports(name, path) if t in MODULES and t != name}
             for name, path in MODULES.items()}
    # a package's __init__ may re-export its own modules; those edges are not cycles of the design
    for name in graph:
        graph[name] = {t for t in graph[name] if not (MODULES[name].name == "__init__.py" and t.startswith(name + "."))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
