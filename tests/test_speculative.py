"""speculative_sample: exact greedy equality, the exact output distribution, stats, drafts."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from scipy import stats as scipy_stats

from specdec_jax.decoding import acceptance, sampling, speculative
from specdec_jax.decoding.drafts import NgramDraft, PromptLookupDraft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.t5 import (
    T5Draft,
    T5Scorer,
    make_draft,
    speculative_sample,
    temperature_sample,
)

MAX_LEN = 24


@pytest.fixture(scope="module")
def pair():
  """A random target and an unrelated random draft of the same shapes."""
  target, target_params = make_model("test-v1_1", seed=0, num_decoder_layers=2)
  _, draft_params = make_model("test-v1_1", seed=1, num_decoder_layers=2)
  return target, target_params, draft_params


def _inputs(batch: int) -> jax.Array:
  inputs = np.random.RandomState(0).randint(2, 97, size=(3, 9))
  inputs[2, 6:] = 0
  return jnp.asarray(inputs[:batch], jnp.int32)


def _eos_mid_run(target, params, inputs) -> int:
  """A token that greedy decoding of row 0 first emits at step 5..12: EOS mid-run."""
  seq = np.asarray(temperature_sample(target, params, inputs, max_decode_len=MAX_LEN,
                                      eos_id=96).sequences[0])
  for step in range(5, 13):
    if seq[step] not in seq[:step]:
      return int(seq[step])
  raise AssertionError(f"no fresh token in {seq}")


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_greedy_equals_baseline(pair, gamma, batch):
  target, params, draft_params = pair
  inputs = _inputs(batch)
  eos = _eos_mid_run(target, params, _inputs(3))
  base = temperature_sample(target, params, inputs, max_decode_len=MAX_LEN, eos_id=eos)
  base_lengths = np.asarray(base.lengths)
  assert base_lengths[0] < MAX_LEN  # EOS in mid-run ...
  if batch == 3:
    assert len(set(base_lengths)) > 1 and base_lengths.max() == MAX_LEN  # ... rows differ.
  for draft_params_ in (draft_params, params):  # An unrelated draft; the target itself.
    draft = T5Draft(target, draft_params_)
    out = speculative_sample(target, params, draft, inputs, gamma=gamma,
                             max_decode_len=MAX_LEN, eos_id=eos)
    np.testing.assert_array_equal(out.sequences, base.sequences)
    np.testing.assert_array_equal(out.lengths, base.lengths)
  # With the target as its own draft every proposal is accepted (alpha = 1), so
  # EOS and max_decode_len fall inside accepted runs.
  np.testing.assert_array_equal(out.stats.alpha_empirical(), 1.0)
  np.testing.assert_allclose(out.stats.alpha_beta(), 1.0, atol=1e-6)
  np.testing.assert_array_equal(out.stats.iterations, -(-base_lengths // (gamma + 1)))
  # Statistics stop at the output's end: the self-draft keeps proposing (and the
  # target keeps accepting) after EOS, but those positions are not counted. A full
  # iteration emits gamma + 1 tokens from gamma scored positions, the last one
  # emits r <= gamma tokens from r positions.
  np.testing.assert_array_equal(out.stats.accepted, np.asarray(out.accepted_mask).sum(1))
  np.testing.assert_array_equal(out.stats.beta_count,
                                base_lengths - base_lengths // (gamma + 1))


def test_greedy_with_other_drafts(pair):
  """Drafts of another architecture, n-gram drafts and prompt lookup: same tokens."""
  target, params, _ = pair
  inputs = _inputs(3)
  base = temperature_sample(target, params, inputs, max_decode_len=MAX_LEN)
  other, other_params = make_model("test-v1_0", seed=2)
  counts = np.arange(97, dtype=np.int64)
  prev, nxt = np.meshgrid(np.arange(97), np.arange(97), indexing="ij")
  bigram = NgramDraft.from_counts(counts, prev.ravel().astype(np.int32),
                                  nxt.ravel().astype(np.int32),
                                  (prev * 7 + nxt * 3).ravel() % 11, order=2)
  for draft in (T5Draft(other, other_params), bigram, PromptLookupDraft(97)):
    out = speculative_sample(target, params, draft, inputs, gamma=3, max_decode_len=MAX_LEN)
    np.testing.assert_array_equal(out.sequences, base.sequences)


def test_prompt_lookup_copies_the_input(pair):
  """An input that contains the target's own output gives long accepted runs."""
  target, params, _ = pair
  inputs = _inputs(1)
  base = np.asarray(temperature_sample(target, params, inputs, max_decode_len=MAX_LEN)
                    .sequences)
  copy_inputs = jnp.asarray(np.concatenate([base[:, :MAX_LEN - 1], [[1]]], axis=1), jnp.int32)
  out = speculative_sample(target, params, PromptLookupDraft(97), inputs, gamma=4,
                           max_decode_len=MAX_LEN, draft_inputs=copy_inputs)
  np.testing.assert_array_equal(out.sequences, base)
  assert float(out.stats.alpha_empirical()[0]) > 0.8


