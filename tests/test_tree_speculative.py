"""The tree loop on a tiny random Llama: greedy tokens equal the target's greedy decoding.

Trees from each proposer alone and from all three merged (prompt lookup, a
datastore over the target's own outputs, the draft's top-k branches), with an
EOS that ends rows at different lengths; the chain (one branch) is a tree too.
At T > 0 the loop's first three tokens are distributed as the target's (a
chi-square against the target's own probabilities, with a negative control
that must fail: siblings tried without removing the candidates before them),
with the draft's candidates taken as its top-k or drawn from it;
the sampled loop is a function of its key, and its counters add up.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from conftest import greedy_with_mid_run_eos

from specdec_jax.costs import tree_choice
from specdec_jax.decoding import proposers, tree_speculative
from specdec_jax.decoding import tree_acceptance as ta
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.tree_speculative import TreeStats, tree_speculative_decode
from specdec_jax.models.llama import TEST_CONFIG, LayerSkipDraft, LlamaModel, LlamaScorer
from specdec_jax.models.llama.scorer import pad_prompts

MAX_LEN = 14
PROMPTS = [[5, 6, 7, 8, 9, 5, 6], [11, 12], [40, 41, 40]]


@functools.cache
def _model():
  model = LlamaModel(TEST_CONFIG)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * (2.0 if "kernel" in jax.tree_util.keystr(path) else 1.0),
      model.init_params(jax.random.PRNGKey(0)))
  weights = model.prepare(params)
  return model, weights, LlamaScorer(model, weights), jnp.asarray(pad_prompts(PROMPTS))


@functools.cache
def _setup():
  model, weights, target, prompts = _model()
  greedy, eos, want = greedy_with_mid_run_eos(target, prompts, MAX_LEN)
  # The datastore holds the target's outputs on other "training" prompts: here its own.
  store = proposers.Datastore.from_sequences(list(np.asarray(greedy.sequences)[1:]),
                                             split="train", depth=3)
  return model, weights, target, prompts, eos, want, store


def _proposer(name: str):
  model, weights, *_, store = _setup()
  draft = LayerSkipDraft(model, weights, 1)
  return {
      "lookup": proposers.PromptLookup(depth=3),
      "datastore": store,
      "chain": proposers.DraftBranches(draft, k=1, depth=3),
      "merged": proposers.Merged((proposers.PromptLookup(depth=2), store,
                                  proposers.DraftBranches(draft, k=2, depth=2))),
  }[name]


@pytest.mark.parametrize("name", ["chain", "merged"])
def test_greedy_tokens_are_the_targets(name):
  _, _, target, prompts, eos, want, _ = _setup()
  out = tree_speculative_decode(target, _proposer(name), prompts, jax.random.PRNGKey(1),
                                max_decode_len=MAX_LEN, warp=Warp(), eos_id=eos)
  np.testing.assert_array_equal(out.sequences, want.sequences)
  np.testing.assert_array_equal(out.lengths, want.lengths)
  np.testing.assert_array_equal(out.stats.tokens, want.lengths)
  if name == "merged":  # Rows 1 and 2 are in the datastore: several tokens per call.
    assert np.all(out.stats.tokens_per_iteration()[1:] > 2)
  offered, accepted = np.asarray(out.stats.rank_offered), np.asarray(out.stats.rank_accepted)
  assert np.all(accepted <= offered) and np.all(accepted.sum((1, 2)) >= out.stats.accepted)
  if name == "chain":  # The root is reached every iteration, depth d + 1 when d was accepted.
    np.testing.assert_array_equal(offered[:, 0, 0], out.stats.iterations)
    np.testing.assert_array_equal(offered[:, 1:, 0], accepted[:, :-1, 0])
  tree_choice.check_rates(out.stats.rank_rates())


def test_sampled_loop_is_a_function_of_its_key():
  _, _, target, prompts, eos, _, _ = _setup()
  run = functools.partial(tree_speculative_decode, target, _proposer("merged"), prompts,
                          max_decode_len=MAX_LEN, warp=Warp(1.0, top_k=20), eos_id=eos)
  a, b = run(jax.random.PRNGKey(3)), run(jax.random.PRNGKey(3))
  np.testing.assert_array_equal(a.sequences, b.sequences)
  np.testing.assert_array_equal(a.stats.tokens, a.lengths)
  np.testing.assert_array_equal(a.stats.accepted_histogram.sum(1), a.stats.iterations)
  assert np.all(a.stats.accepted <= a.lengths)


SAMPLED = Warp(1.0, top_k=4, top_p=0.9)
DRAWS = 3000


def _three_token_probs(target, prompt: jnp.ndarray) -> dict[tuple[int, ...], float]:
  """{(x1, x2, x3): the target's probability of its first three tokens under SAMPLED},
  from its own logits: every (x1, x2) scored as a chain, in one jitted call."""
  vocab = target.vocab_size
  pairs = np.stack(np.meshgrid(np.arange(vocab), np.arange(vocab), indexing="ij"), -1)

  @jax.jit
  def probs(chunks):
    batch = jnp.broadcast_to(prompt, (chunks.shape[0], prompt.shape[1]))
    logits, _ = target.score(target.init_state(target.encode(batch), 4), chunks)
    return SAMPLED.probs(logits)  # [vocab^2, 3, vocab]

  chunks = np.concatenate([np.full((vocab * vocab, 1), target.start_token),
                           pairs.reshape(-1, 2)], axis=1).astype(np.int32)
  p = np.asarray(probs(jnp.asarray(chunks)), np.float64).reshape(vocab, vocab, 3, vocab)
  joint = p[0, 0, 0][:, None, None] * p[:, 0, 1][:, :, None] * p[:, :, 2]  # [x1, x2, x3]
  return {tuple(int(x) for x in cell): float(joint[tuple(cell)])
          for cell in np.argwhere(joint > 0)}


def _chi_square_p_value(target, prompt, proposer) -> tuple[float, TreeStats]:
  """The p-value of the loop's first three tokens over DRAWS rows against the target's
  probabilities (cells of expected count < 5 pooled), and the loop's counters."""
  want = _three_token_probs(target, prompt)
  out = tree_speculative_decode(target, proposer, jnp.repeat(prompt, DRAWS, axis=0),
                                jax.random.PRNGKey(11), max_decode_len=3, warp=SAMPLED,
                                eos_id=-1)
  seen = [tuple(row) for row in np.asarray(out.sequences).tolist()]
  counts = {cell: 0 for cell in want}
  outside = 0
  for cell in seen:
    if cell in counts:
      counts[cell] += 1
    else:
      outside += 1
  cells = sorted(want, key=want.get, reverse=True)
  expected = np.array([DRAWS * want[c] for c in cells])
  observed = np.array([counts[c] for c in cells])
  big = expected >= 5
  expected = np.append(expected[big], expected[~big].sum() + 1e-9)
  observed = np.append(observed[big], observed[~big].sum() + outside)
  return (float(scipy.stats.chisquare(observed, expected * observed.sum() / expected.sum())
                .pvalue), out.stats)


@pytest.mark.parametrize("case", ["top_k", "drawn", "deterministic_first"])
def test_sampled_tokens_are_distributed_as_the_targets(monkeypatch, case):
  """Top-k 4 and top-p 0.9 at T = 1, the first three tokens of 3,000 rows against the
  target's probabilities. top_k: a draft's top-2 branches and its top-1 again, a duplicate
  sibling. drawn: 2 children drawn without replacement, then a third drawn i.i.d. (it may
  repeat either), each deeper node drawn at its parent: candidates of three origins in one
  tree. deterministic_first: the draft's top-1 chain (deterministic, as a prompt
  look-up's 'lookup<n>+' chain is) tried before 2 drawn children, which are then tested
  against the residual it leaves. The control forgets
  each rejected candidate (the residual never updated): a rejected token stays in r, so it
  is emitted too often, and the same statistic must reject it."""
  model, weights, target, prompts = _model()
  draft = LayerSkipDraft(model, weights, 1)
  sample = case != "top_k"
  branches = proposers.DraftBranches(draft, k=2, depth=2, sample=sample)
  proposer = (proposers.Merged((proposers.DraftBranches(draft, k=1, depth=2), branches))
              if case == "deterministic_first" else
              proposers.Merged((branches, proposers.DraftBranches(draft, k=1, depth=2,
                                                                  sample=sample))))
  prompt = prompts[:1]
  p_value, counters = _chi_square_p_value(target, prompt, proposer)
  # The tree's candidates make the output, not only the next token.
  assert np.mean(counters.accepted) > 0.3
  assert p_value > 1e-3
  rates = counters.rank_rates()
  assert counters.rank_offered[:, 0, 2].sum() > 0
  if case == "drawn":  # A third draw can be a token the residual still holds.
    assert rates[0, 2] > 0
  elif case == "top_k":  # The duplicate of the top-1 token is tried but never accepted.
    assert rates[0, 2] == 0
  else:  # The top-1 is accepted with the target's probability of it, then the draws.
    assert rates[0, 0] > 0 and rates[0, 1] > 0
  with monkeypatch.context() as patch:
    patch.setattr(ta, "acceptance", type("Forgetful", (), {
        "residual_distribution": staticmethod(lambda r, q: r)}))
    tree_speculative._tree_loop.clear_cache()
    control, _ = _chi_square_p_value(target, prompt, proposer)
  tree_speculative._tree_loop.clear_cache()
  assert control < 1e-6
