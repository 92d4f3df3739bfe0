"""Per-prompt history of the latest rollout's responses, the material HistoSpec drafts from.

Contract:
- `prompt_key(ids)` is a pure function of the token ids (blake2b, 16-byte digest), stable across
  processes and runs, so a store can be checkpointed and reloaded.
- A prompt's entry is replaced wholesale by each `update` (only the latest rollout counts).
- A lookup also compares the full prompt ids, so a key collision yields no history, never the
  history of another prompt (an update under a colliding key replaces the other prompt's entry).
- At most `max_tokens` response tokens are held; over that, whole prompts are evicted,
  least-recently-updated first (lookups do not refresh a prompt).
- `state_dict()` is plain JSON-serialisable data in eviction order; `load_state_dict` restores it
  exactly (then applies this store's own bound).
- `PromptCache(store, build)`: what a drafter builds from a prompt's responses, kept per prompt
  until invalidated (both drafters use one).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A stable hash of a prompt's token ids (int32 little-endian, blake2b, 16-byte hex digest)."""
    packed = struct.pack(f"<{len(prompt_ids)}i", *prompt_ids)
    return hashlib.blake2b(packed, digest_size=16).hexdigest()


class PromptCache:
    """What a drafter builds from one prompt's history (an index, a trie), built by `build(prompt,
    responses)` when first asked for and kept until `invalidate` (the store changed). Keyed by
    `prompt_key`, with the ids kept beside to guard against a key collision."""

    def __init__(self, store: "HistoryStore", build: Callable[[tuple[int, ...], list[list[int]]], object]):
        self.store, self.build = store, build
        self._built: dict[str, tuple[tuple[int, ...], object | None]] = {}

    def get(self, prompt: tuple[int, ...]):
        """The built value for `prompt`; None where the store has no response of it."""
        cached = self._built.get(prompt_key(prompt))
        if cached is not None and cached[0] == prompt:
            return cached[1]
        responses = self.store.responses(prompt)
        built = self.build(prompt, responses) if responses else None
        self._built[prompt_key(prompt)] = (prompt, built)
        return built

    def invalidate(self, prompts: Iterable[Sequence[int]] | None = None) -> None:
        """Rebuild the values of `prompts` (None: of every prompt) when next asked for."""
        if prompts is None:
            self._built.clear()
        else:
            for prompt in prompts:
                self._built.pop(prompt_key(prompt), None)


@dataclass
class _Entry:
    prompt: tuple[int, ...]
    responses: tuple[tuple[int, ...], ...]
    num_tokens: int


class HistoryStore:
    """Per prompt, the responses of its latest rollout, bounded by `max_tokens` response tokens."""

    def __init__(self, max_tokens: int = 5_000_000):
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.max_tokens = max_tokens
        # Insertion order is the eviction order: update() moves a prompt to the end.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._num_tokens = 0

    def update(self, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]]) -> None:
        """Replace the prompt's history with these responses; empty ones are skipped, and with none
        left the prompt's entry is removed."""
        key = prompt_key(prompt_ids)
        self._remove(key)
        kept = tuple(tuple(r) for r in responses if len(r) > 0)
        if not kept:
            return
        entry = _Entry(tuple(prompt_ids), kept, sum(len(r) for r in kept))
        self._entries[key] = entry
        self._num_tokens += entry.num_tokens
        self._evict()

    def responses(self, prompt_ids: Sequence[int]) -> list[list[int]]:
        """The prompt's history responses; [] when unknown (or its key collides with another prompt)."""
        entry = self._lookup(prompt_ids)
        return [list(r) for r in entry.responses] if entry else []

    def response_lengths(self, prompt_ids: Sequence[int]) -> list[int]:
        entry = self._lookup(prompt_ids)
        return [len(r) for r in entry.responses] if entry else []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def state_dict(self) -> dict:
        return {"entries": [{"prompt": list(e.prompt), "responses": [list(r) for r in e.responses]}
                            for e in self._entries.values()]}

    def load_state_dict(self, state: dict) -> None:
        self._entries.clear()
        self._num_tokens = 0
        for item in state["entries"]:
            self.update(item["prompt"], item["responses"])

    def _lookup(self, prompt_ids: Sequence[int]) -> _Entry | None:
        entry = self._entries.get(prompt_key(prompt_ids))
        if entry is None or entry.prompt != tuple(prompt_ids):
            return None
        return entry

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._num_tokens -= entry.num_tokens

    def _evict(self) -> None:
        while self._num_tokens > self.max_tokens and self._entries:
            self._remove(next(iter(self._entries)))
