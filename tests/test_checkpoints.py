"""HF checkpoint conversion: bit-exact round trips, sharded loading, atomic saves, errors."""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np
import pytest
from conftest import make_model
from safetensors.numpy import load_file, save_file

from specdec_jax.models import kernels
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import T5Model, get_config
from specdec_jax.models.t5.checkpoints import (
  CheckpointError,
  load_hf_checkpoint,
  load_hf_config,
  parameter_names,
  rounded_to_half,
  save_hf_checkpoint,
)


@pytest.fixture
def saved(family, tmp_path):
  """(our model, our params, the path of their HF checkpoint)."""
  model, params = make_model(family)
  path = str(tmp_path / "ckpt")
  save_hf_checkpoint(path, model.config, params)
  return model, params, path


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False},
                                       {"num_decoder_layers": 3, "num_layers": 1}])
def test_hf_names_match_the_declared_parameters(family, overrides):
  """Every declared parameter has exactly one HF name, and every HF name one parameter."""
  cfg = get_config(family, **overrides)
  declared = {path: info for path, info in jax.tree_util.tree_leaves_with_path(
      T5Model(cfg).param_info())}
  declared = {tuple(k.key for k in path): info for path, info in declared.items()}
  names = list(parameter_names(cfg))
  assert sorted(ours for ours, _, _ in names) == sorted(declared)
  assert len({hf for _, hf, _ in names}) == len(names)
  for ours, hf, transposed in names:
    # HF (torch) stores 2-D weights [out, in] and the bias table [buckets, heads]; only the
    # embedding keeps our [vocab, d_model].
    assert transposed == (len(declared[ours].shape) == 2 and ours[-1] != "embedding"), hf


def _assert_same_tree(a: dict, b: dict) -> None:
  flat_a = jax.tree_util.tree_leaves_with_path(a)
  flat_b = dict(jax.tree_util.tree_leaves_with_path(b))
  assert len(flat_a) == len(flat_b)
  for path, value in flat_a:
    other = flat_b[path]
    assert other.dtype == value.dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(other), np.asarray(value),
                                  err_msg=jax.tree_util.keystr(path))


def _edit_config(path: str, **changes) -> None:
  config_path = os.path.join(path, "config.json")
  with open(config_path) as f:
    d = json.load(f)
  d.update(changes)
  with open(config_path, "w") as f:
    json.dump(d, f)


def _contents(path: str) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in pathlib.Path(path).iterdir()}


def test_round_trip_is_bit_exact(saved):
  model, params, path = saved
  cfg, loaded = load_hf_checkpoint(path)
  assert cfg == model.config
  _assert_same_tree(params, loaded)
  # And again through a second save: nothing drifts.
  save_hf_checkpoint(path, cfg, loaded)
  _, again = load_hf_checkpoint(path)
  _assert_same_tree(params, again)


def test_sharded_index_loads(saved):
  _, params, path = saved
  single = os.path.join(path, "model.safetensors")
  tensors = load_file(single)
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for shard, shard_names in shards.items():
    save_file({n: tensors[n] for n in shard_names}, os.path.join(path, shard))
  weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  os.remove(single)
  _, loaded = load_hf_checkpoint(path)
  _assert_same_tree(params, loaded)


def test_config_overrides_apply(saved):
  _, _, path = saved
  cfg, loaded = load_hf_checkpoint(path, dtype="bfloat16", param_dtype="bfloat16")
  assert cfg.dtype == "bfloat16"
  assert all(x.dtype == "bfloat16" for x in jax.tree_util.tree_leaves(loaded))


def test_missing_config(saved):
  _, _, path = saved
  os.remove(os.path.join(path, "config.json"))
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_hf_checkpoint(path)


def test_missing_weights(saved):
  _, _, path = saved
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    load_hf_checkpoint(path)


@pytest.mark.parametrize("changes", [
    {"model_type": "bart"},
    {"architectures": ["BartForConditionalGeneration"]},
])
def test_wrong_architecture(saved, changes):
  _, _, path = saved
  _edit_config(path, **changes)
  with pytest.raises(ValueError, match="not a T5"):
    load_hf_checkpoint(path)


def test_shape_mismatch_names_the_parameter(saved):
  model, _, path = saved
  _edit_config(path, d_ff=model.config.d_ff + 8)
  wi = "wi_0" if model.config.gated else "wi"
  with pytest.raises(ValueError, match=rf"encoder\.block\.0\.layer\.1\.DenseReluDense\.{wi}"
                                       r"\.weight.*has shape"):
    load_hf_checkpoint(path)


