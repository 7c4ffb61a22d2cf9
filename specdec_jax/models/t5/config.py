"""T5 architecture configuration and the named configs of the public checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax.models.config import ModelConfig, check_dtype

_ACTIVATIONS = ("relu", "gated-gelu")


@dataclasses.dataclass(frozen=True)
class T5Config(ModelConfig):
  """Hyper-parameters of a T5 encoder-decoder.

  Covers T5 v1.0 (`feed_forward_proj="relu"`, logits tied to the embedding and
  scaled by d_model^-0.5) and T5.1.1 / Flan-T5 (`"gated-gelu"`, separate
  `logits_dense`). Field names follow HuggingFace's `T5Config` so that a
  `config.json` maps onto this class one to one.
  """

  vocab_size: int = 32128
  d_model: int = 512
  d_kv: int = 64
  d_ff: int = 2048
  num_layers: int = 6
  num_decoder_layers: int | None = None
  num_heads: int = 8
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-6
  feed_forward_proj: str = "relu"
  tie_word_embeddings: bool = True
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.num_decoder_layers is None:  # HF's convention: as many as the encoder.
      object.__setattr__(self, "num_decoder_layers", self.num_layers)
    if self.feed_forward_proj not in _ACTIVATIONS:
      raise ValueError(
          f"feed_forward_proj={self.feed_forward_proj!r} is not supported; "
          f"use one of {_ACTIVATIONS}.")
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                 "relative_attention_num_buckets", "relative_attention_max_distance"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    for name in ("dtype", "param_dtype"):
      check_dtype(name, getattr(self, name))

  @property
  def gated(self) -> bool:
    return self.feed_forward_proj == "gated-gelu"


  def to_hf_dict(self) -> dict[str, Any]:
    """The `config.json` contents HuggingFace's `T5ForConditionalGeneration` reads."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
         if f.name not in ("dtype", "param_dtype")}
    d.update(
        architectures=["T5ForConditionalGeneration"],
        model_type="t5",
        is_encoder_decoder=True,
        dense_act_fn="gelu_new" if self.gated else "relu",
        is_gated_act=self.gated,
        initializer_factor=1.0,
        use_cache=True,
    )
    return d

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> T5Config:
    """Reads a HuggingFace T5 `config.json` dict (unknown keys are ignored)."""
    if d.get("model_type", "t5") != "t5":
      raise ValueError(f"config.json has model_type={d.get('model_type')!r}; only 't5' "
                       "(T5 v1.0, T5.1.1, Flan-T5) checkpoints are supported.")
    proj = d.get("feed_forward_proj", "relu")
    if proj == "gated-gelu_new":
      proj = "gated-gelu"
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in names}
    kwargs["feed_forward_proj"] = proj
    # transformers >= 5 writes `tie_word_embeddings: true` for every T5 and says
    # whether logits are scaled (v1.0) or not (T5.1.1) in `scale_decoder_outputs`.
    kwargs["tie_word_embeddings"] = bool(
        d.get("scale_decoder_outputs", d.get("tie_word_embeddings", True)))
    kwargs.update(overrides)
    return cls(**kwargs)


def _v1_0(d_model, d_ff, layers, heads, d_kv=64):
  return T5Config(d_model=d_model, d_ff=d_ff, num_layers=layers, num_heads=heads,
                  d_kv=d_kv, feed_forward_proj="relu", tie_word_embeddings=True)


def _v1_1(d_model, d_ff, layers, heads, d_kv=64):
  return T5Config(d_model=d_model, d_ff=d_ff, num_layers=layers, num_heads=heads,
                  d_kv=d_kv, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                  dropout_rate=0.0)


_V1_1_SIZES = {
    "small": (512, 1024, 8, 6),
    "base": (768, 2048, 12, 12),
    "large": (1024, 2816, 24, 16),
    "xl": (2048, 5120, 24, 32),
    "xxl": (4096, 10240, 24, 64),
}

NAMED_CONFIGS: dict[str, T5Config] = {
    "t5-small": _v1_0(512, 2048, 6, 8),
    "t5-base": _v1_0(768, 3072, 12, 12),
    "t5-large": _v1_0(1024, 4096, 24, 16),
    "t5-3b": _v1_0(1024, 16384, 24, 32, d_kv=128),
    "t5-11b": _v1_0(1024, 65536, 24, 128, d_kv=128),
    **{f"t5-v1_1-{k}": _v1_1(*v) for k, v in _V1_1_SIZES.items()},
    **{f"flan-t5-{k}": _v1_1(*v) for k, v in _V1_1_SIZES.items()},
    # Small configs for tests: one per family.
    "test-v1_0": T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                          num_heads=4, relative_attention_num_buckets=8,
                          relative_attention_max_distance=20, dropout_rate=0.0),
    "test-v1_1": T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                          num_decoder_layers=3, num_heads=4,
                          relative_attention_num_buckets=8,
                          relative_attention_max_distance=20, dropout_rate=0.0,
                          feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def get_config(name: str, **overrides: Any) -> T5Config:
  """Returns the named config, with `overrides` applied (e.g. `vocab_size=8000`)."""
  if name not in NAMED_CONFIGS:
    raise ValueError(f"Unknown T5 config {name!r}; known: {sorted(NAMED_CONFIGS)}.")
  return NAMED_CONFIGS[name].replace(**overrides)
