"""Speculative methods ("drafters"): one module per method behind `base.Drafter`.

Adding a method is one new module with a `Drafter` subclass, plus one registration:
a line in `_BUILTIN` below, or `register(name, cls)` from user code. `SpecConfig`
validates `method` against `names()`, the engine builds `get(method).build(...)`, and
the step program calls the drafter's hooks without knowing which method it is.

This module imports no JAX (the config validates names against it); a drafter's module
is imported the first time `get` asks for it.
"""

from __future__ import annotations

import importlib

# name -> "module:Class", imported lazily
_BUILTIN = {
    "draft_model": "dsd_jax.drafters.draft_model:DraftModel",
    "eagle3": "dsd_jax.drafters.eagle3:Eagle3",
    "ngram": "dsd_jax.drafters.ngram:NGram",
    "none": "dsd_jax.drafters.base:NoDrafter",
    "suffix": "dsd_jax.drafters.suffix:Suffix",
}
_registered: dict[str, type] = {}


def register(name: str, cls: type | None = None):
    """Registers a `Drafter` subclass under `name` (usable as `SpecConfig(method=name)`).

    `register("mine", Mine)` or as a class decorator `@register("mine")`.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"drafter name must be an identifier, got {name!r}")

    def add(cls):
        from dsd_jax.drafters.base import Drafter
        if not (isinstance(cls, type) and issubclass(cls, Drafter)):
            raise TypeError(f"drafter {name!r} must be a subclass of dsd_jax.drafters.base.Drafter")
        if name in _BUILTIN or _registered.get(name, cls) is not cls:
            raise ValueError(f"drafter {name!r} is already registered")
        _registered[name] = cls
        return cls

    return add if cls is None else add(cls)


def unregister(name: str) -> None:
    """Removes a drafter added with `register` (built-in methods stay)."""
    _registered.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_BUILTIN) + tuple(_registered)


def get(name: str) -> type:
    """The `Drafter` subclass registered as `name`."""
    if name in _registered:
        return _registered[name]
    if name not in _BUILTIN:
        raise ValueError(f"unknown speculative method {name!r}; expected one of {list(names())}")
    module, cls = _BUILTIN[name].split(":")
    return getattr(importlib.import_module(module), cls)