def test_missing_tensor_is_named(saved):
  _, _, path = saved
  weights = os.path.join(path, "model.safetensors")
  tensors = load_file(weights)
  del tensors["decoder.block.1.layer.0.SelfAttention.v.weight"]
  save_file(tensors, weights)
  with pytest.raises(ValueError,
                     match=r"decoder\.block\.1\.layer\.0\.SelfAttention\.v\.weight.*missing"):
    load_hf_checkpoint(path)


def test_unexpected_tensor_is_named(saved):
  _, _, path = saved
  weights = os.path.join(path, "model.safetensors")
  tensors = load_file(weights)
  tensors["encoder.block.9.layer.0.layer_norm.weight"] = np.ones(3, np.float32)
  save_file(tensors, weights)
  with pytest.raises(ValueError, match=r"unexpected.*encoder\.block\.9"):
    load_hf_checkpoint(path)


def test_save_replaces_an_existing_directory_only_when_complete(saved, tmp_path):
  model, params, path = saved
  stale = os.path.join(path, "stale.txt")
  with open(stale, "w") as f:
    f.write("from an older save")
  before = _contents(path)

  # A save that fails part-way (after writing the weights) leaves the old one intact.
  with pytest.raises(FileNotFoundError):
    save_hf_checkpoint(path, model.config, params,
                       extra_files={"spiece.model": str(tmp_path / "does-not-exist")})
  assert _contents(path) == before
  assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # No temporary directory left behind.

  # A complete save replaces the directory as a whole.
  vocab = tmp_path / "spiece.model"
  vocab.write_bytes(b"vocab")
  save_hf_checkpoint(path, model.config, params, extra_files={"spiece.model": str(vocab)})
  assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "spiece.model"]
  assert sorted(os.listdir(tmp_path)) == ["ckpt", "spiece.model"]
  _, loaded = load_hf_checkpoint(path)
  _assert_same_tree(params, loaded)


# --- Malformed files: a CheckpointError naming the file, the field and the fix -------------


@pytest.fixture
def ckpt(tmp_path):
  """The path of a saved T5.1.1 checkpoint (the errors do not depend on the family)."""
  model, params = make_model("test-v1_1")
  path = str(tmp_path / "ckpt")
  save_hf_checkpoint(path, model.config, params)
  return path


