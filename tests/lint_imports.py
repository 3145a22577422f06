"""`make lint`'s import check: no import cycle in the package, and the layers point one way.

Every import counts, at module level, under `if TYPE_CHECKING:` and inside functions: a cycle
held together by a type-checking-only or a late import is still a cycle of ideas.

    python -m tests.lint_imports          # exit 1 and the cycles / violations found
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "router"

# Subpackages in layers: a module may import its own layer and the ones below it, never above.
# The simulator and the load generator sit apart: the product never imports them.
LAYERS: dict[str, int] = {
    "": 0,  # router.config, router.errors, router.native, router._native
    "net": 1,
    "core": 2,
    "access": 3,
    "routing": 3,
    "cache": 3,
    "rollout": 3,
    "observability": 3,
    "server": 4,
    "cli": 5,
    "__main__": 5,
    "demo": 5,
    "sim": 5,
    "loadgen": 5,
}


def module_name(path: Path) -> str:
    """router.core.context for python/router/core/context.py."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, name: str) -> Iterator[str]:
    """Every router module `path` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "router":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "router":
                continue
            for alias in node.names:
                yield f"{base}.{alias.name}"
            yield base


def graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for target in imports(path, name):
            # `from router.core import context` names a module; `from router.x import Y` a name.
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name and target != "router":
                deps.add(target)
        out[name] = deps
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    """The layer of a router module (see LAYERS)."""
    parts = module.split(".")
    sub = parts[1] if len(parts) > 2 else ""
    if len(parts) == 2 and parts[1] in LAYERS:
        sub = parts[1]
    return LAYERS.get(sub, 0)


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point up the layers (a feature importing the server, core a feature...)."""
    out = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) > layer(source):
                out.append(f"{source} -> {target}")
            elif (
                layer(target) == layer(source) == 3
                and source.split(".")[1] != target.split(".")[1]
                and target.split(".")[1] != "access"
            ):
                # Features may use access (the tenant), not each other's insides.
                out.append(f"{source} -> {target} (feature to feature)")
    return out


def main() -> int:
    edges = graph()
    problems = [" <-> ".join(c) for c in cycles(edges)]
    problems += violations(edges)
    for problem in problems:
        print(f"import check: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
