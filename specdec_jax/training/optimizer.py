"""The learning-rate schedule and the optimizer (optax), each a config the command builds.

The command binds them in gin (`LearningRate.peak_lr = 1e-3`, `Optimizer.kind =
"adafactor"`), builds them where it assembles the run and passes them down; the
training driver turns them into optax objects once it knows the run's length.
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp
import optax

_SCHEDULES = ("rsqrt", "cosine", "constant")
_OPTIMIZERS = ("adamw", "adafactor")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LearningRate:
  """Linear warmup to `peak_lr`, then decay, times a step drop at each of `drop_steps`.

  Attributes:
    peak_lr: learning rate at the end of warmup.
    warmup_steps: linear warmup steps from 0.
    kind: "cosine" (to `final_fraction * peak_lr` at the run's last step), "rsqrt"
      (`peak_lr * sqrt(warmup_steps / step)`, T5's schedule) or "constant".
    final_fraction: the cosine's final learning rate as a fraction of the peak.
    drop_steps: steps from which the learning rate is multiplied by `drop_factor`
      (once per step passed): a manual drop, e.g. when the loss plateaus mid-run.
    drop_factor: the factor of each drop, in (0, 1].

  Raises:
    ValueError: a setting out of range, named.
  """

  peak_lr: float = 1e-3
  warmup_steps: int = 1000
  kind: str = "cosine"
  final_fraction: float = 0.1
  drop_steps: tuple[int, ...] = ()
  drop_factor: float = 0.3

  def __post_init__(self):
    if self.kind not in _SCHEDULES:
      raise ValueError(f"LearningRate.kind={self.kind!r}: use one of {_SCHEDULES}.")
    if self.warmup_steps < 0:
      raise ValueError(f"LearningRate.warmup_steps={self.warmup_steps}: use steps >= 0.")
    drops = tuple(int(s) for s in self.drop_steps)
    if any(s < 1 for s in drops) or list(drops) != sorted(set(drops)):
      raise ValueError(f"LearningRate.drop_steps={drops}: use increasing steps >= 1.")
    object.__setattr__(self, "drop_steps", drops)
    if not 0 < self.drop_factor <= 1:
      raise ValueError(f"LearningRate.drop_factor={self.drop_factor}: use a factor in (0, 1].")

  def schedule(self, total_steps: int) -> optax.Schedule:
    """step -> learning rate, for a run of `total_steps` (the cosine decays over it)."""
    if total_steps < 1:
      raise ValueError(f"total_steps={total_steps}: a run needs at least 1 step.")
    warmup, drop_steps = max(self.warmup_steps, 1), self.drop_steps

    def schedule(step: jax.Array) -> jax.Array:
      step = jnp.asarray(step, jnp.float32)
      ramp = jnp.minimum(1.0, (step + 1) / warmup)
      if self.kind == "constant":
        decay = 1.0
      elif self.kind == "rsqrt":
        decay = jnp.sqrt(warmup / jnp.maximum(step + 1, warmup))
      else:
        frac = jnp.clip((step - self.warmup_steps) / max(total_steps - self.warmup_steps, 1),
                        0.0, 1.0)
        decay = self.final_fraction + (1 - self.final_fraction) * 0.5 * (
            1 + jnp.cos(jnp.pi * frac))
      drops = sum((step >= s).astype(jnp.float32) for s in drop_steps) if drop_steps else 0.0
      return self.peak_lr * ramp * decay * self.drop_factor**drops

    return schedule


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Optimizer:
  """Global-norm gradient clipping, then AdamW or Adafactor.

  T5's initialisation gives matrices very different scales (embeddings std 1,
  query kernels std (d_model * d_kv)^-0.5), and AdamW moves every weight by about
  the learning rate whatever its scale. Adafactor as T5X configures it scales each
  update by the parameter's RMS (`multiply_by_parameter_scale`), so the learning
  rate is relative (1e-2 is T5's).

  Attributes:
    kind: "adamw" or "adafactor" (factored second moments, T5X's default).
    weight_decay: decoupled weight decay (AdamW; applied to matrices only).
    b1: first-moment decay (AdamW).
    b2: second-moment decay (AdamW).
    clip_norm: global gradient norm clip; 0 disables (Adafactor clips its updates
      by RMS itself).
    decay_rate: Adafactor's second-moment decay exponent (T5X: 0.8).
    multiply_by_parameter_scale: Adafactor's relative step size (T5X: True).
  """

  kind: str = "adamw"
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.98
  clip_norm: float = 1.0
  decay_rate: float = 0.8
  multiply_by_parameter_scale: bool = True

  def __post_init__(self):
    if self.kind not in _OPTIMIZERS:
      raise ValueError(f"Optimizer.kind={self.kind!r}: use one of {_OPTIMIZERS}.")

  def build(self, schedule: optax.Schedule) -> optax.GradientTransformation:
    """The optax transformation stepping at `schedule`'s learning rate."""
    if self.kind == "adamw":
      opt = optax.adamw(schedule, b1=self.b1, b2=self.b2, weight_decay=self.weight_decay,
                        mask=lambda params: jax.tree.map(lambda x: x.ndim > 1, params))
    else:
      opt = optax.adafactor(schedule, decay_rate=self.decay_rate, clipping_threshold=1.0,
                            multiply_by_parameter_scale=self.multiply_by_parameter_scale)
    if self.clip_norm > 0:
      return optax.chain(optax.clip_by_global_norm(self.clip_norm), opt)
    return opt
