"""Draft trees (`rlboost.engine.draft_tree`): their shape checks, cuts, best path, and which nodes a
verifier accepts. Pure."""

from __future__ import annotations

import pytest

from rlboost.engine.draft_tree import DraftTree, accepted_nodes

# root -> 5 -> 6 -> 7
#      |    `-> 8
#      `-> 9 -> 6
TREE = DraftTree((5, 9, 6, 8, 6, 7), (-1, -1, 0, 0, 1, 2))


def test_shape_is_checked():
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree((1, 2), (-1,))
    with pytest.raises(ValueError, match="not an earlier node"):
        DraftTree((1, 2), (1, -1))
    with pytest.raises(ValueError, match="repeats token 3"):
        DraftTree((3, 3), (-1, -1))


def test_a_path_is_a_chain_and_depths_count_from_the_root():
    path = DraftTree.path([4, 5, 6])
    assert path.parents == (-1, 0, 1) and path.is_path and path.first_path() == [4, 5, 6]
    assert not TREE.is_path
    assert TREE.depths() == [1, 1, 2, 2, 2, 3]
    assert TREE.first_path() == [5, 6, 7]  # first children: the drafter's best path


def test_cut_keeps_whole_branches_within_depth_and_node_count():
    assert TREE.cut(1) == DraftTree((5, 9), (-1, -1))
    assert TREE.cut(3) is TREE
    # the first 3 nodes: a node whose parent was dropped goes with it
    assert TREE.cut(3, max_nodes=3) == DraftTree((5, 9, 6), (-1, -1, 0))
    assert TREE.cut(2, max_nodes=0) == DraftTree((), ())
    assert DraftTree.path([1, 2, 3, 4]).cut(2) == DraftTree.path([1, 2])


@pytest.mark.parametrize("drawn, accepted", [
    ([5, 6, 9, 9, 9, 9, 9], [0, 2]),       # 5, then 6 under it; the draw after 6 (at column 3) is 9: none
    ([5, 8, 0, 0, 0, 0, 0], [0, 3]),       # the second child of 5
    ([9, 0, 6, 0, 0, 0, 0], [1, 4]),       # the root's second child, then its child
    ([5, 6, 0, 7, 0, 0, 0], [0, 2, 5]),    # a whole branch: the bonus token follows
    ([1, 5, 6, 7, 0, 0, 0], []),           # the first draw matches no child of the root
])
def test_accepted_nodes_follow_the_draws_down_one_branch(drawn, accepted):
    # drawn[0]: after the root; drawn[i + 1]: after node i
    assert accepted_nodes(TREE, drawn) == accepted


def test_on_a_path_acceptance_is_the_matching_prefix():
    path = DraftTree.path([4, 5, 6])
    assert accepted_nodes(path, [4, 5, 1, 0]) == [0, 1]
    assert accepted_nodes(path, [4, 5, 6, 7]) == [0, 1, 2]
    assert accepted_nodes(path, [3, 5, 6, 7]) == []
