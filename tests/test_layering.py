"""Imports point one way: patterns -> executors -> kernels -> attention -> modules -> models -> train."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).parent.parent / "sparse_attn"
RANK = {
    "patterns": 0,
    "data": 0,
    "executors": 1,
    "kernels": 2,
    "attention": 3,
    "viz": 3,
    "modules": 4,
    "models": 5,
    "train": 6,
}


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sparse_attn":
        return None
    if len(parts) == 1:
        return "attention"  # the package facade re-exports the entry point and patterns
    return parts[1]


def test_no_import_points_upward():
    bad = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        if rel.name == "__init__" and len(rel.parts) == 2:
            continue  # sparse_attn/__init__.py is the facade
        own = layer(".".join(rel.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "sparse_attn"]
            for name in names:
                other = layer(name)
                if other in RANK and own in RANK and RANK[other] > RANK[own]:
                    bad.append(f"{rel} imports {name}")
    assert not bad, "\n".join(bad)
