"""Training a decoder-only draft (`models.llama.student.Student`) on its target's signals.

The batches are `signals_source`'s (the chat prompt as `encoder_input_tokens`, the
target's output as the decoder side) restated over the draft's shortlist
(`shortlist.to_shortlist`); the loss is `sparse_distill`'s on the student's logits
with one column appended at probability 0 (index `head`: the tokens outside the
shortlist). Only the draft runs: the target's part is in the batch, and its
embedding table, which the draft reads, is an argument of the step (not trained).

A student that reads its target's features (`StudentConfig.feature_size` > 0, EAGLE-style)
takes the batch's stored features (`encoder_hidden` along the prompt, `decoder_hidden`
along the outputs) as its inputs, and its loss adds `feature_weight` times the smooth-L1
distance (mean over the feature's width) between the features it predicts and the
target's, at every prompt and output position where the target computed one.

`make_eval_step` estimates the acceptance rate the paper defines, alpha = E[beta]
along the target's own outputs (held-out prompts): at T = 0, beta is whether the
draft's argmax is the target's (on the greedy decodings); at T = 1, beta =
sum_x min(p(x), q(x)) over the target's stored top-k (on the sampled decodings), a
lower bound that misses at most the target's rest mass.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from specdec_jax.models.llama.student import Student
from specdec_jax.training.sparse_distill import check_loss_config, signals_loss_terms
from specdec_jax.training.trainer import Batch, LossConfig, TrainState, optimizer_step

Array = jax.Array

# The logit of the column that stands for every token outside the shortlist: finite, so
# the loss's terms and gradients stay finite; exp of it is 0 in float32.
_OUTSIDE = -1e9


def student_outputs(student: Student, params: dict, embedding: Array, head_tokens: Array,
                    batch: Batch) -> tuple[Array, Array | None]:
  """The student's teacher-forced logits `[b, T, head + 1]` (the last column outside),
  and its feature loss (None without features).

  Args:
    student: the draft.
    params: its parameters.
    embedding: `[vocab, embed_dim]`, the target's token embedding.
    head_tokens: int32 `[head]`, the shortlist.
    batch: a shortlist signals batch (`encoder_input_tokens` the prompts, 0-padded,
      no 0 inside; `decoder_input_tokens`; with features, `encoder_hidden` `[b, Lp, F]`
      and `decoder_hidden` `[b, T, F]`).
  """
  prompts = batch["encoder_input_tokens"]
  lengths = jnp.sum(prompts != 0, axis=1).astype(jnp.int32)
  width = prompts.shape[1]
  features = {}
  if student.config.feature_size:
    features = {"prompt_features": batch["encoder_hidden"],
                "decoder_features": batch["decoder_hidden"]}
  logits, predicted = student.outputs(params, embedding, head_tokens, prompts, lengths,
                                      batch["decoder_input_tokens"], **features)
  logits = jnp.pad(logits[:, width:], ((0, 0), (0, 0), (0, 1)), constant_values=_OUTSIDE)
  if predicted is None:
    return logits, None
  # Prompt column i predicts the target's feature at i (known for i < n - 1); decoder
  # column t the one at decoder position t (known where the loss weight is).
  target = jnp.concatenate([batch["encoder_hidden"], batch["decoder_hidden"]],
                           axis=1).astype(jnp.float32)
  known = jnp.concatenate([jnp.arange(width)[None] < (lengths - 1)[:, None],
                           batch["decoder_loss_weights"] > 0], axis=1).astype(jnp.float32)
  distance = jnp.mean(optax.huber_loss(predicted, target), axis=-1)       # [b, Lp + T]
  return logits, jnp.sum(distance * known) / jnp.maximum(jnp.sum(known), 1.0)


def student_logits(student: Student, params: dict, embedding: Array, head_tokens: Array,
                   batch: Batch) -> Array:
  """`student_outputs`' logits `[b, T, head + 1]`."""
  return student_outputs(student, params, embedding, head_tokens, batch)[0]


def make_train_step(student: Student, optimizer: optax.GradientTransformation,
                    loss_cfg: LossConfig, feature_weight: float = 1.0
                    ) -> Callable[[TrainState, Batch, Array, Array, Array],
                                  tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng, embedding, head_tokens) -> (new state, metrics)`.

  The step donates `state`. Metrics are `trainer.loss_terms`' plus "grad_norm" (and
  "feature_loss" for a student that reads features, whose loss adds `feature_weight`
  times it).

  Raises:
    ValueError: see `sparse_distill.check_loss_config`.
  """
  check_loss_config(loss_cfg)

  def step(state: TrainState, batch: Batch, rng: Array, embedding: Array, head_tokens: Array):
    del rng  # No dropout.

    def loss_fn(params):
      logits, feature_loss = student_outputs(student, params, embedding, head_tokens, batch)
      loss, terms = signals_loss_terms(logits, batch, loss_cfg)
      if feature_loss is None:
        return loss, terms
      return loss + feature_weight * feature_loss, {**terms, "feature_loss": feature_loss,
                                                    "loss": loss + feature_weight * feature_loss}

    return optimizer_step(state, optimizer, loss_fn)

  return jax.jit(step, donate_argnums=(0,))


def make_eval_step(student: Student) -> Callable[[dict, Batch, Array, Array, Array],
                                                 dict[str, Array]]:
  """A jitted `(params, batch, greedy, embedding, head_tokens) -> sums` over one batch.

  Args of the step: `greedy` bool `[b]` marks the rows that are greedy decodings.

  Returns of the step: float32 sums {"beta_greedy", "tokens_greedy", "beta_sampled",
  "tokens_sampled"}: beta per token as the module docstring defines it, summed over
  the loss-weighted positions of each kind of row.
  """

  def step(params: dict, batch: Batch, greedy: Array, embedding: Array, head_tokens: Array):
    logits = student_logits(student, params, embedding, head_tokens, batch)  # [b, T, h + 1]
    q = jax.nn.softmax(logits, axis=-1)
    ids = batch["teacher_topk_ids"]                                          # [b, T, k]
    p = jnp.exp(batch["teacher_topk_logprobs"].astype(jnp.float32))
    beta_sampled = jnp.sum(jnp.minimum(p, jnp.take_along_axis(q, ids, axis=-1)), axis=-1)
    beta_greedy = (jnp.argmax(logits, axis=-1) == ids[..., 0]).astype(jnp.float32)
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    rows = greedy.astype(jnp.float32)[:, None]
    return {"beta_greedy": jnp.sum(beta_greedy * weights * rows),
            "tokens_greedy": jnp.sum(weights * rows),
            "beta_sampled": jnp.sum(beta_sampled * weights * (1 - rows)),
            "tokens_sampled": jnp.sum(weights * (1 - rows))}

  return jax.jit(step)
