"""Scorers, and both decoding loops on a hand-written one (a logits table).

`TableScorer`'s logits depend only on the two tokens before: small enough to
enumerate the output distribution exactly, and it reads its cache, so a wrong
rewind or a stale entry changes the output.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from flax import struct
from test_speculative import LENGTH, SAMPLES, VOCAB, _chi_square_p_value, accept_all

from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.drafts import ScorerDraft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.models.t5 import T5Draft, T5Scorer

Array = jax.Array
EOS = 1


@struct.dataclass
class TableState:
  """State of a `TableScorer`.

  Attributes:
    first: int32 `[batch]`, the token before position 0 of each row.
    tokens: int32 `[batch, cache_len]`, the token scored at each position.
    lengths: int32 `[batch]`, the positions each row has scored.
  """

  first: Array
  tokens: Array
  lengths: Array


@struct.dataclass
class TableScorer(Scorer):
  """Logits `table[token before, token]` after each token: a second-order Markov chain.

  Attributes:
    table: float32 `[vocab, vocab, vocab]`.
  """

  table: Array

  @property
  def vocab_size(self) -> int:
    return self.table.shape[0]

  @property
  def start_token(self) -> int:
    return 0

  @property
  def pad_id(self) -> int:
    return 0

  def encode(self, inputs: Array, target_encoded: None = None) -> Array:
    """The token before position 0 of each row: `inputs[:, 0]` (rows may differ)."""
    del target_encoded
    return inputs[:, 0] % self.vocab_size

  def init_state(self, context: Array, cache_len: int) -> TableState:
    batch = context.shape[0]
    return TableState(context, jnp.zeros((batch, cache_len), jnp.int32),
                      jnp.zeros((batch,), jnp.int32))

  def score(self, state: TableState, tokens: Array) -> tuple[Array, TableState]:
    k = tokens.shape[1]
    cache = jax.vmap(lambda row, chunk, start: jax.lax.dynamic_update_slice(
        row, chunk, (start,)))(state.tokens, tokens, state.lengths)
    positions = state.lengths[:, None] + jnp.arange(k)  # [batch, k]
    before = jnp.take_along_axis(cache, jnp.maximum(positions - 1, 0), axis=1)
    before = jnp.where(positions >= 1, before, state.first[:, None])
    return self.table[before, tokens], state.replace(tokens=cache, lengths=state.lengths + k)

  def cached_lengths(self, state: TableState) -> Array:
    return state.lengths

  def rewind(self, state: TableState, lengths: Array) -> TableState:
    return state.replace(lengths=lengths)


@struct.dataclass
class TableDraft(ScorerDraft):
  """A `TableScorer` proposing: the draft side of the same interface."""

  table: Array

  @property
  def scorer(self) -> TableScorer:
    return TableScorer(self.table)


def _table(vocab: int, seed: int, scale: float = 2.0) -> Array:
  return jnp.asarray(scale * np.random.RandomState(seed).randn(vocab, vocab, vocab), jnp.float32)


def _greedy_path(table: np.ndarray, first: int, length: int, eos: int) -> list[int]:
  """The table's greedy tokens by hand, up to and including EOS."""
  before, last, out = first, 0, []
  while len(out) < length and eos not in out:
    token = int(np.argmax(table[before, last]))
    out.append(token)
    before, last = last, token
  return out


def _exact_distribution(table: Array, first: int, warp: Warp) -> dict:
  """P(first LENGTH tokens) of ancestral sampling from the table, by enumeration."""
  probs = np.asarray(warp.probs(table), np.float64)  # [V, V, V]
  dist = {}
  for seq in itertools.product(range(VOCAB), repeat=LENGTH):
    p, kept, before, last = 1.0, [], first, 0
    for token in seq:
      p *= probs[before, last, token]
      kept.append(token)
      if token == EOS:
        break
      before, last = last, token
    dist[(tuple(kept) + (0,) * (LENGTH - len(kept)), len(kept))] = p
  return dist


def test_table_scorer_reads_its_cache_after_a_rewind():
  """Scoring, rewinding and scoring other tokens equals scoring the new text at once."""
  scorer = TableScorer(_table(7, 0))
  state = scorer.init_state(scorer.encode(jnp.asarray([[3], [5]])), 8)
  _, state = scorer.score(state, jnp.asarray([[0, 2, 4], [0, 6, 6]]))
  _, state = scorer.score(scorer.rewind(state, jnp.asarray([2, 1])), jnp.asarray([[1], [3]]))
  logits, _ = scorer.score(state, jnp.asarray([[5], [2]]))
  fresh = scorer.init_state(scorer.encode(jnp.asarray([[3], [5]])), 8)
  want, _ = scorer.score(fresh, jnp.asarray([[0, 2, 1, 5], [0, 3, 2, 0]]))
  np.testing.assert_array_equal(logits[0, 0], want[0, 3])
  np.testing.assert_array_equal(logits[1, 0], want[1, 2])


