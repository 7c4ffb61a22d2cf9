"""HuggingFace T5 checkpoints (config.json + safetensors) <-> our parameter tree.

A directory written by `T5ForConditionalGeneration.save_pretrained` loads into
the T5X-named tree of `models.t5.Transformer`; `save_hf_checkpoint`
writes the reverse, which the reference implementation loads unchanged.

Loading checks every file before it is used: a missing file raises
`FileNotFoundError`; an unreadable, truncated or malformed one, a config field
of the wrong type, and a tensor that is missing, of the wrong shape or dtype,
or not finite raise `CheckpointError` (a `ValueError`) naming the file, the
field or tensor, and what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import typing
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from specdec_jax import validation
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.model import T5Model
from specdec_jax.models.t5.shared_encoder import SharedEncoderModel

_CONFIG = "config.json"
# config.json's "model_type" of a shared-encoder draft (our format, not HF's).
SHARED_ENCODER_TYPE = "specdec_shared_encoder_draft"
_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
# Copies of `shared.weight` that HF may or may not write; never needed.
_TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")

_ATTENTION = {"query": "q", "key": "k", "value": "v", "out": "o"}
# The type of each T5Config field, which config.json's value must have.
_FIELD_TYPES = typing.get_type_hints(T5Config)
_RESAVE = ("copy the checkpoint again, or re-save it with "
           "T5ForConditionalGeneration.save_pretrained (or save_hf_checkpoint)")


class CheckpointError(ValueError):
  """A checkpoint file is unreadable or malformed, or disagrees with its config.

  The message names the file (and the field or tensor) and what to do.
  """


def _mlp_names(cfg: T5Config) -> tuple[str, ...]:
  return ("wi_0", "wi_1", "wo") if cfg.gated else ("wi", "wo")


def parameter_names(cfg: T5Config) -> Iterator[tuple[tuple[str, ...], str, bool]]:
  """Yields (our path, HF name, transposed) for every parameter of `cfg`.

  Our paths are exactly those `T5Model(cfg).param_info()` declares, each with
  one HF name (tested). `transposed` is True where HF stores `[out, in]` (torch
  Linear) and we store `[in, out]`, and for the relative bias (`[buckets, heads]`
  vs `[heads, buckets]`).
  """
  yield ("token_embedder", "embedding"), "shared.weight", False
  for stack, n_layers in (("encoder", cfg.num_layers), ("decoder", cfg.num_decoder_layers)):
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


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{path} is not readable JSON ({e}); it is truncated or corrupt: "
                          f"{_RESAVE}.") from e


def _check_fields(source: str, d: dict[str, Any]) -> None:
  """Raises CheckpointError unless each T5Config field in `d` has its declared type."""
  for name, value in d.items():
    kind = _FIELD_TYPES.get(name)
    if kind is None or (value is None and type(None) in typing.get_args(kind)):
      continue
    base = kind if kind in (bool, str, float) else int  # `int` or `int | None`.
    try:
      if base is float:
        validation.as_real(f"field {name!r}", value)
      elif base is int:
        validation.as_int(f"field {name!r}", value)
      elif not isinstance(value, base):
        raise ValueError(f"field {name!r} must be a {base.__name__}, got {value!r} "
                         f"({type(value).__name__})")
    except ValueError as e:
      raise CheckpointError(f"{source}: {e} Fix that field (T5Config.{name}).") from e


def load_hf_config(path: str, **config_overrides: Any) -> T5Config:
  """Reads and checks the `config.json` of a HuggingFace T5 directory (no weights).

  Args:
    path: the checkpoint directory.
    **config_overrides: T5Config fields to replace, e.g. `dtype="bfloat16"`.

  Returns:
    The config.

  Raises:
    FileNotFoundError: there is no config.json.
    CheckpointError: config.json is unreadable, not a JSON object, not a T5
      encoder-decoder, has a field of the wrong type or value, or special
      token ids outside its vocabulary.
    ValueError: a bad override.
  """
  config_path = os.path.join(path, _CONFIG)
  d = _read_config(path)
  archs = d.get("architectures") or ["T5ForConditionalGeneration"]
  if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
    raise CheckpointError(f"{config_path}: field 'architectures' must be a list of names, got "
                          f"{archs!r}.")
  if d.get("model_type") == SHARED_ENCODER_TYPE:
    raise CheckpointError(f"{config_path} is a shared-encoder draft, not a T5 "
                          "encoder-decoder: load it with checkpoints.load_model (or "
                          "load_shared_encoder_checkpoint).")
  if not any(a.startswith("T5") for a in archs) or d.get("model_type", "t5") != "t5":
    raise CheckpointError(f"{config_path}: architecture {archs} / model_type "
                          f"{d.get('model_type')!r} is not a T5 encoder-decoder; only T5 v1.0, "
                          "T5.1.1 and Flan-T5 checkpoints are supported.")
  return _config_from_dict(config_path, d, config_overrides)


def _read_config(path: str) -> dict[str, Any]:
  """config.json of a checkpoint directory, as a JSON object."""
  config_path = os.path.join(path, _CONFIG)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(
        f"checkpoint_dir={path!r} has no {_CONFIG}; pass a directory written by "
        "T5ForConditionalGeneration.save_pretrained (config.json + model.safetensors).")
  d = _read_json(config_path)
  if not isinstance(d, dict):
    raise CheckpointError(f"{config_path} holds a JSON {type(d).__name__}, not an object of "
                          f"T5 settings; {_RESAVE}.")
  return d


def _config_from_dict(source: str, d: dict[str, Any], config_overrides: dict[str, Any]
                      ) -> T5Config:
  """A checked T5Config from config.json's T5 fields and the caller's overrides."""
  _check_fields(source, d)
  if not isinstance(d.get("scale_decoder_outputs", False), bool):
    raise CheckpointError(f"{source}: field 'scale_decoder_outputs' must be true or "
                          f"false, got {d['scale_decoder_outputs']!r}.")
  unknown = sorted(set(config_overrides) - set(_FIELD_TYPES))
  if unknown:
    raise ValueError(f"config_overrides {unknown} are not T5Config fields; use any of "
                     f"{sorted(_FIELD_TYPES)}.")
  try:
    _check_fields("config_overrides", config_overrides)
  except CheckpointError as e:
    raise ValueError(str(e)) from None
  described = source + (f" with overrides {config_overrides}" if config_overrides else "")
  try:
    cfg = T5Config.from_hf_dict(d, **config_overrides)
  except ValueError as e:
    raise CheckpointError(f"{described}: {e}") from e
  try:
    return validation.check_model_config(cfg, described)
  except ValueError as e:
    raise CheckpointError(str(e)) from e


def _load_safetensors(file: str) -> dict[str, np.ndarray]:
  try:
    return load_file(file)
  except (SafetensorError, OSError, TypeError, ValueError) as e:
    raise CheckpointError(f"{file} is not a readable safetensors file ({e}); it is truncated "
                          f"or corrupt: {_RESAVE}.") from e


def _read_tensors(path: str) -> tuple[dict[str, np.ndarray], str]:
  """All tensors of the checkpoint in `path`, and the file that lists them."""
  single, index = os.path.join(path, _WEIGHTS), os.path.join(path, _INDEX)
  if os.path.isfile(single):
    return _load_safetensors(single), single
  if os.path.isfile(index):
    weight_map = _read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(f, str) for f in weight_map.values()):
      raise CheckpointError(f"{index} has no \"weight_map\" object (tensor name -> file); "
                            f"{_RESAVE}.")
    tensors = {}
    for name in sorted(set(weight_map.values())):
      file = os.path.join(path, name)
      if not os.path.isfile(file):
        raise FileNotFoundError(f"{index} lists {name!r}, which is not in {path!r}; copy the "
                                "whole checkpoint directory.")
      tensors.update(_load_safetensors(file))
    return tensors, index
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
    CheckpointError: a file is unreadable or malformed (see `load_hf_config`
      for config.json), or a tensor is missing, unexpected, mis-shaped, not
      floating-point or not finite (the message names the file and tensor).
    ValueError: a bad override.
  """
  cfg = load_hf_config(path, **config_overrides)
  tensors, weights = _read_tensors(path)
  config_path = os.path.join(path, _CONFIG)
  expected_shapes = jax.eval_shape(lambda: T5Model(cfg).init_params(jax.random.PRNGKey(0)))
  params: dict = {}
  used = set()
  for ours, hf_name, transposed in parameter_names(cfg):
    if hf_name == "lm_head.weight" and hf_name not in tensors:
      # transformers >= 5 ties the unscaled T5.1.1 head to `shared` when it
      # writes no separate one.
      hf_name = "shared.weight"
    if hf_name not in tensors:
      raise CheckpointError(f"{weights}: parameter {hf_name!r} (our {'/'.join(ours)}) is "
                            f"missing; the checkpoint is incomplete or is not the model "
                            f"{config_path} describes: {_RESAVE}.")
    value = tensors[hf_name]
    value = value.T if transposed else value
    want = expected_shapes
    for key in ours:
      want = want[key]
    _check_tensor(weights, hf_name, value, tuple(want.shape), config_path,
                  ours=" for " + "/".join(ours))
    _set(params, ours, np.ascontiguousarray(value).astype(cfg.parameter_dtype))
    used.add(hf_name)
  tied_copies = set(_TIED_COPIES) | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
  unknown = sorted(set(tensors) - used - tied_copies)
  if unknown:
    raise CheckpointError(f"{weights}: unexpected parameters {unknown[:5]} (of "
                          f"{len(unknown)}); is this a T5ForConditionalGeneration checkpoint "
                          f"of the architecture {config_path} describes?")
  return cfg, params


