"""The experiments' house rules, by reading the sources: studies import only the library and their own folder;
benchmarks, reports and the checkpoint tools may import studies but not each other; the GPU session drives them all;
nothing in the library imports an experiment; no import circle across `sparse_attn/` and `experiments/` (module-
and function-level imports both count); mechanisms are named through the registry, never by config class."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).parent.parent
STUDIES = {"lm", "retrieval", "classification"}
# Rank of each experiments/ folder (top-level files: the checkpoint tools, evaluate and generate).
RANK = {**{s: 1 for s in STUDIES}, "benchmarks": 2, "reports": 2, "checkpoints": 2, "gpu": 3}
MECHANISM_CONFIGS = ("AnchorAttentionConfig", "LabelAttentionConfig", "NoncrossingAttentionConfig",
                     "MobaAttentionConfig", "NsaAttentionConfig")


def _files(top: str):
    return sorted((ROOT / top).rglob("*.py"))


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set[str]):
    """(line, imported module) for every import anywhere in the file; `from pkg import name` points at pkg.name
    when that is a module; relative imports resolved."""
    own = _module(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            yield from ((node.lineno, m) for m in (subs or [base]))


def _group(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "experiments" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in RANK else "checkpoints"


def _all_modules() -> set[str]:
    return {_module(p) for top in ("sparse_attn", "experiments") for p in _files(top)}


def test_studies_import_only_the_library_and_tools_point_one_way():
    modules, bad = _all_modules(), []
    for path in _files("experiments"):
        own = _group(_module(path))
        for line, name in _imports(path, modules):
            other = _group(name)
            if own is None or other is None or other == own:
                continue
            if RANK[other] >= RANK[own]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {name} ({other})")
    assert not bad, "\n".join(bad)


def test_the_library_imports_no_experiment():
    modules = _all_modules()
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in _files("sparse_attn")
           for line, name in _imports(p, modules) if name.split(".")[0] == "experiments"]
    assert not bad, "\n".join(bad)


def test_no_import_circles_anywhere():
    modules = _all_modules()
    graph = {m: set() for m in modules}
    for top in ("sparse_attn", "experiments"):
        for path in _files(top):
            graph[_module(path)] |= {name for _, name in _imports(path, modules) if name in modules}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(graph[m]):
            if t == m:
                continue
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_experiments_name_mechanisms_through_the_registry():
    bad = []
    for path in _files("experiments"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name is None and isinstance(node, ast.alias):
                name = node.name
            if name in MECHANISM_CONFIGS:
                bad.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')} names {name}")
    assert not bad, "use sparse_attn.studies.mechanisms.attention_config(name, ctx, **overrides):\n" + "\n".join(bad)


def test_the_listing_stays_small():
    top = [p.name for p in (ROOT / "experiments").iterdir() if p.is_file()]
    assert len(top) <= 6, top
    for folder in (ROOT / "experiments").iterdir():
        if folder.is_dir() and folder.name not in ("results", "__pycache__"):
            files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
            assert len(files) <= 13, (folder.name, sorted(p.name for p in files))
    long = [f"{p.relative_to(ROOT)}: {n}" for top in ("sparse_attn", "experiments", "tests") for p in _files(top)
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, "files over 400 lines:\n" + "\n".join(long)


def test_every_folder_has_a_readme_with_its_configs_table():
    for folder in sorted(p for p in (ROOT / "experiments").iterdir() if p.is_dir() and p.name in RANK):
        readme = folder / "README.md"
        assert readme.exists(), f"experiments/{folder.name}/ has no README.md"
        heads = [line.lower() for line in readme.read_text().splitlines() if line.startswith("|")]
        assert any(all(w in h for w in ("command", "hardware", "expected")) for h in heads), readme
