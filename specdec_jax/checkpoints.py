"""HuggingFace T5 checkpoints (config.json + safetensors) <-> our parameter tree.

A directory written by `T5ForConditionalGeneration.save_pretrained` loads into
the T5X-named tree of `specdec_jax.models.Transformer`; `save_hf_checkpoint`
writes the reverse, which the reference implementation loads unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from specdec_jax.models.config import T5Config
from specdec_jax.models.t5 import T5Model

_CONFIG = "config.json"
_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
# Copies of `shared.weight` that HF may or may not write; never needed.
_TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")

_ATTENTION = {"query": "q", "key": "k", "value": "v", "out": "o"}


def _mlp_names(cfg: T5Config) -> tuple[str, ...]:
  return ("wi_0", "wi_1", "wo") if cfg.gated else ("wi", "wo")


def parameter_names(cfg: T5Config) -> Iterator[tuple[tuple[str, ...], str, bool]]:
  """Yields (our path, HF name, transposed) for every parameter of `cfg`.

  `transposed` is True where HF stores `[out, in]` (torch Linear) and we store
  `[in, out]`, and for the relative bias (`[buckets, heads]` vs `[heads, buckets]`).
  """
  yield ("token_embedder", "embedding"), "shared.weight", False
  for stack, n_layers in (("encoder", cfg.num_layers), ("decoder", cfg.n_decoder_layers)):
    yield ((stack, "relpos_bias", "rel_embedding"),
           f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True)
    norm = "encoder_norm" if stack == "encoder" else "decoder_norm"
    yield (stack, norm, "scale"), f"{stack}.final_layer_norm.weight", False
    if stack == "encoder":
      blocks = (("pre_attention_layer_norm", "attention", "SelfAttention"),)
    else:
      blocks = (("pre_self_attention_layer_norm", "self_attention", "SelfAttention"),
                ("pre_cross_attention_layer_norm", "encoder_decoder_attention",
                 "EncDecAttention"))
    for i in range(n_layers):
      ours, hf = (stack, f"layers_{i}"), f"{stack}.block.{i}.layer"
      for j, (norm_name, attn, hf_attn) in enumerate(blocks):
        yield ours + (norm_name, "scale"), f"{hf}.{j}.layer_norm.weight", False
        for proj, hf_proj in _ATTENTION.items():
          yield ours + (attn, proj, "kernel"), f"{hf}.{j}.{hf_attn}.{hf_proj}.weight", True
      j = len(blocks)
      yield ours + ("pre_mlp_layer_norm", "scale"), f"{hf}.{j}.layer_norm.weight", False
      for w in _mlp_names(cfg):
        yield ours + ("mlp", w, "kernel"), f"{hf}.{j}.DenseReluDense.{w}.weight", True
  if not cfg.tie_word_embeddings:
    yield ("decoder", "logits_dense", "kernel"), "lm_head.weight", True


def _read_config(path: str) -> dict:
  config_path = os.path.join(path, _CONFIG)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(
        f"checkpoint_dir={path!r} has no {_CONFIG}; pass a directory written by "
        "T5ForConditionalGeneration.save_pretrained (config.json + model.safetensors).")
  with open(config_path) as f:
    d = json.load(f)
  archs = d.get("architectures") or ["T5ForConditionalGeneration"]
  if not any(a.startswith("T5") for a in archs) or d.get("model_type", "t5") != "t5":
    raise ValueError(f"{config_path}: architecture {archs} / model_type "
                     f"{d.get('model_type')!r} is not a T5 encoder-decoder; only T5 v1.0, "
                     "T5.1.1 and Flan-T5 checkpoints are supported.")
  return d


def _read_tensors(path: str) -> dict[str, np.ndarray]:
  single, index = os.path.join(path, _WEIGHTS), os.path.join(path, _INDEX)
  if os.path.isfile(single):
    return load_file(single)
  if os.path.isfile(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for name in files:
      tensors.update(load_file(os.path.join(path, name)))
    return tensors
  raise FileNotFoundError(
      f"checkpoint_dir={path!r} has neither {_WEIGHTS} nor {_INDEX}. Re-save it with "
      "save_pretrained(..., safe_serialization=True) to get safetensors.")


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def load_hf_checkpoint(path: str, **config_overrides) -> tuple[T5Config, dict]:
  """Loads a HuggingFace T5 directory.

  Args:
    path: directory with `config.json` and `model.safetensors` (or a sharded
      `model.safetensors.index.json`).
    **config_overrides: e.g. `dtype="bfloat16"`, `dropout_rate=0.0`.

  Returns:
    The config and our parameter tree (numpy arrays, in `param_dtype`).

  Raises:
    FileNotFoundError: a file is missing.
    ValueError: an unknown architecture, or a missing or mis-shaped parameter
      (the message names it).
  """
  cfg = T5Config.from_hf_dict(_read_config(path), **config_overrides)
  tensors = _read_tensors(path)
  expected_shapes = jax.eval_shape(lambda: T5Model(cfg).init_params(jax.random.PRNGKey(0)))
  params: dict = {}
  used = set()
  for ours, hf_name, transposed in parameter_names(cfg):
    if hf_name == "lm_head.weight" and hf_name not in tensors:
      # transformers >= 5 ties the unscaled T5.1.1 head to `shared` when it
      # writes no separate one.
      hf_name = "shared.weight"
    if hf_name not in tensors:
      raise ValueError(f"{path}: parameter {hf_name!r} (our {'/'.join(ours)}) is missing "
                       "from the checkpoint.")
    value = tensors[hf_name]
    value = value.T if transposed else value
    want = expected_shapes
    for key in ours:
      want = want[key]
    if tuple(value.shape) != tuple(want.shape):
      raise ValueError(f"{path}: parameter {hf_name!r} has shape {tuple(value.shape)}, "
                       f"but config.json implies {tuple(want.shape)} for {'/'.join(ours)}.")
    _set(params, ours, np.ascontiguousarray(value).astype(cfg.parameter_dtype))
    used.add(hf_name)
  tied_copies = set(_TIED_COPIES) | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
  unknown = sorted(set(tensors) - used - tied_copies)
  if unknown:
    raise ValueError(f"{path}: unexpected parameters {unknown[:5]} (of {len(unknown)}); "
                     "is this a T5ForConditionalGeneration checkpoint?")
  return cfg, params


def save_hf_checkpoint(path: str, cfg: T5Config, params: dict,
                       extra_files: dict[str, str] | None = None) -> None:
  """Writes `params` as a HuggingFace T5 directory (replaced atomically).

  Args:
    path: output directory; an existing one is replaced only once the new one
      is complete.
    cfg: the model's config.
    params: our parameter tree.
    extra_files: `{name in directory: source path}` copied alongside, e.g.
      `{"spiece.model": vocab_path}`.
  """
  tensors = {}
  for ours, hf_name, transposed in parameter_names(cfg):
    value = params
    for key in ours:
      value = value[key]
    value = np.asarray(value, dtype=np.float32)
    tensors[hf_name] = np.ascontiguousarray(value.T if transposed else value)
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp_ckpt_", dir=parent)
  try:
    save_file(tensors, os.path.join(tmp, _WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(tmp, _CONFIG), "w") as f:
      json.dump(cfg.to_hf_dict(), f, indent=2, sort_keys=True)
      f.write("\n")
    for name, src in (extra_files or {}).items():
      shutil.copyfile(src, os.path.join(tmp, name))
    if os.path.exists(path):
      old = tmp + ".old"
      os.replace(path, old)
      os.replace(tmp, path)
      shutil.rmtree(old)
    else:
      os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