def save_hf_checkpoint(path: str, cfg: T5Config, params: dict,
                       extra_files: dict[str, str] | None = None, dtype: str = "float32"
                       ) -> None:
  """Writes `params` as a HuggingFace T5 directory (replaced atomically).

  Args:
    path: output directory; an existing one is replaced only once the new one
      is complete.
    cfg: the model's config.
    params: our parameter tree.
    extra_files: `{name in directory: source path}` copied alongside, e.g.
      `{"spiece.model": vocab_path}`.
    dtype: the dtype of the tensors on disk: "float32", or "float16" as the shipped
      family is stored (half the bytes; loaded back as float32, float16 holds every
      value exactly, so the decoder packs float16 panels).

  Raises:
    ValueError: `dtype` is not "float32" or "float16".
  """
  if dtype not in ("float32", "float16"):
    raise ValueError(f"dtype={dtype!r}: save_hf_checkpoint writes 'float32' or 'float16'.")
  tensors = {}
  for ours, hf_name, transposed in parameter_names(cfg):
    value = params
    for key in ours:
      value = value[key]
    value = np.asarray(value).astype(dtype)
    tensors[hf_name] = np.ascontiguousarray(value.T if transposed else value)
  _write_directory(path, tensors, cfg.to_hf_dict(), extra_files)


