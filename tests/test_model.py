"""The Flax T5: parameter layout, chunked cached decoding, rewinding, configs."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from flax import struct

from specdec_jax.decoding import programs
from specdec_jax.models import panel_dot
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import NAMED_CONFIGS, T5Config, T5Model, get_config


def _flat_names(params: dict) -> set[str]:
  return {"/".join(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}


def test_parameter_names_follow_t5x(family):
  model, params = make_model(family)
  names = _flat_names(params)
  common = {
      "token_embedder/embedding",
      "encoder/relpos_bias/rel_embedding",
      "encoder/layers_0/attention/query/kernel",
      "encoder/layers_1/pre_mlp_layer_norm/scale",
      "encoder/encoder_norm/scale",
      "decoder/relpos_bias/rel_embedding",
      "decoder/layers_0/self_attention/out/kernel",
      "decoder/layers_0/encoder_decoder_attention/key/kernel",
      "decoder/layers_1/pre_cross_attention_layer_norm/scale",
      "decoder/decoder_norm/scale",
  }
  assert common <= names
  if family == "test-v1_0":
    assert "encoder/layers_0/mlp/wi/kernel" in names
    assert not any("logits_dense" in n for n in names)
  else:
    assert {"encoder/layers_0/mlp/wi_0/kernel", "encoder/layers_0/mlp/wi_1/kernel",
            "decoder/logits_dense/kernel", "decoder/layers_2/mlp/wo/kernel"} <= names
  cfg = model.config
  assert params["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (
      cfg.d_model, cfg.num_heads * cfg.d_kv)
  assert params["decoder"]["relpos_bias"]["rel_embedding"].shape == (
      cfg.num_heads, cfg.relative_attention_num_buckets)


def _inputs(batch=3, length=9, vocab=97, seed=0):
  rng = np.random.RandomState(seed)
  inputs = rng.randint(2, vocab, size=(batch, length))
  inputs[-1, length // 2:] = 0  # a padded row
  return jnp.asarray(inputs, jnp.int32)


def test_chunked_equals_one_by_one_and_teacher_forcing(family):
  model, params = make_model(family)
  inputs = _inputs()
  targets = jnp.asarray(np.random.RandomState(1).randint(2, 97, size=(3, 17)), jnp.int32)
  encoded = model.encode(params, inputs)
  full = model.logits(params, inputs, targets)

  cache = model.init_cache(3, 24)
  one_by_one = []
  for t in range(17):
    logits, cache = model.decode_chunk(params, encoded, cache, targets[:, t:t + 1])
    one_by_one.append(logits)
  one_by_one = jnp.concatenate(one_by_one, axis=1)

  cache = model.init_cache(3, 24)
  chunked = []
  for start, stop in ((0, 1), (1, 5), (5, 6), (6, 14), (14, 17)):
    logits, cache = model.decode_chunk(params, encoded, cache, targets[:, start:stop])
    chunked.append(logits)
  chunked = jnp.concatenate(chunked, axis=1)

  np.testing.assert_allclose(chunked, one_by_one, atol=1e-5, rtol=0)
  np.testing.assert_allclose(chunked, full, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(cache.lengths, [17, 17, 17])


@pytest.mark.parametrize("max_rows", [1, 4])
def test_row_by_row_weight_products_give_the_same_logits(family, max_rows):
  """Calls of batch * k <= `row_dots_max_rows` rows multiply the weights row by row
  (cheaper on XLA:CPU with XLA's dots); the logits are the teacher-forced ones
  whichever way."""
  model, params = make_model(family)
  model = dataclasses.replace(model, options=DecodeOptions(row_dots_max_rows=max_rows))
  decode_chunk = jax.jit(lambda *args: model.decode_chunk(*args))
  inputs = _inputs(batch=2)
  targets = jnp.asarray(np.random.RandomState(2).randint(2, 97, size=(2, 7)), jnp.int32)
  encoded = model.encode(params, inputs)
  full = model.logits(params, inputs, targets)
  cache, chunked = model.init_cache(2, 12), []
  # 2, 4, 6 and 2 rows: row by row and not, under max_rows 4.
  for start, stop in ((0, 1), (1, 3), (3, 6), (6, 7)):
    tokens = targets[:, start:stop]
    lowered = decode_chunk.lower(params, encoded, cache, tokens).as_text()
    by_row = 1 < tokens.size <= max_rows
    assert model.options.row_dots(tokens.size) == by_row
    # One product per weight matrix (6 per layer and the logits), or one per row.
    weight_dots = (6 * model.config.num_decoder_layers + 1) * (tokens.size if by_row else 1)
    attention_dots = 2 * 2 * model.config.num_decoder_layers
    assert lowered.count("dot_general") == weight_dots + attention_dots
    logits, cache = decode_chunk(params, encoded, cache, tokens)
    chunked.append(logits)
  np.testing.assert_allclose(jnp.concatenate(chunked, axis=1), full, atol=1e-5, rtol=0)


def test_rows_at_different_lengths_and_rewind(family):
  """Rows advance and rewind independently; stale cache entries are invisible."""
  model, params = make_model(family)
  inputs = _inputs()
  rng = np.random.RandomState(2)
  targets = jnp.asarray(rng.randint(2, 97, size=(3, 12)), jnp.int32)
  junk = jnp.asarray(rng.randint(2, 97, size=(3, 4)), jnp.int32)
  encoded = model.encode(params, inputs)
  reference = model.logits(params, inputs, targets)  # [3, 12, vocab]

  cache = model.init_cache(3, 20)
  _, cache = model.decode_chunk(params, encoded, cache, targets[:, :6])
  # Write junk after position 6 everywhere, then rewind each row differently.
  _, cache = model.decode_chunk(params, encoded, cache, junk)
  starts = np.array([2, 6, 4])
  cache = cache.rewind(jnp.asarray(starts))
  # Each row now scores its own next 3 true tokens, from its own position.
  chunk = jnp.stack([targets[b, s:s + 3] for b, s in enumerate(starts)])
  logits, cache = model.decode_chunk(params, encoded, cache, chunk)
  for b, s in enumerate(starts):
    np.testing.assert_allclose(logits[b], reference[b, s:s + 3], atol=1e-5, rtol=0)
  np.testing.assert_array_equal(cache.lengths, starts + 3)


def test_dropout_only_when_asked(family):
  base, params = make_model(family)
  model = T5Model(base.config.replace(dropout_rate=0.5))
  inputs, targets = _inputs(), _inputs(seed=3)
  a = model.logits(params, inputs, targets)
  b = model.logits(params, inputs, targets)
  c = model.logits(params, inputs, targets, dropout_rng=jax.random.PRNGKey(0))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_bfloat16_compute_runs_close_to_float32(family):
  model, params = make_model(family)
  model16 = T5Model(model.config.replace(dtype="bfloat16"))
  inputs, targets = _inputs(), _inputs(seed=3)
  ref = model.logits(params, inputs, targets)
  low = model16.logits(params, inputs, targets)
  assert low.dtype == jnp.bfloat16
  # Relative RMS error (1% for the T5.1.1 test model, 4-6% for the v1.0 one over
  # input seeds): bf16 rounding compounds through the layers, and the worst single
  # logit of these random models swings with the inputs (6-23% of the largest
  # logit, in round 1's code too), so a max-error bound tests luck, not precision.
  err = low.astype(jnp.float32) - ref
  assert float(jnp.sqrt(jnp.mean(err**2) / jnp.mean(ref**2))) < 0.1


def test_named_configs_match_public_sizes():
  assert get_config("t5-small").d_ff == 2048 and get_config("t5-small").tie_word_embeddings
  xxl = get_config("flan-t5-xxl")
  assert (xxl.d_model, xxl.d_ff, xxl.num_heads, xxl.num_layers) == (4096, 10240, 64, 24)
  assert xxl.gated and not xxl.tie_word_embeddings
  assert {"t5-11b", "t5-v1_1-small", "flan-t5-base"} <= set(NAMED_CONFIGS)
  assert get_config("t5-base", vocab_size=8192).vocab_size == 8192


@pytest.mark.parametrize("kwargs, message", [
    (dict(feed_forward_proj="swish"), "feed_forward_proj"),
    (dict(num_heads=0), "num_heads"),
    (dict(dtype="float33"), "dtype"),
])
def test_bad_config_names_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    T5Config(**kwargs)
  with pytest.raises(ValueError, match="Unknown T5 config"):
    get_config("t5-huge")


def test_prepared_weights_give_the_t5x_trees_logits_and_are_held_by_the_caller(family):
  """`prepare` fuses/lays out the decoder; every way of passing weights agrees."""
  model, params = make_model(family)
  params = jax.device_put(params)
  prepared = model.prepare(params)
  assert model.prepare(prepared) is prepared
  again = model.prepare(jax.tree.map(np.asarray, params))  # Nothing remembered: prepared anew.
  assert again is not prepared
  jax.tree.map(np.testing.assert_array_equal, again.decoder, prepared.decoder)
  layer = prepared.decoder.layers[0]
  cfg = model.config

  def matrix(w):  # A packed weight (panel_dot) as the [K, N] matrix it holds.
    return panel_dot.unpack(w) if w.ndim == 3 else w

  assert matrix(layer.qkv).shape == (cfg.d_model, 3 * cfg.num_heads * cfg.d_kv)
  assert matrix(layer.wi).shape == (cfg.d_model, (2 if cfg.gated else 1) * cfg.d_ff)
  assert matrix(prepared.decoder.logits).shape == (cfg.d_model, cfg.vocab_size)
  dec = params["decoder"]["layers_0"]
  wi = (jnp.concatenate([dec["mlp"]["wi_0"]["kernel"], dec["mlp"]["wi_1"]["kernel"]], 1)
        if cfg.gated else dec["mlp"]["wi"]["kernel"])
  np.testing.assert_array_equal(matrix(layer.wi), wi)
  inputs, targets = _inputs(), _inputs(seed=4)
  reference = model.logits(params, inputs, targets)  # The Flax modules on the T5X tree.
  encoded = model.encode(prepared, inputs)
  for weights in (params, prepared, prepared.decoder):
    logits, _ = model.decode_chunk(weights, encoded, model.init_cache(3, 12), targets)
    np.testing.assert_allclose(logits, reference, atol=1e-5, rtol=0)


@struct.dataclass
class _WithOptions:
  """A loop's first argument: an array and the compiler options it carries (static)."""

  x: jax.Array
  compiler_options: tuple = struct.field(pytree_node=False, default=())


def test_loops_compile_with_their_first_arguments_compiler_options():
  @functools.partial(programs.loop_jit, static_argnames=())
  def double(arg):
    return 2 * arg.x

  x = jnp.arange(3.0)
  np.testing.assert_array_equal(double(_WithOptions(x)), [0.0, 2.0, 4.0])
  # An option XLA does not know reaches the compiler only with the argument carrying it.
  with pytest.raises(Exception, match="xla_no_such_option"):
    double(_WithOptions(x, (("xla_no_such_option", True),)))
  fast = (("xla_cpu_enable_fast_min_max", True),)
  np.testing.assert_array_equal(double(_WithOptions(x, fast)), [0.0, 2.0, 4.0])
  compiled = double._cache_size()
  np.testing.assert_array_equal(double(_WithOptions(x + 1)), [2.0, 4.0, 6.0])
  np.testing.assert_array_equal(double(_WithOptions(x + 1, fast)), [2.0, 4.0, 6.0])
  assert double._cache_size() == compiled  # One program per set of options, kept.


def test_compile_only_compiles_the_loop_without_running_it():
  ran, compiles = [], []

  def listen(event: str, seconds: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(seconds)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    _check_compile_only(ran, compiles)
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


def _check_compile_only(ran: list, compiles: list) -> None:

  @functools.partial(programs.loop_jit, static_argnames=())
  def loop(arg):
    jax.debug.callback(lambda: ran.append(1))
    return {"y": 2 * arg.x, "n": jnp.sum(arg.x > 0)}

  x = _WithOptions(jnp.arange(3.0))
  with programs.compile_only():
    zeros = loop(x)
  assert not ran and compiles  # Compiled, not run.
  np.testing.assert_array_equal(zeros["y"], np.zeros(3, np.float32))
  assert zeros["y"].dtype == jnp.float32 and zeros["n"].dtype == jnp.int32
  before = len(compiles)
  np.testing.assert_array_equal(loop(x)["y"], [0.0, 2.0, 4.0])
  assert ran and len(compiles) == before  # The next call runs the program compiled above.


def test_decode_options_are_checked_and_hashable():
  options = DecodeOptions(compiler_options={"b": 1, "a": False})
  assert options.compiler_options == (("a", False), ("b", 1))
  assert hash(options) == hash(DecodeOptions(compiler_options=(("b", 1), ("a", False))))
  with pytest.raises(ValueError, match="weight_kernel"):
    DecodeOptions(weight_kernel="eigen")
  with pytest.raises(ValueError, match="half_panels needs"):
    DecodeOptions(half_panels=True)
  with pytest.raises(ValueError, match="row_dots_max_rows"):
    DecodeOptions(row_dots_max_rows=0)
  # Read once, from what it is given: no panels where the environment turns them off.
  assert not DecodeOptions.for_backend("cpu", environ={"SPECDEC_PANEL_DOT": "0"}).packs_panels
  assert DecodeOptions.for_backend("cpu", devices=8).split_heads
  assert DecodeOptions.for_backend("gpu") == DecodeOptions()
