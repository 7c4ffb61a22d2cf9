"""Jitted train and eval steps: cross-entropy with loss weights, z-loss, label smoothing,
and word-level distillation to a teacher's logits computed inside the same step.

A batch is a dict of int32 arrays `encoder_input_tokens [b, L]`, `decoder_input_tokens
[b, T]`, `decoder_target_tokens [b, T]` and `decoder_loss_weights [b, T]` (the
`data.pipeline.get_batches` layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import gin
import jax
import jax.numpy as jnp
import optax
from flax import struct

from specdec_jax.models.t5 import T5Model

Array = jax.Array
Batch = dict[str, Array]


@struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position (which is `step`).

  Attributes:
    step: int32 `[]`, optimizer steps taken (= batches consumed).
    params: the model's parameter tree.
    opt_state: the optimizer's state.
  """

  step: Array
  params: dict
  opt_state: optax.OptState

  @classmethod
  def create(cls, params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    return cls(step=jnp.array(0, jnp.int32), params=params, opt_state=optimizer.init(params))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LossConfig:
  """How the training loss is built (hashable: a static argument of the jitted step).

  Attributes:
    label_smoothing: mass spread uniformly over the vocabulary in the label target.
    z_loss: coefficient of `log(Z)^2` (T5X's z-loss; keeps logits normalised).
    distill_weight: weight of the teacher term; the label term gets `1 - distill_weight`.
      0 disables distillation (then no teacher is needed).
    distill_temperature: temperature applied to both teacher and student logits in the
      teacher term (its gradient is scaled by the temperature squared, as in Hinton et al.).
  """

  label_smoothing: float = 0.0
  z_loss: float = 1e-4
  distill_weight: float = 0.0
  distill_temperature: float = 1.0

  def __post_init__(self):
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}.")
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}.")
    if self.distill_temperature <= 0:
      raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}.")


def token_cross_entropy(logits: Array, targets: Array, label_smoothing: float = 0.0) -> Array:
  """Per-token cross-entropy against (optionally smoothed) one-hot labels.

  Args:
    logits: `[b, T, V]`.
    targets: int `[b, T]`.
    label_smoothing: uniform mass in the label distribution.

  Returns:
    float32 `[b, T]`.
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  if label_smoothing == 0.0:
    return nll
  return (1.0 - label_smoothing) * nll - label_smoothing * jnp.mean(logp, axis=-1)


def soft_cross_entropy(student_logits: Array, teacher_logits: Array,
                       temperature: float = 1.0) -> Array:
  """Per-token `-sum_x p_teacher(x) log q_student(x)` at `temperature`, times temperature^2.

  Equals the KL divergence KL(p_teacher || q_student) plus the teacher's entropy, which
  does not depend on the student: the gradients are those of the KL.

  Args:
    student_logits: `[b, T, V]`.
    teacher_logits: `[b, T, V]` (treated as a constant).

  Returns:
    float32 `[b, T]`.
  """
  teacher = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32)
                           / temperature, axis=-1)
  logq = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  return -jnp.sum(teacher * logq, axis=-1) * temperature**2


def loss_terms(logits: Array, batch: Batch, cfg: LossConfig,
               teacher_logits: Array | None = None) -> tuple[Array, dict[str, Array]]:
  """The weighted-mean training loss and its parts.

  Args:
    logits: student logits `[b, T, V]`.
    batch: the batch (targets and loss weights are used).
    cfg: the loss configuration.
    teacher_logits: `[b, T, V]`, required iff `cfg.distill_weight > 0`.

  Returns:
    (scalar loss, {"loss", "label_loss", "distill_loss", "z_loss", "accuracy", "tokens"}),
    all means over weighted tokens except "tokens" (their count).
  """
  weights = batch["decoder_loss_weights"].astype(jnp.float32)
  targets = batch["decoder_target_tokens"]
  n = jnp.maximum(jnp.sum(weights), 1.0)

  def mean(per_token: Array) -> Array:
    return jnp.sum(per_token * weights) / n

  label = mean(token_cross_entropy(logits, targets, cfg.label_smoothing))
  if cfg.distill_weight > 0:
    if teacher_logits is None:
      raise ValueError("LossConfig.distill_weight > 0 needs teacher logits; pass a teacher.")
    distill = mean(soft_cross_entropy(logits, teacher_logits, cfg.distill_temperature))
  else:
    distill = jnp.zeros((), jnp.float32)
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  z = mean(jnp.square(log_z))
  total = (1.0 - cfg.distill_weight) * label + cfg.distill_weight * distill + cfg.z_loss * z
  accuracy = mean((jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32))
  return total, {"loss": total, "label_loss": label, "distill_loss": distill, "z_loss": z,
                 "accuracy": accuracy, "tokens": jnp.sum(weights)}


def make_train_step(model: T5Model, optimizer: optax.GradientTransformation,
                    loss_cfg: LossConfig, teacher_model: T5Model | None = None
                    ) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng, teacher_params) -> (new state, metrics)`.

  The step donates `state`: its arrays are invalid after the call.

  `teacher_params` is None without distillation; it is an argument (not a
  constant folded into the program) so the teacher's weights are not copied into
  the compiled step.
  """
  if (loss_cfg.distill_weight > 0) != (teacher_model is not None):
    raise ValueError("Pass a teacher_model exactly when LossConfig.distill_weight > 0 "
                     f"(distill_weight={loss_cfg.distill_weight}, teacher given: "
                     f"{teacher_model is not None}).")

  def step(state: TrainState, batch: Batch, rng: Array, teacher_params: dict | None):
    teacher_logits = None
    if teacher_model is not None:
      teacher_logits = teacher_model.logits(teacher_params, batch["encoder_input_tokens"],
                                            batch["decoder_input_tokens"])

    def loss_fn(params):
      logits = model.logits(params, batch["encoder_input_tokens"],
                            batch["decoder_input_tokens"], dropout_rng=rng)
      return loss_terms(logits, batch, loss_cfg, teacher_logits)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.jit(step, donate_argnums=(0,))


def make_eval_step(model: T5Model) -> Callable[[dict, Batch], dict[str, Array]]:
  """A jitted `(params, batch) -> {"loss_sum", "tokens"}` (plain cross-entropy, no dropout)."""

  def step(params: dict, batch: Batch) -> dict[str, Array]:
    logits = model.logits(params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    nll = token_cross_entropy(logits, batch["decoder_target_tokens"])
    return {"loss_sum": jnp.sum(nll * weights), "tokens": jnp.sum(weights)}

  return jax.jit(step)
