"""Jitted train and eval steps: cross-entropy with loss weights, z-loss, label smoothing,
and token-level distillation to a teacher's logits computed inside the same step.

The student is a `T5Model`, or a `SharedEncoderModel` that reads the teacher's
encoder outputs (then the teacher is required even without a distillation term,
and its encoder runs once per step for both).

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

from specdec_jax.models.t5 import SharedEncoderModel, T5Model

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
    distill_divergence: the teacher term per token (`DIVERGENCES`): "forward_kl"
      (cross-entropy to the teacher's distribution: KL(p || q) up to a constant),
      "reverse_kl" (KL(q || p)) or "total_variation" (sum |p - q| / 2 = 1 - beta,
      the speculative acceptance rate's complement).
  """

  label_smoothing: float = 0.0
  z_loss: float = 1e-4
  distill_weight: float = 0.0
  distill_temperature: float = 1.0
  distill_divergence: str = "forward_kl"

  def __post_init__(self):
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}.")
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}.")
    if self.distill_temperature <= 0:
      raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}.")
    if self.distill_divergence not in DIVERGENCES:
      raise ValueError(f"distill_divergence={self.distill_divergence!r} is unknown; use one "
                       f"of {sorted(DIVERGENCES)}.")


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


def reverse_kl(student_logits: Array, teacher_logits: Array,
               temperature: float = 1.0) -> Array:
  """Per-token KL(q_student || p_teacher) at `temperature`, times temperature^2.

  Args:
    student_logits: `[b, T, V]`.
    teacher_logits: `[b, T, V]` (treated as a constant).

  Returns:
    float32 `[b, T]`.
  """
  logp = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32)
                            / temperature, axis=-1)
  logq = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  return jnp.sum(jnp.exp(logq) * (logq - logp), axis=-1) * temperature**2


def total_variation(student_logits: Array, teacher_logits: Array,
                    temperature: float = 1.0) -> Array:
  """Per-token total variation `sum_x |p(x) - q(x)| / 2` at `temperature`.

  It is 1 - beta, beta = sum_x min(p, q) being the probability that speculative
  sampling accepts a proposal drawn from q (Leviathan et al., Def. 3.1).

  Args:
    student_logits: `[b, T, V]`.
    teacher_logits: `[b, T, V]` (treated as a constant).

  Returns:
    float32 `[b, T]`.
  """
  p = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32)
                     / temperature, axis=-1)
  q = jax.nn.softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


# The teacher term of `LossConfig.distill_divergence`.
DIVERGENCES: dict[str, Callable[[Array, Array, float], Array]] = {
    "forward_kl": soft_cross_entropy,
    "reverse_kl": reverse_kl,
    "total_variation": total_variation,
}


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
  distill = None
  if cfg.distill_weight > 0:
    if teacher_logits is None:
      raise ValueError("LossConfig.distill_weight > 0 needs teacher logits; pass a teacher.")
    divergence = DIVERGENCES[cfg.distill_divergence]
    distill = divergence(logits, teacher_logits, cfg.distill_temperature)
  return weighted_loss_terms(logits, batch, cfg, distill)


def weighted_loss_terms(logits: Array, batch: Batch, cfg: LossConfig,
                        distill: Array | None) -> tuple[Array, dict[str, Array]]:
  """`loss_terms` from a per-token teacher term computed elsewhere.

  Args:
    logits: student logits `[b, T, V]`.
    batch: the batch (targets and loss weights are used).
    cfg: the loss configuration.
    distill: float32 `[b, T]`, the teacher term per token; None iff
      `cfg.distill_weight == 0`.

  Returns:
    As `loss_terms`.
  """
  weights = batch["decoder_loss_weights"].astype(jnp.float32)
  targets = batch["decoder_target_tokens"]
  n = jnp.maximum(jnp.sum(weights), 1.0)

  def mean(per_token: Array) -> Array:
    return jnp.sum(per_token * weights) / n

  label = mean(token_cross_entropy(logits, targets, cfg.label_smoothing))
  distill = jnp.zeros((), jnp.float32) if distill is None else mean(distill)
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  z = mean(jnp.square(log_z))
  total = (1.0 - cfg.distill_weight) * label + cfg.distill_weight * distill + cfg.z_loss * z
  accuracy = mean((jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32))
  return total, {"loss": total, "label_loss": label, "distill_loss": distill, "z_loss": z,
                 "accuracy": accuracy, "tokens": jnp.sum(weights)}


