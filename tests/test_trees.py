"""Tree structure: parents checked, ancestors and depths, the accepted path's gather order."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import trees

# 0 -> 1 -> 3 -> 5, 0 -> 2 -> 4
PARENTS = np.array([-1, 0, 0, 1, 2, 3])


def test_ancestors_and_depths():
  tree = trees.layout(PARENTS, 2)
  np.testing.assert_array_equal(tree.depths, [[0, 1, 1, 2, 2, 3]] * 2)
  expected = np.zeros((6, 6), bool)
  for i, chain_up in enumerate([[0], [1, 0], [2, 0], [3, 1, 0], [4, 2, 0], [5, 3, 1, 0]]):
    expected[i, chain_up] = True
  np.testing.assert_array_equal(tree.ancestors[0], expected)
  traced = trees.layout(jnp.asarray(np.stack([PARENTS, trees.chain(5)])), 2)
  np.testing.assert_array_equal(traced.ancestors[0], expected)
  np.testing.assert_array_equal(traced.ancestors[1], np.tril(np.ones((6, 6), bool)))
  np.testing.assert_array_equal(traced.depths[1], np.arange(6))


def test_path_order_puts_the_path_in_front():
  order, depth = trees.path_order(PARENTS, jnp.array([5, 4, 0, 2]))
  np.testing.assert_array_equal(depth, [3, 2, 0, 1])
  np.testing.assert_array_equal(order, [[0, 1, 3, 5, 4, 5], [0, 2, 4, 3, 4, 5],
                                        [0, 1, 2, 3, 4, 5], [0, 2, 2, 3, 4, 5]])
  chain_order, _ = trees.path_order(trees.chain(4), jnp.array([3]))
  np.testing.assert_array_equal(chain_order, [np.arange(5)])


@pytest.mark.parametrize("parents, match", [
    ([0, 0, 1], r"parents\[..., 0\] must be -1"),
    ([-1, 0, 2], "node 2 has parent"),
    ([-1, 1], "node 1 has parent"),
    ([[-1, 0, 0], [-1, 0, 3]], "node 2 has parent"),
    (np.array([-1.0, 0.0]), "must be an int array"),
])
def test_check_parents_names_the_bad_node(parents, match):
  with pytest.raises(ValueError, match=match):
    trees.check_parents(parents)


def test_check_parents_accepts_trees():
  np.testing.assert_array_equal(trees.check_parents(PARENTS), PARENTS)
  np.testing.assert_array_equal(trees.check_parents(trees.chain(3)), [-1, 0, 1, 2])


def test_check_forest_takes_several_roots_and_names_the_bad_node():
  branches = np.array([-1, -1, 0, 1])  # A draft's two branches under a cached root.
  np.testing.assert_array_equal(trees.check_forest(branches), branches)
  np.testing.assert_array_equal(trees.check_forest(PARENTS), PARENTS)
  for parents in ([-1, 0, 2], [-1, -2, 0], [[-1, 0, 0], [-1, 0, 3]]):
    with pytest.raises(ValueError, match="node 2 has parent|node 1 has parent"):
      trees.check_forest(parents)


def test_layout_refuses_numpy_parents_out_of_order():
  with pytest.raises(ValueError, match="node 2 has parent"):
    trees.layout(np.array([-1, 0, 3, 1]), 1)
