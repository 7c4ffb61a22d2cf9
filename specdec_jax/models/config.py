"""What every model family's config shares: dtypes by name, checked; `replace`."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp


def check_dtype(name: str, value: Any) -> None:
  """Raises ValueError naming `name` unless `value` names a dtype (e.g. 'float32')."""
  try:
    jnp.dtype(value)
  except TypeError as e:
    raise ValueError(f"{name}={value!r} is not a dtype; use e.g. 'float32' or "
                     "'bfloat16'.") from e


class ModelConfig:
  """What every model config shares: its dtypes by name (`dtype` for compute,
  `param_dtype` for storage, both fields of the dataclass), and `replace`."""

  dtype: str
  param_dtype: str

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def parameter_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  def replace(self, **kwargs: Any) -> Any:
    """A copy with `kwargs` changed (checked again by the dataclass)."""
    return dataclasses.replace(self, **kwargs)
