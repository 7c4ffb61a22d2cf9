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

With `test_steps` > 1 (EAGLE-3's "training-time test"), the step runs the draft again
with its own predicted features in place of the target's along the outputs, as it reads
them when it proposes a second token beyond the verified text, and adds that pass's
distillation loss (one more pass per extra step, each reading the previous one's
predictions; the prompt's features stay the target's, which it has computed).

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
                    batch: Batch, decoder_features: Array | None = None
                    ) -> tuple[Array, Array | None, Array | None]:
  """The student's teacher-forced logits `[b, T, head + 1]` (the last column outside),
  its feature loss and the features it predicts at the decoder positions `[b, T, F]`
  (both None without features).

  Args:
    student: the draft.
    params: its parameters.
    embedding: `[vocab, embed_dim]`, the target's token embedding.
    head_tokens: int32 `[head]`, the shortlist.
    batch: a shortlist signals batch (`encoder_input_tokens` the prompts, 0-padded,
      no 0 inside; `decoder_input_tokens`; with features, `encoder_hidden` `[b, Lp, F]`
      and `decoder_hidden` `[b, T, F]`).
    decoder_features: `[b, T, F]` read in place of the batch's `decoder_hidden` (the
      training-time test's own predictions); the loss still compares with the target's.
  """
  prompts = batch["encoder_input_tokens"]
  lengths = jnp.sum(prompts != 0, axis=1).astype(jnp.int32)
  width = prompts.shape[1]
  features = {}
  if student.config.feature_size:
    read = batch["decoder_hidden"] if decoder_features is None else decoder_features
    features = {"prompt_features": batch["encoder_hidden"], "decoder_features": read}
  logits, predicted = student.outputs(params, embedding, head_tokens, prompts, lengths,
                                      batch["decoder_input_tokens"], **features)
  logits = jnp.pad(logits[:, width:], ((0, 0), (0, 0), (0, 1)), constant_values=_OUTSIDE)
  if predicted is None:
    return logits, None, None
  # Prompt column i predicts the target's feature at i (known for i < n - 1); decoder
  # column t the one at decoder position t (known where the loss weight is).
  target = jnp.concatenate([batch["encoder_hidden"], batch["decoder_hidden"]],
                           axis=1).astype(jnp.float32)
  known = jnp.concatenate([jnp.arange(width)[None] < (lengths - 1)[:, None],
                           batch["decoder_loss_weights"] > 0], axis=1).astype(jnp.float32)
  distance = jnp.mean(optax.huber_loss(predicted, target), axis=-1)       # [b, Lp + T]
  return (logits, jnp.sum(distance * known) / jnp.maximum(jnp.sum(known), 1.0),
          predicted[:, width:])


def student_logits(student: Student, params: dict, embedding: Array, head_tokens: Array,
                   batch: Batch) -> Array:
  """`student_outputs`' logits `[b, T, head + 1]`."""
  return student_outputs(student, params, embedding, head_tokens, batch)[0]


def check_test_steps(student: Student, test_steps: int) -> None:
  """Raises ValueError unless `test_steps` >= 1, and 1 for a draft without features."""
  if test_steps < 1:
    raise ValueError(f"test_steps must be >= 1 (1: no training-time test), got {test_steps}.")
  if test_steps > 1 and not student.config.feature_size:
    raise ValueError(f"test_steps={test_steps} feeds the draft its own predicted features; "
                     "this draft reads none (reads_features=False): pass test_steps=1.")


def make_train_step(student: Student, optimizer: optax.GradientTransformation,
                    loss_cfg: LossConfig, feature_weight: float = 1.0, test_steps: int = 1
                    ) -> Callable[[TrainState, Batch, Array, Array, Array],
                                  tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng, embedding, head_tokens) -> (new state, metrics)`.

  The step donates `state`. Metrics are `trainer.loss_terms`' plus "grad_norm" (and
  "feature_loss" for a student that reads features, whose loss adds `feature_weight`
  times it; with `test_steps` > 1, "test_loss", the later passes' distillation losses
  summed, which the loss adds as well).

  Raises:
    ValueError: see `sparse_distill.check_loss_config` and `check_test_steps`.
  """
  check_loss_config(loss_cfg)
  check_test_steps(student, test_steps)

  def step(state: TrainState, batch: Batch, rng: Array, embedding: Array, head_tokens: Array):
    del rng  # No dropout.

    def loss_fn(params):
      logits, feature_loss, predicted = student_outputs(student, params, embedding,
                                                        head_tokens, batch)
      loss, terms = signals_loss_terms(logits, batch, loss_cfg)
      if feature_loss is None:
        return loss, terms
      test_loss = 0.0
      for _ in range(test_steps - 1):
        logits, _, predicted = student_outputs(student, params, embedding, head_tokens, batch,
                                               predicted.astype(batch["decoder_hidden"].dtype))
        test_loss = test_loss + signals_loss_terms(logits, batch, loss_cfg)[0]
      total = loss + feature_weight * feature_loss + test_loss
      extra = {"test_loss": test_loss} if test_steps > 1 else {}
      return total, {**terms, "feature_loss": feature_loss, **extra, "loss": total}

    return optimizer_step(state, optimizer, loss_fn)

  return jax.jit(step, donate_argnums=(0,))


def make_eval_step(student: Student) -> Callable[[dict, Batch, Array, Array, Array],
                                                 dict[str, Array]]:
  """A jitted `(params, batch, greedy, embedding, head_tokens) -> sums` over one batch.

  Args of the step: `greedy` bool `[b]` marks the rows that are greedy decodings.

  Returns of the step: float32 sums {"beta_greedy", "tokens_greedy", "beta_sampled",
  "tokens_sampled"}: beta per token as the module docstring defines it, summed over
  the loss-weighted positions of each kind of row. A draft that reads features adds
  "beta_greedy_second" and "beta_sampled_second": the same with its own predicted features
  read in place of the target's along the outputs, as when it proposes a second token.
  """

  def betas(logits: Array, batch: Batch) -> tuple[Array, Array]:
    q = jax.nn.softmax(logits, axis=-1)
    ids = batch["teacher_topk_ids"]                                          # [b, T, k]
    p = jnp.exp(batch["teacher_topk_logprobs"].astype(jnp.float32))
    sampled = jnp.sum(jnp.minimum(p, jnp.take_along_axis(q, ids, axis=-1)), axis=-1)
    return (jnp.argmax(logits, axis=-1) == ids[..., 0]).astype(jnp.float32), sampled

  def step(params: dict, batch: Batch, greedy: Array, embedding: Array, head_tokens: Array):
    logits, _, predicted = student_outputs(student, params, embedding, head_tokens, batch)
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    rows = greedy.astype(jnp.float32)[:, None]
    greedy_w, sampled_w = weights * rows, weights * (1 - rows)
    beta_greedy, beta_sampled = betas(logits, batch)
    sums = {"beta_greedy": jnp.sum(beta_greedy * greedy_w), "tokens_greedy": jnp.sum(greedy_w),
            "beta_sampled": jnp.sum(beta_sampled * sampled_w),
            "tokens_sampled": jnp.sum(sampled_w)}
    if predicted is not None:
      second, _, _ = student_outputs(student, params, embedding, head_tokens, batch,
                                     predicted.astype(batch["decoder_hidden"].dtype))
      beta_greedy, beta_sampled = betas(second, batch)
      sums |= {"beta_greedy_second": jnp.sum(beta_greedy * greedy_w),
               "beta_sampled_second": jnp.sum(beta_sampled * sampled_w)}
    return sums

  return jax.jit(step)
