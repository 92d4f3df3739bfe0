"""Importing a custom reward function from a Python file, with errors that say what to fix. A run does
this in its reward workers only (`rlboost.rewards.worker`), never in the driver."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from rlboost.rewards.builtin import compute_score
from rlboost.rewards.config import RewardConfig
from rlboost.rewards.errors import RewardConfigError

CALL = "fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)"


def _module_name(path: Path) -> str:
    # Derived from the resolved path, so a user's `reward.py` never replaces another module called
    # `reward` in sys.modules, and two files with the same name do not replace each other.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"rlboost_reward_{stem}_{digest}"


def _import_file(path: Path):
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, as a normal import would be (dataclasses and pickling look it up).
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        del sys.modules[name]
        raise RewardConfigError(f"reward.path: importing {path} failed: {type(e).__name__}: {e}") from e
    except BaseException:
        del sys.modules[name]
        raise  # KeyboardInterrupt and the like are not the file's fault
    return module


def load_reward_fn(cfg: RewardConfig) -> Callable:
    """The reward function `cfg` names: the built-in compute_score when cfg.path is None, else the
    function `name` from that file, checked to accept rewards' keyword call."""
    cfg.validate()
    path_str, name = cfg.target()
    if path_str is None:
        return compute_score
    path = Path(path_str).expanduser()
    if not path.exists():
        raise RewardConfigError(f"reward.path: {path} not found (relative paths start from {Path.cwd()})")
    if not path.is_file() or path.suffix != ".py":
        raise RewardConfigError(f"reward.path: {path} is not a Python (.py) file")
    module = _import_file(path.resolve())

    if not hasattr(module, name):
        callables = sorted(k for k, v in vars(module).items()
                           if callable(v) and not k.startswith("_") and not inspect.isclass(v))
        raise RewardConfigError(f"reward.name: {path} has no {name!r}; its functions: "
                                f"{', '.join(callables) or '(none)'}")
    fn = getattr(module, name)
    if not callable(fn):
        raise RewardConfigError(f"reward.name: {name!r} in {path} is a {type(fn).__name__}, not a function")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn  # some builtins and C callables have no introspectable signature
    try:
        signature.bind(data_source="", solution_str="", ground_truth=None, extra_info=None)
    except TypeError as e:
        raise RewardConfigError(f"reward function {name}{signature} in {path} cannot be called as {CALL}: "
                                f"{e}") from e
    return fn