def test_t5_scorer_chunks_after_a_rewind_equal_teacher_forcing():
  """Stale positions beyond a rewind are overwritten: the logits are the teacher-forced ones."""
  model, params = make_model("test-v1_1", num_decoder_layers=2)
  inputs = jnp.asarray(np.random.RandomState(0).randint(2, 97, size=(2, 6)), jnp.int32)
  tokens = jnp.asarray(np.random.RandomState(1).randint(2, 97, size=(2, 6)), jnp.int32)
  scorer = T5Scorer(model, params)
  state = scorer.init_state(scorer.encode(inputs), 10)
  _, state = scorer.score(state, tokens[:, :4].at[:, 2:].add(1))  # The rewind drops 2 ...
  state = scorer.rewind(state, jnp.asarray([2, 2]))
  _, state = scorer.score(state, tokens[:, 2:4])  # ... overwritten by the real one.
  logits, state = scorer.score(state, tokens[:, 4:])
  np.testing.assert_array_equal(scorer.cached_lengths(state), [6, 6])
  first, _ = scorer.score(scorer.init_state(scorer.encode(inputs), 10), tokens[:, :2])
  forced = model.logits(params, inputs, tokens)
  np.testing.assert_allclose(logits, forced[:, 4:], atol=1e-5)
  np.testing.assert_allclose(first, forced[:, :2], atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_greedy_loops_on_a_table_give_its_path(gamma):
  vocab, max_len = 16, 14
  table = _table(vocab, 1)
  inputs = jnp.asarray([[3], [7], [12]], jnp.int32)
  paths = [_greedy_path(np.asarray(table), int(row[0]), max_len, eos=-1) for row in inputs]
  # EOS: a token row 0 first emits mid-run, so rows end at different lengths.
  eos = next(t for i, t in enumerate(paths[0]) if i >= 3 and t not in paths[0][:i])
  want = [_greedy_path(np.asarray(table), int(row[0]), max_len, eos) for row in inputs]
  base = baseline.decode(TableScorer(table), inputs, jax.random.PRNGKey(0),
                         max_decode_len=max_len, warp=Warp(), eos_id=eos)
  for draft in (TableDraft(table), TableDraft(_table(vocab, 2))):  # Itself; another table.
    out = speculative.speculative_decode(
        TableScorer(table), draft, inputs, jax.random.PRNGKey(0), gamma=gamma,
        max_decode_len=max_len, warp=Warp(), eos_id=eos, draft_inputs=inputs)
    for decoded in (base, out):
      for row, path, length in zip(np.asarray(decoded.sequences), want, decoded.lengths,
                                   strict=True):
        assert int(length) == len(path)
        np.testing.assert_array_equal(row, path + [0] * (max_len - len(path)))
  assert len({len(path) for path in want}) > 1


@pytest.fixture(scope="module")
def table_pair():
  """A target table, a draft table near it, and one input row repeated SAMPLES times."""
  target = _table(VOCAB, 3)
  draft = TableDraft(target + _table(VOCAB, 4, scale=1.5))
  inputs = jnp.full((SAMPLES, 1), 2, jnp.int32)
  return target, draft, inputs


@pytest.mark.parametrize("warp", [Warp(1.0), Warp(0.8, top_k=4, top_p=0.9)])
def test_table_output_distribution_is_the_targets(table_pair, warp):
  target, draft, inputs = table_pair
  dist = _exact_distribution(target, 2, warp)
  base = baseline.decode(TableScorer(target), inputs, jax.random.PRNGKey(1),
                         max_decode_len=LENGTH, warp=warp, eos_id=EOS)
  out = speculative.speculative_decode(
      TableScorer(target), draft, inputs, jax.random.PRNGKey(0), gamma=2,
      max_decode_len=LENGTH, warp=warp, eos_id=EOS, draft_inputs=inputs)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both accept and reject paths are exercised.
  assert _chi_square_p_value(base.sequences, base.lengths, dist) > 1e-3
  assert _chi_square_p_value(out.sequences, out.lengths, dist) > 1e-3


def test_accept_everything_on_a_table_fails_the_same_test(table_pair):
  """Negative control: the chi-square test above detects a wrong acceptance rule."""
  target, draft, inputs = table_pair
  dist = _exact_distribution(target, 2, Warp(1.0))
  out = speculative.speculative_decode(
      TableScorer(target), draft, inputs, jax.random.PRNGKey(0), gamma=2,
      max_decode_len=LENGTH, warp=Warp(1.0), eos_id=EOS, draft_inputs=inputs,
      verify=accept_all)
  assert _chi_square_p_value(out.sequences, out.lengths, dist) < 1e-6


def test_t5_draft_is_its_scorer_proposing():
  """A T5Draft proposes with its T5Scorer: the state is the scorer's, rewound on commit."""
  model, params = make_model("test-v1_1", num_decoder_layers=2)
  draft = T5Draft(model, params)
  assert isinstance(draft.scorer, T5Scorer) and draft.vocab_size == model.config.vocab_size
  inputs = jnp.asarray([[5, 6, 7]], jnp.int32)
  state = draft.init_state(inputs, 8)
  np.testing.assert_array_equal(draft.scorer.cached_lengths(state), [0])
  tokens = jnp.zeros((1, 10), jnp.int32)
  state, proposals, q_logits = draft.propose(state, tokens, jnp.asarray([0]),
                                             jax.random.PRNGKey(0), gamma=3, warp=Warp())
  assert proposals.shape == (1, 3) and q_logits.shape == (1, 3, model.config.vocab_size)
  np.testing.assert_array_equal(draft.scorer.cached_lengths(state), [3])
  np.testing.assert_array_equal(draft.scorer.cached_lengths(draft.commit(state, jnp.asarray([4]))),
                                [3])
