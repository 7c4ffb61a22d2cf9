"""Meshes, axis rules and sharded decoding (8 simulated devices, in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specdec_jax import partitioning
from specdec_jax.decoding import data_parallel
from specdec_jax.models import T5Model, get_config

MESH_TAGS = ("8x1", "2x4", "1x8")
CHECKS = (
    [f"{kind}_{tag}" for tag in MESH_TAGS for kind in ("param_bytes", "base_greedy",
                                                       "spec_greedy")]
    + ["base_sampled_2x4", "spec_sampled_2x4", "dp_spec_greedy", "dp_base_sampled",
       "dp_spec_draft_inputs"])


@pytest.fixture(scope="module")
def multidevice_results(tmp_path_factory) -> dict:
  out = tmp_path_factory.mktemp("multidevice") / "results.json"
  script = os.path.join(os.path.dirname(__file__), "multidevice_checks.py")
  run = subprocess.run([sys.executable, script, str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-4000:]
  return json.loads(out.read_text())


@pytest.mark.parametrize("name", CHECKS)
def test_sharded_decoding_matches_one_device(multidevice_results, name):
  result = multidevice_results[name]
  assert result["ok"], result["detail"]


def test_param_axes_cover_both_families(family):
  params = jax.eval_shape(T5Model(get_config(family)).init_params, jax.random.PRNGKey(0))
  axes = partitioning.param_logical_axes(params)
  assert axes["token_embedder"]["embedding"] == ("vocab", "embed")
  attention = axes["decoder"]["layers_0"]["self_attention"]
  assert attention["query"]["kernel"] == ("embed", "heads")
  assert attention["out"]["kernel"] == ("heads", "embed")
  assert axes["decoder"]["relpos_bias"]["rel_embedding"] == ("heads", "relpos_buckets")
  mlp = axes["encoder"]["layers_0"]["mlp"]
  assert mlp["wo"]["kernel"] == ("mlp", "embed")
  assert all(mlp[k]["kernel"] == ("embed", "mlp") for k in mlp if k.startswith("wi"))


def test_unknown_parameter_is_named():
  with pytest.raises(ValueError, match="encoder/adapter/kernel"):
    partitioning.param_logical_axes({"encoder": {"adapter": {"kernel": np.zeros((2, 2))}}})


def test_rules_to_specs_and_overrides():
  assert partitioning.logical_to_spec(partitioning.CACHE_AXES) == P("data", "model", None, None)
  rules = partitioning.axis_rules(vocab=None, embed="model")
  assert partitioning.logical_to_spec(("vocab", "embed"), rules) == P(None, "model")
  with pytest.raises(ValueError, match="heads='tensor'"):
    partitioning.axis_rules(heads="tensor")


def test_mesh_needs_the_device_count():
  assert partitioning.make_mesh(1, 1).shape == {"data": 1, "model": 1}
  with pytest.raises(ValueError, match=r"data \* model = 2 \* 4 = 8, but there are 1 devices"):
    partitioning.make_mesh(2, 4)


def test_indivisible_heads_are_rejected():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  cfg = get_config("test-v1_1")
  partitioning.check_model_fits(cfg, mesh)
  fake = jax.sharding.AbstractMesh((1, 3), ("data", "model"))
  with pytest.raises(ValueError, match="num_heads=4 does not divide by the mesh's 'model' axis"):
    partitioning.check_model_fits(cfg, fake)


def test_param_shardings_check_heads():
  # q/k/v kernels ([32, 4 heads * 8]) would split 8 ways, but not at head boundaries.
  cfg = get_config("test-v1_1", vocab_size=96)
  params = jax.eval_shape(T5Model(cfg).init_params, jax.random.PRNGKey(0))
  mesh = jax.sharding.AbstractMesh((1, 8), ("data", "model"))
  with pytest.raises(ValueError, match="dimension 'heads' of size 4 does not divide"):
    partitioning.param_shardings(params, mesh)


def test_data_parallel_batch_must_divide():
  model = T5Model(get_config("test-v1_1"))
  mesh = partitioning.make_mesh(1, 1)
  with pytest.raises(ValueError, match="axis='rows' is not an axis"):
    data_parallel.temperature_sample(model, {}, np.ones((2, 3), np.int32), mesh=mesh,
                                     max_decode_len=2, axis="rows")


def test_memory_estimate_of_t5_xxl():
  cfg = get_config("t5-v1_1-xxl", dtype="bfloat16", param_dtype="bfloat16")
  one = partitioning.estimate_memory(cfg, (1, 1), batch=1, max_len=128)
  assert 11.0e9 < one.params / 2 < 11.5e9  # 11.1B parameters, 2 bytes each.
  # Self-attention cache: 2 (K, V) x 24 layers x 128 positions x 64 heads x 64 x 2 bytes.
  assert one.kv_cache == 2 * 24 * 128 * 64 * 64 * 2
  four = partitioning.estimate_memory(cfg, (1, 4), batch=1, max_len=128)
  assert one.params / 4 <= four.params < one.params / 4 * 1.01
  assert four.kv_cache == one.kv_cache // 4


def test_hardware_gin_files_parse():
  import glob

  import gin

  from experiments import config

  files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "gin_configs",
                                        "hardware", "*.gin")))
  assert len(files) >= 5
  gin.add_config_file_search_path(os.path.join(os.path.dirname(__file__), ".."))
  try:
    for path in files:
      gin.clear_config()
      gin.parse_config_file(path)
      assert config.Experiment().target == "flan-t5-xxl"
      assert partitioning.draft_axis_rules() == partitioning.axis_rules(heads=None, mlp=None,
                                                                        vocab=None)
  finally:
    gin.clear_config()
