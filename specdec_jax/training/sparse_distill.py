"""Training from the target's stored signals: no target in the step.

The target's distribution at each position is stored sparsely (`data.teacher_signals`):
its k largest log-probabilities at T=1 and the log of the mass left outside them. The
divergences here compare the student with the target on that representation: the
*coarse-grained* pair of distributions over k + 1 outcomes (the target's top-k ids and
one "rest" outcome holding everything else), p for the target, q for the student, with
`q_rest = 1 - sum_topk q` computed as a logsumexp over the student's logits outside the
top-k (stable when the rest is tiny, exact when it is large):

  forward_kl       -sum_topk p log q - p_rest log q_rest   (cross-entropy; KL(p || q)
                   up to the target's coarse entropy, a constant)
  total_variation  sum_topk |p - q| / 2 + |p_rest - q_rest| / 2
  reverse_kl       sum_topk q (log q - log p) + q_rest (log q_rest - log p_rest)

Merging outcomes never increases a divergence (data processing), so each is a lower
bound of its dense counterpart in `trainer` (for the KLs: the KL part of the forward
cross-entropy), with equality when the top-k holds every id. All three cost the same:
one gather of the student's top-k log-probs and one masked logsumexp per position.
Reverse KL here cannot see how the student spreads its rest mass over the ids outside
the target's top-k: it only asks that the total be the target's.

A batch is `batching`'s decoder layout (`decoder_input_tokens`, `decoder_target_tokens`,
`decoder_loss_weights`, all `[b, T]`) plus `encoder_input_tokens` int32 `[b, L]`,
`encoder_hidden` float16 `[b, L, d]` (a `SharedEncoderModel` student reads it; the
target's encoder outputs), `teacher_topk_ids` int `[b, T, k]`, `teacher_topk_logprobs`
float16 `[b, T, k]` and `teacher_rest_logprob` float32 `[b, T]` (`signals_source`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from specdec_jax.models.t5 import SharedEncoderModel, T5Model
from specdec_jax.training.trainer import (
    Batch,
    LossConfig,
    TrainState,
    optimizer_step,
    weighted_loss_terms,
)

Array = jax.Array

# Log-probabilities of the rest are clamped here (e^-100 ~ 4e-44, below float32's
# normal range): when the top-k holds (nearly) every id the rest is 0, and its log
# would be -inf. The clamp keeps the terms and their gradients finite.
LOG_FLOOR = -100.0
# Logits of the top-k ids are replaced by this before the rest's logsumexp: finite, so
# a row whose every id is in the top-k still has a finite (zero) gradient.
_MASKED = -1e9


def student_log_probs(student_logits: Array, topk_ids: Array) -> tuple[Array, Array]:
  """The student's log-probabilities of the target's top-k ids and of the rest.

  Args:
    student_logits: `[b, T, V]`.
    topk_ids: int `[b, T, k]`, distinct ids per position.

  Returns:
    float32 `log q` of each top-k id `[b, T, k]` and `log q_rest` `[b, T]`, the latter
    clamped below at `LOG_FLOOR`.
  """
  logits = student_logits.astype(jnp.float32)
  ids = topk_ids.astype(jnp.int32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  logq_topk = jnp.take_along_axis(logits, ids, axis=-1) - log_z[..., None]
  outside = jnp.put_along_axis(logits, ids, _MASKED, axis=-1, inplace=False)
  logq_rest = jax.nn.logsumexp(outside, axis=-1) - log_z
  return logq_topk, jnp.maximum(logq_rest, LOG_FLOOR)


def _teacher(topk_logprobs: Array, rest_logprob: Array) -> tuple[Array, Array]:
  """float32 `log p` of the top-k `[b, T, k]` and of the rest `[b, T]` (clamped)."""
  return (jax.lax.stop_gradient(topk_logprobs.astype(jnp.float32)),
          jax.lax.stop_gradient(jnp.maximum(rest_logprob.astype(jnp.float32), LOG_FLOOR)))


def sparse_forward_kl(student_logits: Array, topk_ids: Array, topk_logprobs: Array,
                      rest_logprob: Array) -> Array:
  """Per-token cross-entropy `-sum_topk p log q - p_rest log q_rest`.

  Args:
    student_logits: `[b, T, V]`.
    topk_ids: int `[b, T, k]`, the target's top-k ids.
    topk_logprobs: `[b, T, k]`, the target's log-probabilities of them (T=1).
    rest_logprob: `[b, T]`, the log of the target's mass outside them.

  Returns:
    float32 `[b, T]`.
  """
  logq_topk, logq_rest = student_log_probs(student_logits, topk_ids)
  logp_topk, logp_rest = _teacher(topk_logprobs, rest_logprob)
  return -(jnp.sum(jnp.exp(logp_topk) * logq_topk, axis=-1) + jnp.exp(logp_rest) * logq_rest)


def sparse_total_variation(student_logits: Array, topk_ids: Array, topk_logprobs: Array,
                           rest_logprob: Array) -> Array:
  """Per-token `sum_topk |p - q| / 2 + |p_rest - q_rest| / 2` (arguments as
  `sparse_forward_kl`); float32 `[b, T]`."""
  logq_topk, logq_rest = student_log_probs(student_logits, topk_ids)
  logp_topk, logp_rest = _teacher(topk_logprobs, rest_logprob)
  return 0.5 * (jnp.sum(jnp.abs(jnp.exp(logp_topk) - jnp.exp(logq_topk)), axis=-1)
                + jnp.abs(jnp.exp(logp_rest) - jnp.exp(logq_rest)))


def sparse_reverse_kl(student_logits: Array, topk_ids: Array, topk_logprobs: Array,
                      rest_logprob: Array) -> Array:
  """Per-token `sum_topk q (log q - log p) + q_rest (log q_rest - log p_rest)` (arguments
  as `sparse_forward_kl`); float32 `[b, T]`."""
  logq_topk, logq_rest = student_log_probs(student_logits, topk_ids)
  logp_topk, logp_rest = _teacher(topk_logprobs, rest_logprob)
  return (jnp.sum(jnp.exp(logq_topk) * (logq_topk - logp_topk), axis=-1)
          + jnp.exp(logq_rest) * (logq_rest - logp_rest))


# The teacher term of `LossConfig.distill_divergence` on stored signals.
SPARSE_DIVERGENCES: dict[str, Callable[[Array, Array, Array, Array], Array]] = {
    "forward_kl": sparse_forward_kl,
    "reverse_kl": sparse_reverse_kl,
    "total_variation": sparse_total_variation,
}


def signals_loss_terms(logits: Array, batch: Batch, cfg: LossConfig
                       ) -> tuple[Array, dict[str, Array]]:
  """`trainer.loss_terms` with the teacher term on the batch's stored signals.

  Args:
    logits: student logits `[b, T, V]`.
    batch: a signals batch (module docstring).
    cfg: the loss configuration (`distill_temperature` must be 1).

  Returns:
    As `trainer.loss_terms`.
  """
  distill = None
  if cfg.distill_weight > 0:
    distill = SPARSE_DIVERGENCES[cfg.distill_divergence](
        logits, batch["teacher_topk_ids"], batch["teacher_topk_logprobs"],
        batch["teacher_rest_logprob"])
  return weighted_loss_terms(logits, batch, cfg, distill)


def student_logits(model: T5Model | SharedEncoderModel, params: dict, batch: Batch,
                   dropout_rng: Array | None = None) -> Array:
  """Teacher-forced logits `[b, T, V]` of the student on a signals batch.

  A `SharedEncoderModel` reads the stored `encoder_hidden`, cast to its compute dtype,
  with the mask `encoder_input_tokens > 0` (the positions below each row's input
  length: the mask the target's encoder used); a `T5Model` encodes the tokens itself.
  """
  targets = batch["decoder_input_tokens"]
  if isinstance(model, SharedEncoderModel):
    hidden = batch["encoder_hidden"].astype(model.config.compute_dtype)
    mask = batch["encoder_input_tokens"] > 0
    return model.logits(params, hidden, mask, targets, dropout_rng=dropout_rng)
  return model.logits(params, batch["encoder_input_tokens"], targets, dropout_rng=dropout_rng)


def check_loss_config(cfg: LossConfig) -> None:
  """Raises ValueError unless `cfg` can be computed from stored signals (T=1 only)."""
  if cfg.distill_temperature != 1.0:
    raise ValueError(f"LossConfig.distill_temperature={cfg.distill_temperature}: the stored "
                     "signals are the target's log-probabilities at T=1, which fix no other "
                     "temperature; set LossConfig.distill_temperature = 1.0.")


def make_signals_train_step(model: T5Model | SharedEncoderModel,
                            optimizer: optax.GradientTransformation, loss_cfg: LossConfig
                            ) -> Callable[[TrainState, Batch, Array],
                                          tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng) -> (new state, metrics)` on signals batches.

  Only the student runs: the target's part is in the batch. The step donates `state`.
  Metrics are `trainer.loss_terms`' plus "grad_norm".

  Raises:
    ValueError: see `check_loss_config`.
  """
  check_loss_config(loss_cfg)

  def step(state: TrainState, batch: Batch, rng: Array):
    def loss_fn(params):
      logits = student_logits(model, params, batch, dropout_rng=rng)
      return signals_loss_terms(logits, batch, loss_cfg)

    return optimizer_step(state, optimizer, loss_fn)

  return jax.jit(step, donate_argnums=(0,))
