"""What `make install` leaves in the venv that every run's start-up depends on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HEAVY = ("torch", "transformers.modeling_utils", "sympy", "ray")
"""The packages whose import is most of a process's start-up: the driver's, each Ray worker's, each agent's."""


def test_the_heavy_packages_are_byte_compiled():
    """Where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) Python never writes the .pyc of
    what it imports, so without the ones `make install` writes, every process compiles torch, transformers,
    sympy and Ray from source again: a two-step hybrid `rlboost train` took 2.3x its CPU seconds. Where
    Python does write them, the first import has."""
    missing = []
    for name in HEAVY:
        source = importlib.util.find_spec(name).origin
        if not Path(importlib.util.cache_from_source(source)).exists():
            missing.append(f"{name} ({source})")
    assert not missing, (f"no byte-code for {', '.join(missing)}: `make install` compiles the venv's packages "
                         "(rm .venv/.installed-stamp && make install); without it every process compiles them again")
