"""Draft tokens as a tree: SuffixDecoding's tree speculation (arXiv 2411.04975), verified in one forward.

Contract (torch-free; the engine, the drafters and the replay harness share it):
- `DraftTree(tokens, parents)`: node i drafts `tokens[i]` after node `parents[i]`, -1 being the
  request's last token (the root); a parent is listed before its children, and siblings carry
  different tokens. A path (what `Drafter.propose` returns as a list) is the tree whose parents are
  -1, 0, 1, ... Children keep their order: a drafter lists the likeliest child first, so the chain
  of first children (`first_path`) is its best single path.
- `accepted_nodes(tree, drawn)`: with drawn[0] the token drawn after the root and drawn[i + 1] the
  one drawn after node i, the nodes accepted: from the root, the child whose token equals the draw,
  until no child does. Each draw is the one plain decoding makes at that position given the accepted
  prefix, so the emitted tokens (the draws at the root and at every accepted node) are plain
  decoding's: lossless for any tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a draft tree needs one parent per token, got {len(self.tokens)} tokens "
                             f"and {len(self.parents)} parents")
        seen: set[tuple[int, int]] = set()
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}'s parent {parent} is not an earlier node (or -1, the root)")
            if (parent, token) in seen:
                raise ValueError(f"node {i} repeats token {token} under parent {parent}")
            seen.add((parent, token))

    @classmethod
    def path(cls, tokens: Sequence[int]) -> DraftTree:
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_path(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Each node's depth: 1 for a child of the root."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    def cut(self, max_depth: int, max_nodes: int | None = None) -> DraftTree:
        """The nodes at most `max_depth` deep (the tokens a request may still emit), of those the first
        `max_nodes` (the cache positions it has left), re-indexed."""
        depths = self.depths()
        max_nodes = len(self) if max_nodes is None else max(max_nodes, 0)
        if max(depths, default=0) <= max_depth and len(self) <= max_nodes:
            return self
        index: dict[int, int] = {-1: -1}
        tokens, parents = [], []
        for i, (token, parent, depth) in enumerate(zip(self.tokens, self.parents, depths)):
            if depth <= max_depth and parent in index and len(tokens) < max_nodes:
                index[i] = len(tokens)
                tokens.append(token)
                parents.append(index[parent])
        return DraftTree(tuple(tokens), tuple(parents))

    def first_path(self) -> list[int]:
        """The chain of first children from the root: the drafter's best single path."""
        path, node = [], -1
        for i, parent in enumerate(self.parents):
            if parent == node:
                path.append(self.tokens[i])
                node = i
        return path


def accepted_nodes(tree: DraftTree, drawn: Sequence[int]) -> list[int]:
    """The accepted nodes, root to leaf (see the module docstring); `drawn` has len(tree) + 1 draws."""
    children: dict[tuple[int, int], int] = {(parent, token): i for i, (token, parent)
                                             in enumerate(zip(tree.tokens, tree.parents))}
    accepted, node = [], -1
    while (child := children.get((node, drawn[node + 1]))) is not None:
        accepted.append(child)
        node = child
    return accepted