def _write_directory(path: str, tensors: dict[str, np.ndarray], config: dict,
                     extra_files: dict[str, str] | None) -> None:
  """Writes model.safetensors, config.json and `extra_files` into `path`, atomically."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp_ckpt_", dir=parent)
  try:
    save_file(tensors, os.path.join(tmp, _WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(tmp, _CONFIG), "w") as f:
      json.dump(config, f, indent=2, sort_keys=True)
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


def save_shared_encoder_checkpoint(path: str, model: SharedEncoderModel, params: dict, *,
                                   extra_files: dict[str, str] | None = None,
                                   metadata: dict[str, Any] | None = None) -> None:
  """Writes a shared-encoder draft (`models.shared_encoder`) in our format (atomically).

  The format (`SHARED_ENCODER_FORMAT`): `config.json` = {"model_type":
  "specdec_shared_encoder_draft", "format_version": 1, "encoder_d_model": the
  target's d_model, "decoder": the decoder's T5 config as HF writes it, plus
  `metadata` (e.g. the target it reads)}; `model.safetensors` = every parameter
  under its T5X path joined by "/" (e.g. "decoder/layers_0/mlp/wo/kernel"), in
  our `[in, out]` layout, float32.

  Args:
    path: output directory (replaced only once the new one is complete).
    model: the draft's model.
    params: its parameter tree.
    extra_files: `{name in directory: source path}` copied alongside.
    metadata: extra JSON fields of config.json.
  """
  tensors = {"/".join(k): np.ascontiguousarray(np.asarray(v, np.float32))
             for k, v in _flatten(params).items()}
  config = {**(metadata or {}), "model_type": SHARED_ENCODER_TYPE, "format_version": 1,
            "encoder_d_model": model.encoder_d_model, "decoder": model.config.to_hf_dict()}
  _write_directory(path, tensors, config, extra_files)


def _flatten(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, prefix + (key,)))
    else:
      out[prefix + (key,)] = value
  return out


def _check_tensor(file: str, name: str, value: np.ndarray, want: tuple[int, ...],
                  config_path: str, ours: str = "") -> None:
  """Raises CheckpointError unless tensor `name` of `file` has shape `want`, a floating
  dtype and finite values (`ours`: how our tree calls it, for the message)."""
  if tuple(value.shape) != want:
    raise CheckpointError(f"{file}: parameter {name!r} has shape {tuple(value.shape)}, but "
                          f"{config_path} implies {want}{ours}; the config and the weights "
                          "are of different models: use the config.json saved with these "
                          "weights.")
  if not jnp.issubdtype(value.dtype, jnp.floating):
    raise CheckpointError(f"{file}: parameter {name!r} has dtype {value.dtype}; only "
                          "floating-point weights load (no quantized checkpoints): save "
                          "the model in float32, float16 or bfloat16.")
  if not np.all(np.isfinite(value)):
    raise CheckpointError(f"{file}: parameter {name!r} holds NaN or infinite values; the file "
                          f"is corrupt or the model diverged: {_RESAVE} from a good copy.")


def load_shared_encoder_checkpoint(path: str, **config_overrides: Any
                                   ) -> tuple[SharedEncoderModel, dict]:
  """Loads a directory written by `save_shared_encoder_checkpoint`.

  Args:
    path: the directory.
    **config_overrides: decoder T5Config fields to replace (e.g. `dtype="bfloat16"`).

  Returns:
    The model and its parameter tree (numpy arrays, in `param_dtype`).

  Raises:
    FileNotFoundError: a file is missing.
    CheckpointError: config.json or the weights are malformed, or a tensor is
      missing, unexpected, mis-shaped, not floating-point or not finite.
  """
  config_path = os.path.join(path, _CONFIG)
  d = _read_config(path)
  if d.get("model_type") != SHARED_ENCODER_TYPE or d.get("format_version") != 1:
    raise CheckpointError(f"{config_path}: model_type {d.get('model_type')!r} / format_version "
                          f"{d.get('format_version')!r} is not a shared-encoder draft "
                          f"({SHARED_ENCODER_TYPE!r}, 1); load T5 checkpoints with "
                          "load_hf_checkpoint.")
  cfg = _decoder_config(config_path, d, config_overrides)
  try:
    model = SharedEncoderModel(cfg, validation.as_int(
        "field 'encoder_d_model'", d.get("encoder_d_model"), minimum=1,
        what="the target's d_model"))
  except ValueError as e:
    raise CheckpointError(f"{config_path}: {e}") from e
  tensors, weights = _read_tensors(path)
  expected = _flatten(jax.eval_shape(lambda: model.init_params(jax.random.PRNGKey(0))))
  params: dict = {}
  for key, want in expected.items():
    name = "/".join(key)
    if name not in tensors:
      raise CheckpointError(f"{weights}: parameter {name!r} is missing; the checkpoint is "
                            f"incomplete or is not the model {config_path} describes.")
    _check_tensor(weights, name, tensors[name], tuple(want.shape), config_path)
    _set(params, key, np.ascontiguousarray(tensors[name]).astype(cfg.parameter_dtype))
  unknown = sorted(set(tensors) - {"/".join(k) for k in expected})
  if unknown:
    raise CheckpointError(f"{weights}: unexpected parameters {unknown[:5]} (of {len(unknown)}); "
                          f"is this the shared-encoder draft {config_path} describes?")
  return model, params


def load_model_config(path: str) -> T5Config:
  """The T5 config of any model directory (no weights): a HF T5's, or a shared-encoder
  draft's decoder config.

  Raises:
    As `load_hf_config`, or CheckpointError for a malformed shared-encoder config.json.
  """
  d = _read_config(path)
  if d.get("model_type") != SHARED_ENCODER_TYPE:
    return load_hf_config(path)
  return _decoder_config(os.path.join(path, _CONFIG), d, {})


def _decoder_config(config_path: str, d: dict[str, Any], config_overrides: dict[str, Any]
                    ) -> T5Config:
  """The decoder config in a shared-encoder draft's config.json `d`."""
  decoder = d.get("decoder")
  if not isinstance(decoder, dict):
    raise CheckpointError(f"{config_path}: field 'decoder' must be an object of T5 settings, "
                          f"got {decoder!r}: rewrite it with save_shared_encoder_checkpoint.")
  return _config_from_dict(f"{config_path} (field 'decoder')", decoder, config_overrides)