def test_stats_are_consistent(pair):
  target, params, draft_params = pair
  gamma = 3
  out = speculative_sample(target, params, T5Draft(target, draft_params), _inputs(3),
                           gamma=gamma, max_decode_len=MAX_LEN, temperature=1.0,
                           rng=jax.random.PRNGKey(3))
  s = jax.tree_util.tree_map(np.asarray, out.stats)
  np.testing.assert_array_equal(s.accepted_histogram.sum(1), s.iterations)
  np.testing.assert_array_equal(s.accepted_histogram @ np.arange(gamma + 1), s.accepted)
  np.testing.assert_array_equal(s.draft_forward_passes, gamma * s.iterations)
  np.testing.assert_array_equal(s.tokens, out.lengths)
  # Each iteration emits n + 1 tokens, fewer only in the last (EOS / max length).
  assert np.all(s.tokens <= s.accepted + s.iterations)
  assert np.all(s.tokens > s.accepted + s.iterations - gamma - 1)
  assert np.all(s.rejections <= s.iterations)
  assert int(s.loop_iterations) == s.iterations.max()
  np.testing.assert_array_equal(np.asarray(out.accepted_mask).sum(1), s.accepted)
  assert np.all(s.beta_count <= s.tokens)
  assert np.all((s.alpha_beta() >= 0) & (s.alpha_beta() <= 1))


def test_same_rng_same_output(pair):
  target, params, draft_params = pair
  draft = T5Draft(target, draft_params)
  run = lambda seed: speculative_sample(target, params, draft, _inputs(3), gamma=2,
                                        max_decode_len=MAX_LEN, temperature=1.0,
                                        rng=jax.random.PRNGKey(seed)).sequences
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.array_equal(run(0), run(1))


def test_bad_arguments_raise(pair):
  target, params, draft_params = pair
  draft = T5Draft(target, draft_params)
  with pytest.raises(ValueError, match="gamma"):
    speculative_sample(target, params, draft, _inputs(1), gamma=0, max_decode_len=4)
  small, small_params = make_model("test-v1_0", seed=2, vocab_size=50)
  with pytest.raises(ValueError, match="vocabulary"):
    speculative_sample(target, params, T5Draft(small, small_params), _inputs(1), gamma=2,
                       max_decode_len=4)
  with pytest.raises(ValueError, match="max_decode_len"):
    speculative_sample(target, params, draft, _inputs(1), gamma=2, max_decode_len=0)


# --- The output distribution, against the exact one -------------------------------------

VOCAB, LENGTH, SAMPLES = 5, 3, 30_000


def _exact_distribution(model, params, inputs_row, warp_kwargs, eos_id):
  """P(first LENGTH tokens) of ancestral sampling, by enumeration: {(tokens, len): p}."""
  seqs = list(itertools.product(range(VOCAB), repeat=LENGTH))
  decoder_inputs = jnp.asarray([(0,) + s[:-1] for s in seqs], jnp.int32)
  inputs = jnp.broadcast_to(inputs_row, (len(seqs), inputs_row.shape[0]))
  probs = np.asarray(sampling.probs_from_logits(model.logits(params, inputs, decoder_inputs),
                                                **warp_kwargs), np.float64)
  return sequence_distribution(seqs, probs, eos_id)


