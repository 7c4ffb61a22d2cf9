"""Meshes, axis rules and sharded decoding (8 simulated devices, in a subprocess)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from jax.sharding import PartitionSpec as P

from specdec_jax import partitioning
from specdec_jax.models import kernels, layers
from specdec_jax.models.t5 import SharedEncoderModel, T5Model, get_config, temperature_sample

MESH_TAGS = ("8x1", "2x4", "1x8")
CHECKS = (
    [f"{kind}_{tag}" for tag in MESH_TAGS for kind in ("param_bytes", "base_greedy",
                                                       "spec_greedy")]
    + ["cache_constraint_2x4", "spec_greedy_replicated_draft_2x4", "base_sampled_2x4",
       "spec_sampled_2x4", "dp_spec_greedy", "dp_base_sampled", "dp_spec_draft_inputs",
       "signals_split_rows"])


@pytest.fixture(scope="module")
def multidevice_results(tmp_path_factory) -> dict:
  out = tmp_path_factory.mktemp("multidevice") / "results.json"
  script = os.path.join(os.path.dirname(__file__), "multidevice_checks.py")
  run = subprocess.run([sys.executable, script, str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 0, run.stderr[-4000:]
  return json.loads(out.read_text())


# One worker runs every check, so the 8-device subprocess runs once (`--dist loadgroup`).
@pytest.mark.xdist_group("multidevice")
@pytest.mark.parametrize("name", CHECKS)
def test_sharded_decoding_matches_one_device(multidevice_results, name):
  result = multidevice_results[name]
  assert result["ok"], result["detail"]


def _axes(model) -> dict:
  return jax.tree.map(lambda p: p.axes, model.param_info())


def test_param_axes_cover_both_families(family):
  model = T5Model(get_config(family))
  axes = _axes(model)
  assert axes["token_embedder"]["embedding"] == ("vocab", "embed")
  attention = axes["decoder"]["layers_0"]["self_attention"]
  assert attention["query"]["kernel"] == ("embed", "heads")
  assert attention["out"]["kernel"] == ("heads", "embed")
  assert axes["decoder"]["relpos_bias"]["rel_embedding"] == ("heads", "relpos_buckets")
  mlp = axes["encoder"]["layers_0"]["mlp"]
  assert mlp["wo"]["kernel"] == ("mlp", "embed")
  assert all(mlp[k]["kernel"] == ("embed", "mlp") for k in mlp if k.startswith("wi"))
  # The declarations describe the tree init_params returns, shape for shape.
  params = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
  assert jax.tree.map(lambda x: (x.shape, x.dtype), params) == jax.tree.map(
      lambda p: (p.shape, p.dtype), model.param_info())
  assert all(len(p.axes) == len(p.shape) for p in jax.tree.leaves(model.param_info()))


def test_every_declared_axis_has_a_rule(family):
  rules = dict(partitioning.axis_rules())
  for model in (T5Model(get_config(family)), SharedEncoderModel(get_config(family), 48)):
    used = {a for p in jax.tree.leaves(model.param_info()) for a in p.axes}
    assert used <= set(rules), used - set(rules)
  assert set(kernels.KEY_AXES) == set(kernels.VALUE_AXES) <= set(rules)


def test_shared_encoder_axes():
  axes = _axes(SharedEncoderModel(get_config("test-v1_1"), 48))
  assert "encoder" not in axes
  cross = axes["decoder"]["layers_0"]["encoder_decoder_attention"]
  assert cross["key"]["kernel"] == cross["value"]["kernel"] == ("embed", "heads")


def test_undeclared_parameter_is_named():
  class Adapter(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x @ self.param("kernel", nn.initializers.zeros, (2, 2))

  with pytest.raises(ValueError, match="Parameter kernel .* declares no logical axes"):
    layers.declared_params(Adapter(), jax.ShapeDtypeStruct((1, 2), jnp.float32))


def test_shard_params_needs_the_models_tree():
  mesh = partitioning.make_mesh(1, 1)
  model, params = make_model("test-v1_1")
  sharded = partitioning.shard_params(model, params, mesh)
  assert jax.tree.structure(sharded) == jax.tree.structure(params)
  with pytest.raises(ValueError, match="unknown .*'adapter'"):
    partitioning.shard_params(model, {**params, "encoder": {"adapter": np.zeros(2)}}, mesh)


def test_rules_to_specs_and_overrides():
  assert partitioning.logical_to_spec(kernels.KEY_AXES) == P("data", "model", None, None)
  rules = partitioning.axis_rules(vocab=None, embed="model")
  assert partitioning.logical_to_spec(("vocab", "embed"), rules) == P(None, "model")
  with pytest.raises(ValueError, match="heads='tensor'"):
    partitioning.axis_rules(heads="tensor")


def test_cache_constraint_costs_nothing_on_one_device(family):
  """With rules and no multi-device mesh, the programs are those of a model without."""
  plain = T5Model(get_config(family))
  ruled = T5Model(plain.config, axis_rules=partitioning.axis_rules())
  params = jax.eval_shape(plain.init_params, jax.random.PRNGKey(0))
  inputs = jax.ShapeDtypeStruct((2, 5), jnp.int32)
  for mesh in (None, partitioning.make_mesh(1, 1)):
    with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
      texts = [(jax.jit(lambda m=m: m.init_cache(2, 6)).lower().as_text(),
                jax.jit(lambda p, x, m=m: m.encode(p, x)).lower(params, inputs).as_text())
               for m in (plain, ruled)]
    assert texts[0] == texts[1]
    assert "sharding_constraint" not in texts[1][0] + texts[1][1]


def test_default_rules_are_the_unbound_configurables():
  """What a library function given no rules uses is what the commands build unbound."""
  import gin

  gin.clear_config()
  assert partitioning.axis_rules() == partitioning.DEFAULT_RULES
  assert partitioning.draft_axis_rules() == partitioning.DEFAULT_DRAFT_RULES
  assert partitioning.draft_axis_rules(partitioning.DEFAULT_RULES) == (
      partitioning.DEFAULT_DRAFT_RULES)
  placement = partitioning.Placement.data_parallel()
  assert placement.mesh.shape == {"data": len(jax.devices()), "model": 1}
  assert (placement.rules, placement.draft_rules) == (partitioning.DEFAULT_RULES,
                                                      partitioning.DEFAULT_DRAFT_RULES)


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
  model = T5Model(get_config("test-v1_1", vocab_size=96))
  mesh = jax.sharding.AbstractMesh((1, 8), ("data", "model"))
  with pytest.raises(ValueError, match="dimension 'heads' of size 4 does not divide"):
    partitioning.param_shardings(model, mesh)
  # The rules of the model, or given: heads replicated, nothing left to divide.
  replicated = partitioning.axis_rules(heads=None)
  assert partitioning.param_shardings(model, mesh, replicated) == partitioning.param_shardings(
      T5Model(model.config, axis_rules=replicated), mesh)


def test_data_parallel_batch_must_divide():
  model = T5Model(get_config("test-v1_1"))
  mesh = partitioning.make_mesh(1, 1)
  with pytest.raises(ValueError, match="axis='rows' is not an axis"):
    temperature_sample(model, {}, np.ones((2, 3), np.int32), mesh=mesh,
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

  from specdec_jax.experiment import gin_flags

  files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "gin_configs",
                                        "hardware", "*.gin")))
  assert len(files) >= 5
  gin.add_config_file_search_path(os.path.join(os.path.dirname(__file__), ".."))
  try:
    for path in files:
      gin.clear_config()
      gin.parse_config_file(path)
      assert gin_flags.build_experiment().target == "flan-t5-xxl"
      rules = partitioning.axis_rules()
      assert partitioning.draft_axis_rules(rules) == partitioning.axis_rules(
          heads=None, mlp=None, vocab=None)
  finally:
    gin.clear_config()
