"""Optimizers and learning-rate schedules for training (optax)."""

from __future__ import annotations

from collections.abc import Sequence

import gin
import jax
import jax.numpy as jnp
import optax

_SCHEDULES = ("rsqrt", "cosine", "constant")
_OPTIMIZERS = ("adamw", "adafactor")


@gin.configurable
def learning_rate_schedule(total_steps: int, *, peak_lr: float = 1e-3, warmup_steps: int = 1000,
                           kind: str = "cosine", final_fraction: float = 0.1,
                           drop_steps: Sequence[int] = (), drop_factor: float = 0.3
                           ) -> optax.Schedule:
  """Linear warmup to `peak_lr`, then decay, times a step drop at each of `drop_steps`.

  Args:
    total_steps: the run's number of steps (the cosine decays over it).
    peak_lr: learning rate at the end of warmup.
    warmup_steps: linear warmup steps from 0.
    kind: "cosine" (to `final_fraction * peak_lr` at `total_steps`), "rsqrt"
      (`peak_lr * sqrt(warmup_steps / step)`, T5's schedule) or "constant".
    final_fraction: the cosine's final learning rate as a fraction of the peak.
    drop_steps: steps from which the learning rate is multiplied by `drop_factor`
      (once per step passed): a manual drop, e.g. when the loss plateaus mid-run.
    drop_factor: the factor of each drop, in (0, 1].

  Returns:
    step -> learning rate.
  """
  if kind not in _SCHEDULES:
    raise ValueError(f"kind={kind!r}: use one of {_SCHEDULES}.")
  if warmup_steps < 0 or total_steps < 1:
    raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps}, "
                     f"{total_steps}.")
  drop_steps = tuple(int(s) for s in drop_steps)
  if any(s < 1 for s in drop_steps) or list(drop_steps) != sorted(set(drop_steps)):
    raise ValueError(f"drop_steps={drop_steps}: use increasing steps >= 1.")
  if not 0 < drop_factor <= 1:
    raise ValueError(f"drop_factor={drop_factor}: use a factor in (0, 1].")
  warmup = max(warmup_steps, 1)

  def schedule(step: jax.Array) -> jax.Array:
    step = jnp.asarray(step, jnp.float32)
    ramp = jnp.minimum(1.0, (step + 1) / warmup)
    if kind == "constant":
      decay = 1.0
    elif kind == "rsqrt":
      decay = jnp.sqrt(warmup / jnp.maximum(step + 1, warmup))
    else:
      frac = jnp.clip((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0, 1.0)
      decay = final_fraction + (1 - final_fraction) * 0.5 * (1 + jnp.cos(jnp.pi * frac))
    drops = sum((step >= s).astype(jnp.float32) for s in drop_steps) if drop_steps else 0.0
    return peak_lr * ramp * decay * drop_factor**drops

  return schedule


@gin.configurable
def make_optimizer(schedule: optax.Schedule, *, kind: str = "adamw", weight_decay: float = 0.01,
                   b1: float = 0.9, b2: float = 0.98, clip_norm: float = 1.0,
                   decay_rate: float = 0.8, multiply_by_parameter_scale: bool = True
                   ) -> optax.GradientTransformation:
  """The optimizer: global-norm gradient clipping, then AdamW or Adafactor.

  T5's initialisation gives matrices very different scales (embeddings std 1,
  query kernels std (d_model * d_kv)^-0.5), and AdamW moves every weight by about
  the learning rate whatever its scale. Adafactor as T5X configures it scales each
  update by the parameter's RMS (`multiply_by_parameter_scale`), so the learning
  rate is relative (1e-2 is T5's).

  Args:
    schedule: the learning-rate schedule.
    kind: "adamw" or "adafactor" (factored second moments, T5X's default).
    weight_decay: decoupled weight decay (AdamW; applied to matrices only).
    b1: first-moment decay (AdamW).
    b2: second-moment decay (AdamW).
    clip_norm: global gradient norm clip; 0 disables (Adafactor clips its updates
      by RMS itself).
    decay_rate: Adafactor's second-moment decay exponent (T5X: 0.8).
    multiply_by_parameter_scale: Adafactor's relative step size (T5X: True).
  """
  if kind not in _OPTIMIZERS:
    raise ValueError(f"kind={kind!r}: use one of {_OPTIMIZERS}.")
  if kind == "adamw":
    opt = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay,
                      mask=lambda params: jax.tree.map(lambda x: x.ndim > 1, params))
  else:
    opt = optax.adafactor(schedule, decay_rate=decay_rate, clipping_threshold=1.0,
                          multiply_by_parameter_scale=multiply_by_parameter_scale)
  return optax.chain(optax.clip_by_global_norm(clip_norm), opt) if clip_norm > 0 else opt
