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

from specdec_jax.checkpoints import load_hf_checkpoint, save_hf_checkpoint


@pytest.fixture
def saved(family, tmp_path):
  """(our model, our params, the path of their HF checkpoint)."""
  model, params = make_model(family)
  path = str(tmp_path / "ckpt")
  save_hf_checkpoint(path, model.config, params)
  return model, params, path


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
  assert cfg == model.config.replace(num_decoder_layers=model.config.n_decoder_layers)
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
