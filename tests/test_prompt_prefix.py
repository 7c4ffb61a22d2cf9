"""A prefix every prompt starts with, prefilled once (`LlamaScorer.with_prefix`): the same
logits and the same greedy tokens as prefilling each prompt whole."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_llama import _random_model

from specdec_jax.decoding import baseline
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import LlamaScorer, pad_prompts

PREFIX = [5, 6, 7]
PROMPTS = [PREFIX + [8, 9], PREFIX + [11], PREFIX + [20, 21, 22, 23]]


def test_a_prefilled_prefix_scores_as_the_whole_prompt():
  model, params = _random_model()
  whole = LlamaScorer(model, model.prepare(params))
  prefixed = whole.with_prefix(jnp.asarray(PREFIX))
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  prefixed.check_prompts(prompts)
  text = jnp.asarray(np.random.RandomState(0).randint(1, 97, size=(3, 5)), jnp.int32)
  logits = [s.score(s.init_state(s.encode(prompts), 8), text)[0] for s in (whole, prefixed)]
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-5, rtol=0)
  outs = [baseline.decode(s, prompts, jax.random.PRNGKey(0), max_decode_len=10, warp=Warp(),
                          eos_id=96) for s in (whole, prefixed)]
  np.testing.assert_array_equal(outs[1].sequences, outs[0].sequences)
  np.testing.assert_array_equal(outs[1].lengths, outs[0].lengths)


def test_prompts_without_the_prefix_are_refused():
  model, params = _random_model()
  prefixed = LlamaScorer(model, model.prepare(params)).with_prefix(jnp.asarray(PREFIX))
  with pytest.raises(ValueError, match="start with the scorer's 3-token prefix"):
    prefixed.check_prompts(pad_prompts([[5, 6, 8, 9]]))
  with pytest.raises(ValueError, match="and be longer"):
    prefixed.check_prompts(pad_prompts([PREFIX]))
