"""The package's shape, kept: folders by concept, imports that point down,
no circle, a short top level, and no test harness in what ships."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "termchat"
# lower first: a module may import its own folder and any folder ranked below it
RANK = {"base": 0, "vllm_ext": 0, "models": 1, "profiles": 2, "detect": 2, "engine": 3, "slash": 3, "chat": 4, "coding": 4, "bench": 5, "ui": 5, "repl": 5, "cli": 6}
BASE = {"__init__", "bootstrap", "paths", "errors", "numbers", "limits", "sanitize", "files", "progress"}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return "base" if len(parts) == 1 or parts[1] in BASE else parts[1]


def test_no_module_imports_a_folder_above_its_own():
    upward = [(a, b) for a, targets in imports().items() for b in targets if layer(a) != layer(b) and RANK[layer(b)] > RANK[layer(a)]]
    assert upward == []


def test_the_imports_form_no_circle():
    graph, seen, stack, circles = imports(), set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            circles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in sorted(graph[node]):
            visit(target)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert circles == []


def test_the_top_level_is_short_and_holds_no_test_harness():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 12, flat
    assert {layer(m) for m in modules()} <= set(RANK), "every folder has a rank here"
    harness = [str(p) for p in PACKAGE.rglob("*.py") if any(w in p.name for w in ("monkey", "standin", "conftest"))]
    assert harness == []
