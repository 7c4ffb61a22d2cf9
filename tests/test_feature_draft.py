"""The draft that reads its target's features (`models.llama.feature_draft`, EAGLE-style).

Its generation path (prompt, proposals, the chunk each commit runs with the target's
features) computes the same logits as its teacher-forced training path; as a draft it
keeps speculative sampling exact: greedy tokens equal the baseline's, the output
distribution equals the enumerated one, and the wrong acceptance rule fails the same
test. A target that gives other features (or none) is refused by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_llama import EOS, PROMPT, PROMPTS, SAMPLES, _exact_distribution, _random_model
from test_speculative import LENGTH, VOCAB, _chi_square_p_value, accept_all

from specdec_jax import validation
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import LlamaScorer, pad_prompts
from specdec_jax.models.llama.feature_draft import FeatureDraft
from specdec_jax.models.llama.student import Student, student_config


def _feature_student(target_config, head_tokens, seed: int = 1, scale: float = 1.0) -> tuple:
  """A random feature-reading student of `target_config` scoring `head_tokens`."""
  config = student_config(target_config, d_model=16, num_layers=1, head_size=len(head_tokens),
                          head_dim=8, kv_groups=2, reads_features=True)
  student = Student(config)
  params = jax.tree.map(lambda x: x * scale, student.init_params(jax.random.PRNGKey(seed)))
  return student, params


def test_generation_equals_teacher_forcing_with_the_targets_features():
  model, params = _random_model()
  embedding = params["token_embedder"]["embedding"]
  head = jnp.asarray([1, 5, 9, 40, 41, 96], jnp.int32)
  student, sparams = _feature_student(model.config, head)
  draft = student.draft(sparams, embedding, head)
  assert isinstance(draft, FeatureDraft) and draft.feature_size == model.config.d_model
  target = LlamaScorer(model, model.prepare(params))
  prompts = jnp.asarray(pad_prompts(PROMPTS))                          # [3, 5]
  lengths = jnp.asarray([len(p) for p in PROMPTS], jnp.int32)
  outputs = np.random.RandomState(0).randint(2, 97, size=(3, 6)).astype(np.int32)
  decoder_inputs = jnp.asarray(np.pad(outputs[:, :-1], ((0, 0), (1, 0))))
  # The target's features along the prompts and the outputs.
  state, prompt_features = target.init_state_with_features(target.encode(prompts), 8)
  _, decoder_features, _ = target.score_with_features(state, decoder_inputs)
  logits, predicted = student.outputs(sparams, embedding, head, prompts, lengths,
                                      decoder_inputs, jnp.pad(prompt_features,
                                                              ((0, 0), (0, 1), (0, 0))),
                                      decoder_features)
  forced = np.asarray(logits)[:, prompts.shape[1]:]                   # [3, 6, head]
  assert predicted.shape == (3, prompts.shape[1] + 6, model.config.d_model)

  # Generation: the prompt, then a proposal of gamma = 2 and a commit of length 3, as
  # if the target verified decoder positions 0..2 and accepted 2 of the 2 proposals.
  dstate = draft.init_state(prompts, 8, prompt_features)
  np.testing.assert_allclose(np.asarray(dstate.logits)[:, np.asarray(head)], forced[:, 0],
                             atol=1e-4, rtol=0)
  tokens = jnp.concatenate([jnp.zeros((3, 1), jnp.int32), jnp.asarray(outputs),
                            jnp.zeros((3, 4), jnp.int32)], axis=1)   # index t: output t - 1
  dstate, _, _ = draft.propose(dstate, tokens, jnp.zeros((3,), jnp.int32),
                               jax.random.PRNGKey(0), gamma=2, warp=Warp())
  for new_length, at in ((jnp.full((3,), 3, jnp.int32), 3), (jnp.asarray([1, 2, 3]), None)):
    committed = draft.commit(dstate, new_length, tokens, decoder_features[:, :3])
    got = np.asarray(committed.logits)[:, np.asarray(head)]
    rows = [(b, int(new_length[b])) for b in range(3)]
    np.testing.assert_allclose(got, np.stack([forced[b, t] for b, t in rows]), atol=1e-4,
                               rtol=0, err_msg=f"commit at {at or 'per-row lengths'}")
    outside = np.setdiff1d(np.arange(97), np.asarray(head))
    assert np.all(np.isneginf(np.asarray(committed.logits)[:, outside]))


def test_greedy_speculative_equals_the_baseline():
  model, params = _random_model()
  embedding = params["token_embedder"]["embedding"]
  target = LlamaScorer(model, model.prepare(params))
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  base = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=12,
                         warp=Warp(), eos_id=96)
  head = jnp.asarray(np.unique(np.asarray(base.sequences))[::2], jnp.int32)
  student, sparams = _feature_student(model.config, head, scale=3.0)
  draft = student.draft(sparams, embedding, head)
  for gamma in (1, 3, 5):
    out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0),
                                         gamma=gamma, max_decode_len=12, warp=Warp(), eos_id=96,
                                         draft_inputs=prompts)
    np.testing.assert_array_equal(out.sequences, base.sequences, err_msg=f"gamma={gamma}")
    np.testing.assert_array_equal(out.lengths, base.lengths)


@pytest.fixture(scope="module")
def tiny_feature_draft():
  """test_llama's tiny target of the distribution tests, and a feature draft of 3 tokens."""
  model, params = _random_model(seed=3, embedding_scale=0.2, vocab_size=VOCAB)
  embedding = params["token_embedder"]["embedding"]
  head = jnp.asarray([0, 1, 3], jnp.int32)
  student, sparams = _feature_student(model.config, head, seed=2, scale=2.0)
  prompts = jnp.asarray(np.tile(PROMPT, (SAMPLES, 1)), jnp.int32)
  return (model, params, LlamaScorer(model, model.prepare(params)),
          student.draft(sparams, embedding, head), prompts)


@pytest.mark.parametrize("warp", [Warp(1.0), Warp(0.8, top_k=4, top_p=0.9)])
def test_output_distribution_is_the_targets(tiny_feature_draft, warp):
  model, params, target, draft, prompts = tiny_feature_draft
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=warp, eos_id=EOS,
                                       draft_inputs=prompts)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both accept and reject paths are exercised.
  assert _chi_square_p_value(out.sequences, out.lengths,
                             _exact_distribution(model, params, warp)) > 1e-3


def test_accept_everything_fails_the_same_test(tiny_feature_draft):
  """Negative control: with this draft, a wrong acceptance rule is detected."""
  model, params, target, draft, prompts = tiny_feature_draft
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=Warp(1.0), eos_id=EOS,
                                       draft_inputs=prompts, verify=accept_all)
  assert _chi_square_p_value(out.sequences, out.lengths,
                             _exact_distribution(model, params, Warp(1.0))) < 1e-6


def test_a_target_of_other_features_is_refused_by_name():
  model, params = _random_model()
  head = jnp.asarray([1, 5, 9], jnp.int32)
  student, sparams = _feature_student(model.config, head)
  draft = student.draft(sparams, params["token_embedder"]["embedding"], head)
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  with pytest.raises(ValueError, match="reads target features 32 wide, but the target gives "
                                       "them 48 wide"):
    validation.check_draft(draft, 97, prompts, None, feature_size=48)
  with pytest.raises(ValueError, match="but the target gives none"):
    validation.check_draft(draft, 97, prompts, None)
  with pytest.raises(ValueError, match="needs the text"):
    draft.commit(draft.init_state(prompts, 8), jnp.zeros((3,), jnp.int32))
