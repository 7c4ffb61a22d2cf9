"""The panel weight product (`models.panel_dot`): numerics, packing, the decoder on it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model

from specdec_jax.models import kernels, panel_dot
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import (
    T5Draft,
    T5Model,
    cached_decoder,
    get_config,
    speculative_sample,
    temperature_sample,
)

# A T5.1.1 whose every decoder matrix has a multiple of 64 outputs: all packed.
PANEL_CONFIG = dict(vocab_size=128, d_model=64, d_kv=32, num_heads=2, d_ff=64)


def test_the_custom_call_is_built_here():
  assert panel_dot.available(), panel_dot.status()
  assert DecodeOptions.for_backend("cpu").packs_panels


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 8, 13, 14, 15, 29, 33])
@pytest.mark.parametrize("k,n", [(64, 64), (100, 192), (384, 1152)])
def test_equals_the_matrix_product(rows, k, n):
  rng = np.random.RandomState(rows * 1000 + k + n)
  x = rng.standard_normal((rows, k)).astype(np.float32)
  w = rng.standard_normal((k, n)).astype(np.float32)
  out = jax.jit(panel_dot.dot)(jnp.asarray(x), panel_dot.pack(jnp.asarray(w)))
  np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("rows", [1, 4, 8])
def test_an_odd_number_of_panels(rows):
  # One row goes through panels two at a time; the last of an odd count alone.
  rng = np.random.RandomState(rows)
  x = rng.standard_normal((rows, 40)).astype(np.float32)
  w = rng.standard_normal((40, 3 * panel_dot.panel_width())).astype(np.float32)
  out = panel_dot.dot(jnp.asarray(x), panel_dot.pack(jnp.asarray(w)))
  np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


def test_concurrent_products_share_the_helper_threads():
  # Two programs multiplying at once: a call whose helper is busy with the other's
  # chunks hands its own to XLA's pool; every product still comes out whole.
  rng = np.random.RandomState(3)
  w = jnp.asarray(rng.standard_normal((256, 64 * panel_dot.panel_width())), jnp.float32)
  panels = panel_dot.pack(w)  # 4 MB: shared between threads.
  xs = [jnp.asarray(rng.standard_normal((r, 256)), jnp.float32) for r in (1, 3)]
  expected = [np.asarray(x, np.float64) @ np.asarray(w, np.float64) for x in xs]
  product = jax.jit(lambda x, p: jax.lax.fori_loop(
      0, 20, lambda i, acc: acc + panel_dot.dot(x, p), jnp.zeros((x.shape[0], w.shape[1]))))
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for _ in range(5):
      outs = list(pool.map(lambda x: np.asarray(product(x, panels)), xs))
      for out, want in zip(outs, expected, strict=True):
        np.testing.assert_allclose(out, 20 * want, rtol=1e-4, atol=1e-2)


def test_leading_dimensions_packing_and_its_inverse():
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.standard_normal((2, 3, 48)), jnp.float32)  # [batch, k, d_in]
  p = panel_dot.panel_width()
  assert p in (16, 32, 64), p  # Two or four vector registers of 8 or 16 floats.
  w = jnp.asarray(rng.standard_normal((48, 2 * p)), jnp.float32)
  panels = panel_dot.pack(w)
  assert panels.shape == (2, 48, p)
  np.testing.assert_array_equal(panels[1, :, :], w[:, p:])
  np.testing.assert_array_equal(panel_dot.unpack(panels), w)
  np.testing.assert_allclose(panel_dot.dot(x, panels), jnp.einsum("bkd,dn->bkn", x, w,
                                                                   precision="highest"),
                             rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="x has 47 features, the panels 48"):
    panel_dot.dot(x[..., :47], panels)


@pytest.mark.parametrize("rows", [1, 2, 6, 7, 14, 15])
def test_float16_panels_give_the_float32_panels_products_bit_for_bit(rows):
  rng = np.random.RandomState(rows)
  w = jnp.asarray(rng.standard_normal((96, 6 * panel_dot.panel_width())).astype(np.float16),
                  jnp.float32)
  x = jnp.asarray(rng.standard_normal((rows, 96)), jnp.float32)
  half = panel_dot.pack(w, half=True)
  assert half.dtype == jnp.float16 and panel_dot.pack(w).dtype == jnp.float32
  np.testing.assert_array_equal(panel_dot.unpack(half), w)
  np.testing.assert_array_equal(panel_dot.dot(x, half), panel_dot.dot(x, panel_dot.pack(w)))


@pytest.mark.parametrize("half", [False, True])
def test_a_rows_products_do_not_depend_on_the_rows_beside_it(half):
  # Bit for bit: a verification chunk's row gives the one-token step's logits, so greedy
  # speculative tokens equal the baseline's at any chunk length (one pass, halves, groups).
  rng = np.random.RandomState(3)
  w = jnp.asarray(rng.standard_normal((200, 4 * panel_dot.panel_width())).astype(np.float16),
                  jnp.float32)
  panels = panel_dot.pack(w, half=half)
  x = jnp.asarray(rng.standard_normal((33, 200)), jnp.float32)
  alone = np.concatenate([np.asarray(panel_dot.dot(x[i:i + 1], panels)) for i in range(33)])
  for rows in (2, 5, 6, 7, 13, 14, 15, 33):
    np.testing.assert_array_equal(panel_dot.dot(x[:rows], panels), alone[:rows])


def test_prepare_packs_float16_panels_only_where_float16_holds_the_weights():
  model, params = make_model("test-v1_1", **PANEL_CONFIG)
  params = jax.device_put(params)
  assert not panel_dot.exact_in_half(params)  # Random float32 weights: float32 panels.
  assert model.prepare(params).decoder.layers[0].wo.dtype == jnp.float32
  halved = jax.tree.map(lambda x: x.astype(jnp.float16).astype(jnp.float32), params)
  assert panel_dot.exact_in_half(halved) and kernels.half_panels(model.options, halved["decoder"])
  decoder = model.prepare(halved).decoder
  assert {w.dtype for w in (decoder.layers[0].qkv, decoder.layers[0].wo, decoder.logits)} == {
      jnp.dtype(jnp.float16)}
  # The same logits as float32 panels of the same weights, bit for bit.
  f32 = cached_decoder.prepare(model.config, halved, panels=True, half=False)
  inputs = jnp.ones((1, 5), jnp.int32)
  encoded = model.encode(halved, inputs)
  tokens = jnp.asarray([[3, 4, 5]], jnp.int32)
  a, _ = model.decode_chunk(decoder, encoded, model.init_cache(1, 8), tokens)
  b, _ = model.decode_chunk(f32, encoded, model.init_cache(1, 8), tokens)
  np.testing.assert_array_equal(a, b)
  # Tied logits are the embedding scaled by d_model^-0.5: not float16 values, float32 panels.
  tied, tied_params = make_model("test-v1_0", **PANEL_CONFIG)
  tied_halved = jax.tree.map(lambda x: x.astype(jnp.float16).astype(jnp.float32),
                             jax.device_put(tied_params))
  tied_decoder = tied.prepare(tied_halved).decoder
  assert tied.config.tie_word_embeddings
  assert tied_decoder.logits.dtype == jnp.float32
  assert tied_decoder.layers[0].wo.dtype == jnp.float16


def test_only_float32_matrices_of_whole_panels_are_packable():
  p = panel_dot.panel_width()
  assert panel_dot.packable(jnp.zeros((8, 4 * p), jnp.float32))
  assert not panel_dot.packable(jnp.zeros((8, 4 * p + 8), jnp.float32))
  assert not panel_dot.packable(jnp.zeros((8, 4 * p), jnp.bfloat16))


def test_decoder_on_panels_gives_the_teacher_forced_logits():
  model, params = make_model("test-v1_1", **PANEL_CONFIG)
  prepared = model.prepare(jax.device_put(params))
  layer = prepared.decoder.layers[0]
  for w in (layer.qkv, layer.self_out, layer.cross_query, layer.cross_out, layer.wi, layer.wo,
            prepared.decoder.logits):
    assert w.ndim == 3  # Every matrix packed.
  rng = np.random.RandomState(3)
  inputs = jnp.asarray(rng.randint(2, 128, (2, 9)), jnp.int32)
  targets = jnp.asarray(rng.randint(2, 128, (2, 11)), jnp.int32)
  reference = model.logits(params, inputs, targets)
  encoded = model.encode(prepared, inputs)
  cache, chunks = model.init_cache(2, 16), []
  for start, stop in ((0, 1), (1, 5), (5, 6), (6, 11)):
    logits, cache = model.decode_chunk(prepared, encoded, cache, targets[:, start:stop])
    chunks.append(logits)
  np.testing.assert_allclose(jnp.concatenate(chunks, 1), reference, atol=2e-5, rtol=0)
  lowered = jax.jit(model.decode_chunk).lower(prepared, encoded, cache, targets[:, :4]).as_text()
  assert lowered.count(panel_dot.TARGET) == 6 * model.config.num_decoder_layers + 1


def test_both_decoders_give_the_same_tokens_on_panels_and_on_xla_dots():
  target, target_params = make_model("test-v1_1", **PANEL_CONFIG)
  draft_model = T5Model(get_config("test-v1_1", **dict(PANEL_CONFIG, num_layers=1)))
  draft_params = draft_model.init_params(jax.random.PRNGKey(1))
  inputs = jnp.asarray(np.random.RandomState(5).randint(2, 128, (2, 7)), jnp.int32)
  assert target.options.packs_panels

  def run(options: DecodeOptions) -> tuple[np.ndarray, np.ndarray]:
    model = dataclasses.replace(target, options=options)
    draft = T5Draft(dataclasses.replace(draft_model, options=options), draft_params)
    base = temperature_sample(model, target_params, inputs, max_decode_len=12)
    spec = speculative_sample(model, target_params, draft, inputs, gamma=3, max_decode_len=12)
    return np.asarray(base.sequences), np.asarray(spec.sequences)

  on_panels = run(target.options)
  on_xla = run(target.options.replace(weight_kernel="xla", half_panels=False))
  for a, b in zip(on_panels, on_xla, strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(on_panels[0], on_panels[1])  # Greedy: spec == baseline.


def test_without_a_compiler_it_says_why_and_decodes_on_xla_dots(tmp_path):
  script = textwrap.dedent("""
      import jax, numpy as np
      from specdec_jax.models import panel_dot
      from specdec_jax.models.options import DecodeOptions
      from specdec_jax.models.t5 import T5Model, get_config, temperature_sample
      print(panel_dot.status())
      assert not panel_dot.available() and not DecodeOptions.for_backend().packs_panels
      model = T5Model(get_config("test-v1_1", vocab_size=128, d_model=64, d_kv=32,
                                 num_heads=2, d_ff=64))
      params = jax.device_put(model.init_params(jax.random.PRNGKey(0)))
      assert model.prepare(params).decoder.layers[0].qkv.ndim == 2
      out = temperature_sample(model, params, np.ones((1, 4), np.int32), max_decode_len=3)
      print(out.sequences.shape)
  """)
  env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"),
             SPECDEC_KERNEL_CACHE=str(tmp_path / "cache"))
  done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "off: no C++ compiler" in done.stdout and "no-such-compiler" in done.stdout
  assert "(1, 3)" in done.stdout
  assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("name", ["test-v1_1", "test-v1_0"])  # logits_dense; tied.
def test_a_shortlist_head_scores_its_tokens_alone(name, packed):
  """With head_tokens, the logits equal the full head's at those tokens, -inf elsewhere."""
  model, params = make_model(name, **PANEL_CONFIG)
  if not packed:
    model = dataclasses.replace(model, options=DecodeOptions())
  params = jax.device_put(params)
  head = np.sort(np.random.RandomState(5).choice(128, 64, replace=False)).astype(np.int32)
  full, short = model.prepare(params), model.prepare(params, head)
  assert short.decoder.logits.ndim == (3 if packed else 2)  # Packed as the full head is.
  assert short.decoder.logits.size == full.decoder.logits.size // 2
  rng = np.random.RandomState(6)
  inputs = jnp.asarray(rng.randint(2, 128, (2, 9)), jnp.int32)
  targets = jnp.asarray(rng.randint(2, 128, (2, 3)), jnp.int32)
  out = {}
  for key, prepared in (("full", full), ("short", short)):
    encoded = model.encode(prepared, inputs)
    out[key], _ = model.decode_chunk(prepared, encoded, model.init_cache(2, 8), targets)
  np.testing.assert_allclose(out["short"][..., head], out["full"][..., head], atol=1e-6, rtol=0)
  rest = np.setdiff1d(np.arange(128), head)
  assert np.all(np.asarray(out["short"][..., rest]) == -np.inf)


@pytest.mark.parametrize("head", [np.array([[1, 2]]), np.array([], np.int32), np.array([1, 1]),
                                  np.array([0, 128]), np.array([0.0, 1.0])])
def test_bad_head_tokens_raise(head):
  model, params = make_model("test-v1_1", **PANEL_CONFIG)
  with pytest.raises(ValueError, match="head_tokens"):
    model.prepare(params, head)