def _truncate(file: str) -> None:
  data = pathlib.Path(file).read_bytes()
  pathlib.Path(file).write_bytes(data[:len(data) // 2])


def test_load_hf_config_reads_only_the_config(ckpt):
  os.remove(os.path.join(ckpt, "model.safetensors"))
  assert load_hf_config(ckpt) == make_model("test-v1_1")[0].config


@pytest.mark.parametrize("contents, match", [
    (None, r"config\.json is not readable JSON \(.*\); it is truncated or corrupt: copy the "
           r"checkpoint again, or re-save it"),
    (b"\xff\xfe{", r"config\.json is not readable JSON"),
    (b"[1, 2]", r"config\.json holds a JSON list, not an object of T5 settings"),
    (dict(num_heads="two"), r"config\.json: field 'num_heads' must be an int, got 'two' \(str\)"
                            r".*T5Config\.num_heads"),
    (dict(d_model=32.0), r"field 'd_model' must be an int, got 32\.0 \(float\); it is not "
                         r"rounded"),
    (dict(num_layers=True), r"field 'num_layers' must be an int"),
    (dict(num_decoder_layers="3"), r"field 'num_decoder_layers' must be an int"),
    (dict(dropout_rate="0.1"), r"field 'dropout_rate' must be a finite float"),
    (dict(layer_norm_epsilon=float("nan")), r"field 'layer_norm_epsilon' must be a finite float"),
    (dict(tie_word_embeddings="false"), r"field 'tie_word_embeddings' must be a bool"),
    (dict(scale_decoder_outputs="yes"), r"field 'scale_decoder_outputs' must be true or false"),
    (dict(feed_forward_proj=3), r"field 'feed_forward_proj' must be a str"),
    (dict(architectures="T5ForConditionalGeneration"), r"field 'architectures' must be a list"),
    (dict(num_heads=0), r"config\.json: num_heads must be >= 1"),
    (dict(eos_token_id=500), r"config\.json has eos_token_id=500, outside its vocabulary "
                             r"\[0, 97\)"),
    (dict(decoder_start_token_id=-1), r"decoder_start_token_id=-1, outside its vocabulary"),
])
def test_malformed_config_names_the_file_and_field(ckpt, contents, match):
  config = os.path.join(ckpt, "config.json")
  if contents is None:
    _truncate(config)
  elif isinstance(contents, bytes):
    pathlib.Path(config).write_bytes(contents)
  else:
    _edit_config(ckpt, **contents)
  for load in (load_hf_config, load_hf_checkpoint):
    with pytest.raises(CheckpointError, match=match) as info:
      load(ckpt)
    assert config in str(info.value)


@pytest.mark.parametrize("damage, match", [
    ("truncate", r"model\.safetensors is not a readable safetensors file \(.*\); it is "
                 r"truncated or corrupt: copy the checkpoint again"),
    ("garbage", r"model\.safetensors is not a readable safetensors file"),
    ("nan", r"model\.safetensors: parameter 'encoder\.final_layer_norm\.weight' holds NaN or "
            r"infinite values"),
    ("int", r"parameter 'encoder\.final_layer_norm\.weight' has dtype int32; only "
            r"floating-point"),
])
def test_corrupt_weights_name_the_file_and_tensor(ckpt, damage, match):
  weights = os.path.join(ckpt, "model.safetensors")
  if damage == "truncate":
    _truncate(weights)
  elif damage == "garbage":
    pathlib.Path(weights).write_bytes(b"\x08" + bytes(64))
  else:
    tensors = load_file(weights)
    norm = tensors["encoder.final_layer_norm.weight"]
    tensors["encoder.final_layer_norm.weight"] = (
        np.where(np.arange(norm.size) == 3, np.inf, norm).astype(norm.dtype) if damage == "nan"
        else norm.astype(np.int32))
    save_file(tensors, weights)
  with pytest.raises(CheckpointError, match=match):
    load_hf_checkpoint(ckpt)


def _shard(path: str) -> str:
  """Splits the checkpoint into two shards and an index; returns the index's path."""
  single = os.path.join(path, "model.safetensors")
  tensors = load_file(single)
  names = sorted(tensors)
  for i, shard_names in enumerate((names[::2], names[1::2])):
    save_file({n: tensors[n] for n in shard_names}, os.path.join(path, f"model-{i}.safetensors"))
  index = os.path.join(path, "model.safetensors.index.json")
  with open(index, "w") as f:
    json.dump({"weight_map": {n: f"model-{i % 2}.safetensors" for i, n in enumerate(names)}}, f)
  os.remove(single)
  return index


def test_broken_sharded_checkpoints_name_the_file(ckpt):
  index = _shard(ckpt)
  good = pathlib.Path(index).read_bytes()
  _truncate(index)
  with pytest.raises(CheckpointError, match=r"index\.json is not readable JSON"):
    load_hf_checkpoint(ckpt)
  pathlib.Path(index).write_text('{"metadata": {}}')
  with pytest.raises(CheckpointError, match=r"index\.json has no \"weight_map\" object"):
    load_hf_checkpoint(ckpt)
  pathlib.Path(index).write_bytes(good)
  _truncate(os.path.join(ckpt, "model-1.safetensors"))
  with pytest.raises(CheckpointError, match=r"model-1\.safetensors is not a readable"):
    load_hf_checkpoint(ckpt)
  os.remove(os.path.join(ckpt, "model-1.safetensors"))
  with pytest.raises(FileNotFoundError, match=r"index\.json lists 'model-1\.safetensors', which "
                                              r"is not in"):
    load_hf_checkpoint(ckpt)


def test_bad_overrides_are_named(ckpt):
  with pytest.raises(ValueError, match=r"config_overrides: field 'num_heads' must be an int"):
    load_hf_checkpoint(ckpt, num_heads=2.5)
  with pytest.raises(ValueError, match=r"config_overrides \['heads'\] are not T5Config fields"):
    load_hf_checkpoint(ckpt, heads=4)
  with pytest.raises(CheckpointError, match=r"with overrides \{'dtype': 'float33'\}: "
                                            r"dtype='float33' is not a dtype"):
    load_hf_checkpoint(ckpt, dtype="float33")


def test_rounded_to_half_is_what_a_float16_checkpoint_loads_as():
  # Decoder matrices of whole panels (multiples of 64 outputs), so they can pack.
  _, params = make_model("test-v1_1", vocab_size=128, d_model=64, d_kv=32, num_heads=2,
                         d_ff=64)
  rounded = rounded_to_half({**params, "step": np.arange(3)})
  np.testing.assert_array_equal(rounded.pop("step"), np.arange(3))
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(rounded), strict=True):
    assert y.dtype == np.asarray(x).dtype
    np.testing.assert_array_equal(y, np.asarray(x).astype(np.float16).astype(y.dtype))
  options = DecodeOptions(weight_kernel="panel_dot", half_panels=True)
  assert not kernels.half_panels(options, jax.device_put(params["decoder"]))
  assert kernels.half_panels(options, jax.device_put(rounded["decoder"]))
  with pytest.raises(CheckpointError, match="float16's range"):
    rounded_to_half({"w": np.array([1e6], np.float32)})
