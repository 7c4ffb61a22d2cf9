"""On-policy distillation (DistillSpec, Zhou et al. 2023): the draft's own samples, scored
by the target.

Off-policy training (`sparse_distill`) fits the draft to the target along the target's
outputs. Here each step first samples, for every input of the batch, a continuation
from the student itself (T = 1, the speculative loop's own `baseline.decode_context`
over the student as a `SharedEncoderScorer`, with no gradient through the draw), then
runs the target's decoder teacher-forced along those samples and moves the student
towards the target's full distribution at every sampled position
(`LossConfig.distill_divergence`: forward KL, reverse KL or total variation, dense over
the vocabulary). There is no label term: the samples are the student's, not the target's.

The step reads a signals batch (`signals_source`) for its inputs only: the input
tokens, and the target's encoder outputs stored in float16 (`encoder_hidden [b, L, d]`),
which the student reads as a shared-encoder draft and from which the target's
cross-attention keys/values are projected (its encoder is not run). The stored outputs
and their top-k are not read; the batch's decoder length `T` caps the samples' length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from specdec_jax.decoding import baseline
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.t5 import EncodedInputs, SharedEncoderModel, SharedEncoderScorer, T5Model
from specdec_jax.training.trainer import (
    DIVERGENCES,
    Batch,
    LossConfig,
    TrainState,
    optimizer_step,
    weighted_loss_terms,
)

Array = jax.Array


def student_samples(model: SharedEncoderModel, params: dict, hidden: Array, mask: Array,
                    rng: Array, *, length: int) -> Batch:
  """Continuations sampled from the student at T = 1, as a teacher-forcing batch.

  Args:
    model: the student.
    params: its parameters (no gradient flows through the draw).
    hidden: the target's encoder outputs `[b, L, encoder_d_model]`.
    mask: bool `[b, L]`, the real input positions.
    rng: PRNG key of the draw.
    length: the most tokens sampled per row (`T`).

  Returns:
    `decoder_input_tokens` (the samples shifted right behind the start token),
    `decoder_target_tokens` (the samples, EOS included, padding after it) and
    `decoder_loss_weights` (1 up to and including EOS), all int32 `[b, T]`.
  """
  cfg = model.config
  scorer = SharedEncoderScorer(model, jax.lax.stop_gradient(params))
  context = scorer.encode(None, EncodedInputs((), (), mask, hidden))
  out = baseline.decode_context(scorer, context, rng, max_decode_len=length,
                                warp=Warp(temperature=1.0), eos_id=cfg.eos_token_id)
  targets = out.sequences
  start = jnp.full((targets.shape[0], 1), cfg.decoder_start_token_id, targets.dtype)
  weights = (jnp.arange(length)[None] < out.lengths[:, None]).astype(jnp.int32)
  return {"decoder_input_tokens": jnp.concatenate([start, targets[:, :-1]], axis=1),
          "decoder_target_tokens": targets, "decoder_loss_weights": weights}


def make_on_policy_train_step(model: SharedEncoderModel, teacher: T5Model,
                              optimizer: optax.GradientTransformation, loss_cfg: LossConfig
                              ) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng, teacher_params) -> (new state, metrics)`.

  `batch` is a signals batch (module docstring). The loss is `loss_cfg`'s teacher term
  alone (its `distill_weight` is taken as 1; `z_loss` kept) over the student's samples;
  "label_loss" in the metrics is the student's cross-entropy on its own samples, and
  "tokens" their count. The step donates `state`.

  Raises:
    ValueError: if the student does not read `teacher`'s encoder outputs, or
      `loss_cfg.distill_temperature` is not 1 (the samples are drawn at T = 1).
  """
  if not isinstance(model, SharedEncoderModel):
    raise ValueError("On-policy distillation trains a shared-encoder draft (it reads the "
                     "stored encoder outputs): set TrainConfig.student='shared_encoder'.")
  if model.encoder_d_model != teacher.config.d_model:
    raise ValueError(f"The student reads encoder outputs {model.encoder_d_model} wide, the "
                     f"teacher's d_model is {teacher.config.d_model}: train against the "
                     "target whose encoder it reads.")
  if loss_cfg.distill_temperature != 1.0:
    raise ValueError(f"LossConfig.distill_temperature={loss_cfg.distill_temperature}: "
                     "on-policy samples are drawn at T=1; set it to 1.0.")
  cfg = dataclasses.replace(loss_cfg, distill_weight=1.0)
  divergence = DIVERGENCES[cfg.distill_divergence]

  def step(state: TrainState, batch: Batch, rng: Array, teacher_params: dict):
    hidden = batch["encoder_hidden"].astype(model.config.compute_dtype)
    mask = batch["encoder_input_tokens"] > 0
    sample_rng, dropout_rng = jax.random.split(rng)
    samples = student_samples(model, state.params, hidden, mask, sample_rng,
                              length=batch["decoder_target_tokens"].shape[1])
    tokens = samples["decoder_input_tokens"]
    encoded = teacher.encoded_from_outputs(teacher_params, hidden, mask)
    teacher_logits = jax.lax.stop_gradient(
        teacher.decode_logits(teacher_params, encoded, tokens))

    def loss_fn(params):
      logits = model.logits(params, hidden, mask, tokens, dropout_rng=dropout_rng)
      return weighted_loss_terms(logits, samples, cfg, divergence(logits, teacher_logits, 1.0))

    return optimizer_step(state, optimizer, loss_fn)

  return jax.jit(step, donate_argnums=(0,))