def load_model(path: str, **config_overrides: Any
               ) -> tuple[T5Model | SharedEncoderModel, dict]:
  """Loads any model directory: a HuggingFace T5 or a shared-encoder draft.

  Args:
    path: the directory (its config.json's "model_type" says which).
    **config_overrides: T5Config fields to replace (the decoder's, for a
      shared-encoder draft).

  Returns:
    `(T5Model(cfg), params)` or `(SharedEncoderModel, params)`.

  Raises:
    As `load_hf_checkpoint` / `load_shared_encoder_checkpoint`.
  """
  if _read_config(path).get("model_type") == SHARED_ENCODER_TYPE:
    return load_shared_encoder_checkpoint(path, **config_overrides)
  cfg, params = load_hf_checkpoint(path, **config_overrides)
  return T5Model(cfg), params


def rounded_to_half(params: dict) -> dict:
  """`params` with every floating-point array rounded to float16's nearest values, in its
  own dtype: what the tree loads as once stored in float16, as the shipped family is
  (`experiments.export_family`). A draft priced this way is timed as it would ship: its
  panels then pack in float16 (`kernels.half_panels`), half the bytes per call.

  Raises:
    CheckpointError: a value beyond float16's range (it would not survive the export).
  """
  def rounded(x: Any) -> Any:
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
      return x
    half = x.astype(np.float16)
    if not np.all(np.isfinite(half)):
      raise CheckpointError(f"a parameter of shape {x.shape} holds values beyond float16's "
                            "range (65504); keep this model in float32.")
    return half.astype(x.dtype)

  return jax.tree.map(rounded, params)
