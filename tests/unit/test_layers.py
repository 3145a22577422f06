"""The package's import graph: no cycles, layers pointing one way (what `make lint` checks)."""

from __future__ import annotations

from tests.lint_imports import cycles, graph, violations


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_layers_point_down() -> None:
    assert violations(graph()) == []


def test_the_checker_sees_cycles_and_upward_imports() -> None:
    edges = {
        "router.core.a": {"router.core.b"},
        "router.core.b": {"router.core.a", "router.server.app"},
        "router.server.app": set(),
    }
    assert cycles(edges) == [["router.core.a", "router.core.b"]]
    assert violations(edges) == ["router.core.b -> router.server.app"]
