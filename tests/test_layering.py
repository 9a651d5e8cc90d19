"""Imports point one way: patterns -> kernels -> executors -> attention -> modules -> models -> train | decode ->
studies; no import of the package's own modules hidden inside a function or a conditional (a lazy import is how a
cycle hides). Import circles, counting every import: tests/test_layering_experiments.py."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).parent.parent / "sparse_attn"
RANK = {
    "registry": 0,  # the mechanism registry: imports nothing of the package, read by every layer
    "patterns": 0,
    "data": 0,
    "rope": 0,
    "score_fns": 0,  # ready-made score functions: jnp only
    "kernels": 1,  # the Pallas kernels: below every executor, "pallas" included (executors/pallas.py)
    "executors": 2,
    "attention": 3,
    "attention_fn": 3,  # the flax.nnx attention_fn adapter, beside the entry point it calls
    "viz": 3,
    "modules": 4,
    "models": 5,
    "train": 6,
    "decode": 6,  # beside train: above modules and models, below experiments
    "diagnostics": 6,  # probes of trained models, beside train and decode
    "studies": 7,  # what the experiments share
    "mechanisms": 8,  # the built-in mechanism records: they name modules, decoders, probes and budget counts
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


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def test_every_top_level_name_has_a_layer():
    names = {p.relative_to(ROOT).with_suffix("").parts[0] for p in ROOT.rglob("*.py")} - {"__init__"}
    assert names <= set(RANK), f"give {sorted(names - set(RANK))} a rank in RANK"


def test_no_lazy_imports_of_the_package():
    """Imports of sparse_attn modules sit at module level (optional third-party dependencies may be lazy)."""
    bad = []
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        allowed = {id(n) for n in tree.body}
        for node in tree.body:
            if _is_type_checking(node):
                allowed |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in allowed or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
            if getattr(node, "level", 0) or any(n.split(".")[0] == "sparse_attn" for n in names):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


def test_train_and_decode_stay_apart():
    """decode and train share a rank (both above models): neither needs the other, so neither imports it."""
    bad = []
    for own, other in (("train", "decode"), ("decode", "train")):
        for path in (ROOT / own).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                bad += [f"{path.relative_to(ROOT.parent)} imports {n}" for n in names
                        if n.startswith(f"sparse_attn.{other}")]
    assert not bad, "\n".join(bad)


def test_kernels_import_no_executor():
    """The kernels sit below the executors: the executor that runs them for a pattern (custom VJP, padding, global
    rows, registration as "pallas" or "bucketed_pallas") lives in executors/, and no kernel module imports one."""
    bad = []
    for path in (ROOT / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            bad += [f"{path.relative_to(ROOT.parent)} imports {n}" for n in names
                    if n == "sparse_attn.executors" or n.startswith("sparse_attn.executors.")]
    assert not bad, "\n".join(bad)
