"""Package names that load their module on first use (PEP 562).

A package's `__init__` lists where each public name lives; importing the package loads none of them,
so a process imports only what it uses (a light rollout worker never loads torch, the simulator never
loads Ray). `lazy_exports` returns the package's `__getattr__` and `__dir__`."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, where: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """`where`: public name -> the submodule of `package` defining it. `namespace`: the package's
    globals(), where a name is cached once loaded (later lookups skip `__getattr__`)."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{where[name]}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
