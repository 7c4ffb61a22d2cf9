"""The checked entry points over any scorer (`decoding.generate`), for both families.

At temperature 0 `speculative_sample` gives `sample`'s tokens for a Llama target with its
layer-skip draft and for a T5 target with a shared-encoder draft (the T5 entry point's
tokens too); bad arguments are refused before any work, naming the argument.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_shared_encoder_pair

from specdec_jax.decoding import generate
from specdec_jax.decoding.drafts import PromptLookupDraft
from specdec_jax.models.llama import (
  TEST_CONFIG,
  LayerSkipDraft,
  LlamaModel,
  LlamaScorer,
  pad_prompts,
)
from specdec_jax.models.t5 import SharedEncoderDraft, T5Scorer, temperature_sample

MAX_LEN = 12


@pytest.fixture(scope="module")
def llama():
  """A tiny random Llama's scorer, its one-layer self-draft and prompts of three lengths."""
  model = LlamaModel(TEST_CONFIG)
  weights = model.prepare(model.init_params(jax.random.PRNGKey(0)))
  prompts = jnp.asarray(pad_prompts([[5, 6, 7, 8, 9], [11, 12], [40]]))
  return LlamaScorer(model, weights), LayerSkipDraft(model, weights, 1), prompts


def _same_tokens(a, b) -> None:
  np.testing.assert_array_equal(a.lengths, b.lengths)
  for row, length in enumerate(np.asarray(a.lengths)):
    np.testing.assert_array_equal(a.sequences[row, :length], b.sequences[row, :length])


def test_greedy_speculative_equals_the_baseline_for_a_llama(llama):
  target, draft, prompts = llama
  base = generate.sample(target, prompts, max_decode_len=MAX_LEN, eos_id=2)
  out = generate.speculative_sample(target, draft, prompts, gamma=3, max_decode_len=MAX_LEN,
                                    eos_id=2)
  _same_tokens(out, base)
  assert int(out.stats.loop_iterations) < MAX_LEN  # Some proposals were accepted.


def test_greedy_speculative_equals_the_t5_entry_point_with_a_shared_encoder_draft():
  """The draft reads the target's encoder outputs: the scorer says how wide they are."""
  target, target_params, student, student_params = make_shared_encoder_pair()
  inputs = jnp.asarray(np.random.RandomState(0).randint(2, 97, size=(2, 7)), jnp.int32)
  scorer = T5Scorer(target, target.prepare(target_params))
  out = generate.speculative_sample(scorer, SharedEncoderDraft(student, student_params), inputs,
                                    gamma=2, max_decode_len=MAX_LEN, eos_id=1)
  _same_tokens(out, temperature_sample(target, target_params, inputs, max_decode_len=MAX_LEN))


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=0), r"gamma must be an int >= 1"),
    (dict(gamma=2.0), r"gamma must be an int"),
    (dict(eos_id=None), r"eos_id must be an int"),
    (dict(max_decode_len=0), r"max_decode_len must be an int >= 1"),
    (dict(temperature=-1.0), r"temperature"),
    (dict(draft=PromptLookupDraft(50)), r"draft's vocabulary \(50\) differs"),
    (dict(draft_inputs=jnp.ones((2, 3), jnp.int32)), r"draft_inputs has 2 rows but inputs has 3"),
    (dict(inputs=jnp.full((3, 4), 97, jnp.int32)), r"inputs holds token id 97"),
])
def test_bad_arguments_are_refused_by_name(llama, kwargs, message):
  target, draft, prompts = llama
  call = dict(draft=draft, inputs=prompts, gamma=2, max_decode_len=4, eos_id=2) | kwargs
  with pytest.raises(ValueError, match=message):
    generate.speculative_sample(target, **call)


def test_a_model_instead_of_a_scorer_is_refused_by_name(llama):
  _, draft, prompts = llama
  model, _ = make_model("test-v1_1")
  with pytest.raises(ValueError, match=r"target must be a specdec_jax\.decoding\.scorer\.Scorer"
                                       r" .*got T5Model"):
    generate.speculative_sample(model, draft, prompts, gamma=2, max_decode_len=4, eos_id=2)
  with pytest.raises(ValueError, match=r"scorer must be a .*Scorer .*got T5Model"):
    generate.sample(model, prompts, max_decode_len=4, eos_id=2)