def _check_teacher(model: T5Model | SharedEncoderModel, loss_cfg: LossConfig,
                   teacher_model: T5Model | None) -> None:
  shared = isinstance(model, SharedEncoderModel)
  if shared and teacher_model is None:
    raise ValueError("A SharedEncoderModel student reads the teacher's encoder: pass the "
                     "teacher_model (TrainConfig.teacher_dir).")
  if not shared and (loss_cfg.distill_weight > 0) != (teacher_model is not None):
    raise ValueError("Pass a teacher_model exactly when LossConfig.distill_weight > 0 "
                     f"(distill_weight={loss_cfg.distill_weight}, teacher given: "
                     f"{teacher_model is not None}).")
  if shared and model.encoder_d_model != teacher_model.config.d_model:
    raise ValueError(f"The student reads encoder outputs {model.encoder_d_model} wide, the "
                     f"teacher's d_model is {teacher_model.config.d_model}: set the student's "
                     "encoder_d_model to the teacher's d_model.")


def _forward(model: T5Model | SharedEncoderModel, params: dict, batch: Batch,
             teacher_model: T5Model | None, teacher_params: dict | None, *,
             teacher_logits: bool, dropout_rng: Array | None = None
             ) -> tuple[Array, Array | None]:
  """Student logits `[b, T, V]` and, if asked, the teacher's (one teacher encoder pass)."""
  inputs, targets = batch["encoder_input_tokens"], batch["decoder_input_tokens"]
  if teacher_model is None:
    return model.logits(params, inputs, targets, dropout_rng=dropout_rng), None
  encoded = jax.lax.stop_gradient(teacher_model.encode(teacher_params, inputs))
  teacher = (jax.lax.stop_gradient(teacher_model.decode_logits(teacher_params, encoded, targets))
             if teacher_logits else None)
  if isinstance(model, SharedEncoderModel):
    student = model.logits(params, encoded.hidden, encoded.mask, targets, dropout_rng=dropout_rng)
  else:
    student = model.logits(params, inputs, targets, dropout_rng=dropout_rng)
  return student, teacher


def make_train_step(model: T5Model | SharedEncoderModel, optimizer: optax.GradientTransformation,
                    loss_cfg: LossConfig, teacher_model: T5Model | None = None
                    ) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
  """A jitted `(state, batch, rng, teacher_params) -> (new state, metrics)`.

  The step donates `state`: its arrays are invalid after the call.

  `teacher_params` is None without a teacher; it is an argument (not a
  constant folded into the program) so the teacher's weights are not copied into
  the compiled step.
  """
  _check_teacher(model, loss_cfg, teacher_model)
  distill = loss_cfg.distill_weight > 0

  def step(state: TrainState, batch: Batch, rng: Array, teacher_params: dict | None):
    def loss_fn(params):
      logits, teacher_logits = _forward(model, params, batch, teacher_model, teacher_params,
                                        teacher_logits=distill, dropout_rng=rng)
      return loss_terms(logits, batch, loss_cfg, teacher_logits)

    return optimizer_step(state, optimizer, loss_fn)

  return jax.jit(step, donate_argnums=(0,))


def optimizer_step(state: TrainState, optimizer: optax.GradientTransformation,
                   loss_fn: Callable[[dict], tuple[Array, dict[str, Array]]]
                   ) -> tuple[TrainState, dict[str, Array]]:
  """One update of `state.params` down `loss_fn`'s gradient (traced inside a train step).

  Returns:
    The new state and `loss_fn`'s metrics plus "grad_norm".
  """
  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics["grad_norm"] = optax.tree.norm(grads)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def make_eval_step(model: T5Model | SharedEncoderModel, teacher_model: T5Model | None = None
                   ) -> Callable[..., dict[str, Array]]:
  """A jitted `(params, batch, teacher_params=None) -> {"loss_sum", "tokens"}` (plain
  cross-entropy, no dropout; the teacher only for a `SharedEncoderModel`)."""
  if isinstance(model, SharedEncoderModel) != (teacher_model is not None):
    raise ValueError("make_eval_step takes a teacher_model exactly for a SharedEncoderModel "
                     "(whose encoder is the teacher's).")

  def step(params: dict, batch: Batch, teacher_params: dict | None = None) -> dict[str, Array]:
    logits, _ = _forward(model, params, batch, teacher_model, teacher_params,
                         teacher_logits=False)
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    nll = token_cross_entropy(logits, batch["decoder_target_tokens"])
    return {"loss_sum": jnp.sum(nll * weights), "tokens": jnp.sum(weights)}

  return jax.jit(step)
