"""Dotted command-line overrides of a frozen dataclass config: `model.num_layers=3 train.learning_rate=1e-3
model.attention.0.radius=64` (a tuple element by its index).

    config = apply_overrides(CONFIGS["smoke"](), ["model.num_layers=3", "train.learning_rate=1e-3"])

Each value is parsed by the field's annotation (int, float, bool, str, `X | None` with "none", tuples of those
comma-separated, `Literal` choices) and the config is rebuilt with `dataclasses.replace`, so every config's own
checks run; a field that is itself a config (a data source, a layer's mechanism) is changed field by field, or by
the runner's own flag (`--mechanism`, `--text`). Errors are `OverrideError` (a ValueError) naming the override.

Why not a library: ml_collections 1.1.0's `DEFINE_config_dataclass` reads field annotations unresolved and fails
on postponed annotations (`from __future__ import annotations`, used across this package: "issubclass() arg 1 must
be a class"); tyro turns union-typed fields (the data source, each layer's mechanism config) into subcommands;
fiddle would need every config rebuilt as an `fdl.Config` graph. The configs stay plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing


class OverrideError(ValueError):
    """A bad override: unknown field, unparsable value, or a value the config refuses."""


def apply_overrides(config, items):
    """`config` with every "path=value" of `items` applied in order."""
    for item in items:
        path, sep, text = item.partition("=")
        if not sep or not path:
            raise OverrideError(f"override {item!r}: expected field.path=value, e.g. model.num_layers=3")
        try:
            config = _set(config, path.split("."), text, path)
        except OverrideError:
            raise
        except (ValueError, TypeError) as e:  # the config's own checks
            raise OverrideError(f"override {item}: {e}") from None
    return config


def _set(obj, keys, text: str, path: str):
    key, rest = keys[0], keys[1:]
    if isinstance(obj, tuple):
        if not key.isdigit() or int(key) >= len(obj):
            raise OverrideError(f"override {path}: {key!r} is not an index of a tuple of {len(obj)}")
        i = int(key)
        new = _set(obj[i], rest, text, path) if rest else _parse(text, type(obj[i]), path)
        return obj[:i] + (new,) + obj[i + 1 :]
    if not dataclasses.is_dataclass(obj):
        raise OverrideError(f"override {path}: {type(obj).__name__} has no field {key!r}")
    names = [f.name for f in dataclasses.fields(obj)]
    if key not in names:
        raise OverrideError(f"override {path}: {type(obj).__name__} has no field {key!r} (fields: {', '.join(names)})")
    value = getattr(obj, key)
    if rest:
        return dataclasses.replace(obj, **{key: _set(value, rest, text, path)})
    if dataclasses.is_dataclass(value) or (isinstance(value, tuple) and any(map(dataclasses.is_dataclass, value))):
        raise OverrideError(f"override {path}: a config, not a value: set its fields ({path}.<field>=...), or choose "
                            f"it with the runner's flags (--mechanism, --text)")  # fmt: skip
    hint = typing.get_type_hints(type(obj))[key]
    return dataclasses.replace(obj, **{key: _parse(text, hint, path)})


def _parse(text: str, hint, path: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() == "none":
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _parse(text, option, path)
            except OverrideError as e:
                errors.append(str(e))
        raise OverrideError(errors[0] if len(options) == 1 else f"override {path}: {text!r} fits none of {hint}")
    if origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise OverrideError(f"override {path}: {text!r} is not one of {list(args)}")
    if origin is tuple:
        item = args[0] if args else str
        parts = [p for p in text.split(",") if p.strip()] if text.strip() else []
        return tuple(_parse(p.strip(), item, path) for p in parts)
    if hint is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise OverrideError(f"override {path}: expected true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise OverrideError(f"override {path}: expected an integer, got {text!r}") from None
    if hint is float:
        try:
            value = float(text)
        except ValueError:
            raise OverrideError(f"override {path}: expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise OverrideError(f"override {path}: expected a finite number, got {text!r}")
        return value
    if hint is str:
        return text
    raise OverrideError(f"override {path}: fields of type {hint} are not set from the command line")