def sequence_distribution(seqs: list[tuple[int, ...]], probs: np.ndarray,
                          eos_id: int) -> dict:
  """{(tokens 0-padded after EOS, length): p} from each sequence's teacher-forced probabilities.

  Args:
    seqs: every sequence of LENGTH tokens.
    probs: `[len(seqs), LENGTH, VOCAB]`, the distribution of token i given seq[:i].
    eos_id: where a sequence ends (sequences equal up to it share one entry).
  """
  dist = {}
  for seq, pr in zip(seqs, probs, strict=True):
    p, kept = 1.0, []
    for i, token in enumerate(seq):
      p *= pr[i, token]
      kept.append(token)
      if token == eos_id:
        break
    dist[(tuple(kept) + (0,) * (LENGTH - len(kept)), len(kept))] = p
  return dist


def _chi_square_p_value(sequences, lengths, dist) -> float:
  keys = list(dist)
  index = {k: i for i, k in enumerate(keys)}
  counts = np.zeros(len(keys))
  for seq, length in zip(np.asarray(sequences)[:, :LENGTH], np.asarray(lengths), strict=True):
    key = (tuple(int(t) for t in seq), min(int(length), LENGTH))
    if key not in index:  # A sequence the target cannot produce.
      return 0.0
    counts[index[key]] += 1
  expected = np.array([dist[k] for k in keys]) * len(lengths)
  if np.any(counts[expected == 0] > 0):  # Tokens that top-k / top-p exclude.
    return 0.0
  counts, expected = counts[expected > 0], expected[expected > 0]
  # Pool the cells with small expectations into one.
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum()) if small.any() else counts
  exp = np.append(expected[~small], expected[small].sum()) if small.any() else expected
  exp *= obs.sum() / exp.sum()
  return float(scipy_stats.chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def tiny_pair():
  target, target_params = make_model("test-v1_1", seed=3, vocab_size=VOCAB,
                                     num_decoder_layers=2)
  draft, draft_params = make_model("test-v1_0", seed=4, vocab_size=VOCAB)
  inputs = jnp.asarray(np.random.RandomState(1).randint(2, VOCAB, size=(1, 6)), jnp.int32)
  inputs = jnp.broadcast_to(inputs, (SAMPLES, 6))  # One prompt, many samples.
  return target, target_params, T5Draft(draft, draft_params), inputs


@pytest.mark.parametrize("warp_kwargs", [dict(temperature=1.0),
                                         dict(temperature=0.8, top_k=4, top_p=0.9)])
def test_output_distribution_is_the_targets(tiny_pair, warp_kwargs):
  target, params, draft, inputs = tiny_pair
  dist = _exact_distribution(target, params, inputs[0], warp_kwargs, eos_id=1)
  out = speculative_sample(target, params, draft, inputs, gamma=2, max_decode_len=LENGTH,
                           rng=jax.random.PRNGKey(0), **warp_kwargs)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both accept and reject paths are exercised.
  base = temperature_sample(target, params, inputs, max_decode_len=LENGTH,
                            rng=jax.random.PRNGKey(1), **warp_kwargs)
  assert _chi_square_p_value(base.sequences, base.lengths, dist) > 1e-3
  assert _chi_square_p_value(out.sequences, out.lengths, dist) > 1e-3


def test_a_draft_with_a_shortlist_head_keeps_the_targets_distribution(tiny_pair):
  """A draft that can propose only tokens {1, 2, 4} (q = 0 on 0 and 3): the target's
  residual distribution supplies the others, so the output is still the target's."""
  target, params, draft, inputs = tiny_pair
  dist = _exact_distribution(target, params, inputs[0], dict(temperature=1.0), eos_id=1)
  short = make_draft(draft.model, draft.params, np.array([1, 2, 4], np.int32))
  out = speculative_sample(target, params, short, inputs, gamma=2, max_decode_len=LENGTH,
                           rng=jax.random.PRNGKey(2), temperature=1.0)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha
  sequences = np.asarray(out.sequences)[:, :LENGTH]
  emitted = sequences[np.arange(LENGTH)[None] < np.asarray(out.lengths)[:, None]]
  assert {0, 3} <= set(emitted.tolist())  # Tokens the draft cannot propose, before EOS.
  assert _chi_square_p_value(out.sequences, out.lengths, dist) > 1e-3


def accept_all(rng: jax.Array, proposals: jax.Array, q_probs: jax.Array,
               p_probs: jax.Array) -> acceptance.VerifyOutput:
  """A wrong rule: every proposal accepted, the next token drawn from p after them."""
  batch, gamma = proposals.shape
  return acceptance.VerifyOutput(
      num_accepted=jnp.full((batch,), gamma, jnp.int32),
      next_token=jax.random.categorical(rng, jnp.log(p_probs[:, gamma])).astype(jnp.int32),
      beta=jnp.sum(jnp.minimum(p_probs[:, :gamma], q_probs), -1))


def test_accept_everything_sampler_fails_the_same_test(tiny_pair):
  """Negative control: a sampler that accepts every proposal is detected."""
  target, params, draft, inputs = tiny_pair
  dist = _exact_distribution(target, params, inputs[0], dict(temperature=1.0), eos_id=1)
  out = speculative.speculative_decode(
      T5Scorer(target, params), draft, inputs, jax.random.PRNGKey(0), gamma=2,
      max_decode_len=LENGTH, warp=Warp(temperature=1.0), eos_id=1, draft_inputs=inputs,
      verify=accept_all)
  assert _chi_square_p_value(out.sequences, out.lengths, dist) < 1e-6


def test_ngram_drafts_are_distributions_over_the_counts():
  """Unigram: smoothed frequencies; bigram: Witten-Bell mix of successors and unigram."""
  unigram = np.array([0, 5, 3, 2, 0], np.int64)
  prev = np.array([1, 1, 2], np.int32)
  nxt = np.array([2, 3, 1], np.int32)
  count = np.array([4, 1, 2], np.int64)
  one = NgramDraft.from_counts(unigram, prev, nxt, count, order=1)
  two = NgramDraft.from_counts(unigram, prev, nxt, count, order=2)
  uni = (unigram + 1) / (unigram.sum() + 5)
  context = jnp.asarray([1, 2, 4], jnp.int32)
  np.testing.assert_allclose(np.exp(one._logits(context)), np.broadcast_to(uni, (3, 5)),
                             rtol=1e-6)
  q = np.exp(np.asarray(two._logits(context)))
  np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-6)
  w1 = 5 / (5 + 2)  # Token 1: 5 bigram observations of 2 types.
  expected = (1 - w1) * uni + w1 * np.array([0, 0, 0.8, 0.2, 0])
  np.testing.assert_allclose(q[0], expected, rtol=1e-6)
  np.testing.assert_allclose(q[2], uni, rtol=1e-6)  # Never seen as a context: unigram.


def test_prompt_lookup_proposes_the_continuation_of_the_longest_match():
  inputs = jnp.asarray([[5, 6, 7, 8, 5, 6, 9, 1], [3, 4, 3, 4, 3, 4, 1, 0]], jnp.int32)
  tokens = jnp.asarray([[0, 5, 6, 0, 0], [0, 9, 2, 0, 0]], jnp.int32)
  lengths = jnp.asarray([2, 2], jnp.int32)
  draft = PromptLookupDraft(10)
  _, proposals, q_logits = draft.propose(draft.init_state(inputs, 8), tokens, lengths,
                                         jax.random.PRNGKey(0), gamma=3,
                                         warp=Warp(temperature=1.0))
  # Row 0: "5 6" first occurs at 0, so the continuation is 7 8 5 (not the later 5 6 -> 9).
  # Row 1: "2" never occurs in the input: the last token is proposed again.
  np.testing.assert_array_equal(proposals, [[7, 8, 5], [2, 2, 2]])
  np.testing.assert_array_equal(jnp.argmax(q_logits, -1), proposals)
  assert np.all(np.isneginf(np.asarray(q_logits)).sum(-1) == 9)  # Point masses.
