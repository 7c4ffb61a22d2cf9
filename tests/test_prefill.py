"""The prompt's prefill computes no logits: nobody reads them, and XLA drops their product.

A decoder-only scorer prefills all but each prompt's last token (`LlamaScorer.init_state`)
with the same chunk call that scores, which returns logits. Inside the loops' compiled
program those logits are dead, so the vocabulary-wide product must not be in it; the
first scored token's is (the control that the search finds them).
"""

import jax
import jax.numpy as jnp

from specdec_jax.models.llama import TEST_CONFIG, LlamaModel, LlamaScorer, pad_prompts

VOCAB = 4099  # A width no other array of the tiny model has.


def _products_of_vocab_width(fn, *args) -> list[str]:
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  return [line for line in hlo.splitlines()
          if f"{VOCAB}]" in line.split("=", 1)[-1].split("(", 1)[0]
          and (" dot(" in line or "custom-call(" in line)]


def test_the_prefill_computes_no_logits():
  model = LlamaModel(TEST_CONFIG.replace(vocab_size=VOCAB))
  scorer = LlamaScorer(model, model.prepare(model.init_params(jax.random.PRNGKey(0))))
  prompts = jnp.asarray(pad_prompts([list(range(5, 40)), [7, 8, 9]]))

  def prefill(scorer, prompts):
    return scorer.init_state(scorer.encode(prompts), 8).cache

  def prefill_and_score(scorer, prompts):
    state = scorer.init_state(scorer.encode(prompts), 8)
    return scorer.score(state, prompts[:, :1])[0]

  assert not _products_of_vocab_width(prefill, scorer, prompts)
  # The control: the scored token's logits are found (one product per row, or one for all).
  assert _products_of_vocab_width(prefill_and_score, scorer, prompts)
