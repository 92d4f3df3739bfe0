"""Copying a version's weights into a torch module in place: all of them, or only the parameters named.

What `load_weights` does once the state has passed `rlboost.engine.protocol.check_weights`, for every
engine that holds its weights as a torch module (rlboost's `LLMEngine`, the emulated engine's skeleton).
A tied weight is one parameter under two names (`lm_head.weight` and `model.embed_tokens.weight`):
naming either copies it, from the state's entry under the parameter's own name, as a full load does,
so a partial load can never leave it different from what a full load of the same state gives.
Nothing here imports torch: a worker process whose engine holds no tensors never loads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def copy_weights(model, state: Mapping[str, object], names: Iterable[str] | None = None) -> None:
    """Copy `state` (checked, complete) into `model`'s parameters in place: every one when `names` is
    None, else those `names` name (aliases resolved, names that are buffers ignored as a full load
    ignores them)."""
    params = dict(model.named_parameters())  # tied weights once, under the name the state holds them
    if names is None:
        chosen = list(params)
    else:
        own_name = {id(p): n for n, p in params.items()}
        every_name = dict(model.named_parameters(remove_duplicate=False))
        wanted = {own_name[id(every_name[n])] for n in names if n in every_name}
        chosen = [n for n in params if n in wanted]
    for name in chosen:
        params[name].data.copy_(state[name])  # .data: no autograd record of the swap
