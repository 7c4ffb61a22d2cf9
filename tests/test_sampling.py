"""Tests of logits -> sampling distribution (temperature, top-k, top-p)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from specdec_jax.decoding import sampling


def _reference_probs(logits: np.ndarray, temperature: float, top_k: int,
                     top_p: float) -> np.ndarray:
  """Float64 reference for one row `[vocab]`, written independently as loops."""
  vocab = logits.shape[-1]
  if temperature == 0:
    out = np.zeros(vocab)
    out[int(np.argmax(logits))] = 1.0
    return out
  scaled = logits.astype(np.float64) / temperature
  order = sorted(range(vocab), key=lambda i: (-scaled[i], i))
  kept = order[:top_k] if top_k else order
  weights = np.exp(scaled[kept] - scaled[kept].max())
  weights /= weights.sum()
  nucleus, mass = [], 0.0
  for token, w in zip(kept, weights, strict=True):
    nucleus.append(token)
    mass += w
    if mass >= top_p:
      break
  out = np.zeros(vocab)
  out[nucleus] = np.exp(scaled[nucleus] - scaled[nucleus].max())
  return out / out.sum()


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=5),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.8, top_k=10, top_p=0.7),
    dict(temperature=2.0, top_k=1),
    dict(temperature=1.0, top_p=0.01),
    dict(temperature=1.0, top_k=50, top_p=0.95),  # top_k == vocab: off.
    dict(temperature=0.0, top_k=3, top_p=0.5),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_matches_reference_and_normalised(settings):
  logits = np.random.default_rng(0).normal(scale=2.0, size=(6, 4, 50)).astype(np.float32)
  settings = dict(dict(top_k=0, top_p=1.0), **settings)
  probs = np.asarray(sampling.probs_from_logits(jnp.asarray(logits), **settings))
  assert probs.shape == logits.shape and probs.dtype == np.float32
  np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
  expected = np.stack([_reference_probs(row, **settings) for row in logits.reshape(-1, 50)])
  np.testing.assert_array_equal(probs.reshape(-1, 50) > 0, expected > 0)
  np.testing.assert_allclose(probs.reshape(-1, 50), expected, atol=1e-6)


@pytest.mark.parametrize("settings", [s for s in SETTINGS if s["temperature"] > 0])
def test_matches_huggingface_warpers(settings):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  settings = dict(dict(top_k=0, top_p=1.0), **settings)
  logits = np.random.default_rng(1).normal(scale=3.0, size=(32, 50)).astype(np.float32)
  warpers = [transformers.TemperatureLogitsWarper(settings["temperature"])]
  if settings["top_k"]:
    warpers.append(transformers.TopKLogitsWarper(settings["top_k"]))
  if settings["top_p"] < 1.0:
    warpers.append(transformers.TopPLogitsWarper(settings["top_p"]))
  scores = torch.from_numpy(logits)
  for warper in warpers:
    scores = warper(None, scores)
  hf_probs = torch.softmax(scores, dim=-1).numpy()
  probs = np.asarray(sampling.probs_from_logits(jnp.asarray(logits), **settings))
  np.testing.assert_array_equal(probs > 0, hf_probs > 0)
  np.testing.assert_allclose(probs, hf_probs, atol=1e-6)


def test_greedy_is_one_hot_at_first_argmax():
  logits = jnp.array([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 0.0, 0.0], [-5.0, -1.0, -3.0, -1.0]])
  log_probs = sampling.warp_logits(logits, temperature=0.0)
  expected = np.array([[-np.inf, 0, -np.inf, -np.inf], [0, -np.inf, -np.inf, -np.inf],
                       [-np.inf, 0, -np.inf, -np.inf]])
  np.testing.assert_array_equal(log_probs, expected)
  np.testing.assert_array_equal(sampling.probs_from_logits(logits, temperature=0.0),
                                np.exp(expected))
  tokens = sampling.sample(None, logits, temperature=0.0, top_k=2)
  assert tokens.dtype == jnp.int32
  np.testing.assert_array_equal(tokens, [1, 0, 1])


def test_top_k_keeps_exactly_k_including_ties():
  logits = np.random.default_rng(2).normal(size=(20, 30)).astype(np.float32)
  for k in (1, 3, 29):
    probs = sampling.probs_from_logits(jnp.asarray(logits), temperature=1.0, top_k=k)
    np.testing.assert_array_equal((np.asarray(probs) > 0).sum(-1), k)
    threshold = -np.sort(-logits, axis=-1)[:, k - 1:k]
    np.testing.assert_array_equal(np.asarray(probs) > 0, logits >= threshold)
  ties = jnp.array([0.0, 1.0, 1.0, 1.0, 0.5])
  np.testing.assert_allclose(sampling.probs_from_logits(ties, temperature=1.0, top_k=2),
                             [0, 0.5, 0.5, 0, 0])


@pytest.mark.parametrize("top_p,kept", [
    (0.01, [0]), (0.25, [0]), (0.2500001, [0, 1]), (0.5, [0, 1]), (0.5000001, [0, 1, 2]),
    (0.75, [0, 1, 2]), (0.76, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3]),
])
def test_top_p_boundaries(top_p, kept):
  # Four equal logits give exactly 0.25 each, so the cumulative masses are exact.
  probs = np.asarray(sampling.probs_from_logits(jnp.zeros(4), temperature=1.0, top_p=top_p))
  np.testing.assert_array_equal(np.flatnonzero(probs), kept)
  np.testing.assert_allclose(probs[kept], 1 / len(kept))


def test_top_p_after_top_k():
  # Top-k renormalises first: mass of the two kept tokens is 0.5/0.5, so
  # top_p=0.5 keeps one; applied to the full softmax it would keep two.
  logits = jnp.log(jnp.array([0.3, 0.3, 0.2, 0.2]))
  probs = sampling.probs_from_logits(logits, temperature=1.0, top_k=2, top_p=0.5)
  np.testing.assert_allclose(probs, [1, 0, 0, 0])


def test_jit_matches_eager_and_sample_is_jittable():
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(4, 40)), dtype=jnp.float32)
  settings = dict(temperature=0.9, top_k=7, top_p=0.8)
  warp = jax.jit(functools.partial(sampling.warp_logits, **settings))
  np.testing.assert_allclose(warp(logits), sampling.warp_logits(logits, **settings))
  draw = jax.jit(functools.partial(sampling.sample, **settings))
  tokens = draw(jax.random.key(0), logits)
  assert tokens.shape == (4,) and tokens.dtype == jnp.int32
  np.testing.assert_array_equal(tokens, sampling.sample(jax.random.key(0), logits, **settings))


def test_sample_follows_warped_distribution():
  logits = jnp.asarray([0.5, 2.0, -1.0, 1.0, 1.5, -3.0])
  settings = dict(temperature=0.8, top_k=4, top_p=0.9)
  probs = np.asarray(sampling.probs_from_logits(logits, **settings), dtype=np.float64)
  n = 100_000
  tokens = sampling.sample(jax.random.key(4), jnp.broadcast_to(logits, (n, 6)), **settings)
  counts = np.bincount(np.asarray(tokens), minlength=6)
  assert np.all(counts[probs == 0] == 0)
  kept = probs > 0
  p_value = scipy.stats.chisquare(counts[kept], n * probs[kept] / probs[kept].sum()).pvalue
  assert p_value > 1e-3


def test_first_argmax_is_argmax_with_nan_as_inf():
  rng = np.random.default_rng(5)
  logits = rng.integers(-3, 3, size=(64, 300)).astype(np.float32)  # Many ties.
  logits[0] = -np.inf
  logits[1, [7, 200]] = np.inf
  logits[2, [40, 9]] = np.nan
  logits[3, 299] = 10.0
  logits[4, [30, 20]] = [np.nan, np.inf]
  got = sampling.first_argmax(jnp.asarray(logits))
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, np.argmax(np.where(np.isnan(logits), np.inf, logits), -1))
  np.testing.assert_array_equal(got[:5], [0, 7, 9, 299, 20])
  np.testing.assert_array_equal(got[5:], jnp.argmax(jnp.asarray(logits[5:]), axis=-1))
  stacked = jnp.asarray(logits).reshape(8, 8, 300)
  np.testing.assert_array_equal(sampling.first_argmax(stacked), got.reshape(8, 8))


@pytest.mark.parametrize("vocab", [5, 128, 300, 1000])
def test_sample_from_probs_follows_probs_across_blocks(vocab):
  # Mass on tokens at and beside the block edges, nothing elsewhere.
  support = sorted({0, min(1, vocab - 1), vocab // 2, vocab - 1}
                   | {t for t in (127, 128, 255, 256, 257) if t < vocab})
  weights = np.arange(1, len(support) + 1, dtype=np.float64)
  probs = np.zeros(vocab)
  probs[support] = weights / weights.sum()
  n = 40_000
  tokens = sampling.sample_from_probs(jax.random.key(vocab),
                                      jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (n, vocab)))
  assert tokens.dtype == jnp.int32
  counts = np.bincount(np.asarray(tokens), minlength=vocab)
  assert counts.sum() == n and np.all(counts[probs == 0] == 0)
  p_value = scipy.stats.chisquare(counts[support], n * probs[support]).pvalue
  assert p_value > 1e-3


def test_sample_from_probs_never_draws_zero_mass_at_the_top():
  # u at the very top of the CDF (uniform just under 1) must still land on a token
  # with mass: here the last one with mass is far from the vocabulary's end.
  probs = jnp.zeros((3, 1000)).at[:, 3].set(0.25).at[:, 500].set(0.75)
  probs = probs.at[1].set(jnp.zeros(1000).at[999].set(1e-30))
  for seed in range(50):
    tokens = np.asarray(sampling.sample_from_probs(jax.random.key(seed), probs))
    assert tokens[0] in (3, 500) and tokens[2] in (3, 500) and tokens[1] == 999


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=jnp.float32(1.0)), "temperature"),
    (dict(temperature=1.0, top_k=-1), "top_k"),
    (dict(temperature=1.0, top_k=2.5), "top_k"),
    (dict(temperature=1.0, top_k=True), "top_k"),
    (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(temperature=1.0, top_p=1.5), "top_p"),
])
def test_bad_settings_raise(kwargs, match):
  logits = jnp.zeros((2, 5))
  with pytest.raises(ValueError, match=match):
    sampling.warp_logits(logits, **kwargs)
  with pytest.raises(ValueError, match=match):
    sampling.sample(jax.random.key(0), logits, **kwargs)


def test_bad_logits_raise():
  with pytest.raises(ValueError, match="floating-point"):
    sampling.warp_logits(jnp.zeros((2, 5), jnp.int32), temperature=1.0)
  with pytest.raises(ValueError, match=r"\[..., vocab\]"):
    sampling.warp_logits(jnp.float32(1.0), temperature=1.0)


@pytest.mark.parametrize("scale, covered", [(6.0, True), (0.05, False)])
def test_top_p_over_a_large_vocabulary(scale, covered):
  """Peaked rows take the candidates path, flat ones the full sort; both exact, ties too."""
  vocab, top_p = 1000, 0.9
  logits = np.random.default_rng(3).normal(scale=scale, size=(4, vocab)).astype(np.float32)
  logits[:, 500:520] = logits[:, :1].max() - 0.5  # Equal logits near the top.
  probs = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  top_mass = np.sort(probs, -1)[:, ::-1][:, :sampling.TOP_P_CANDIDATES].sum(-1)
  assert bool(np.all(top_mass >= top_p)) == covered
  got = np.asarray(sampling.probs_from_logits(jnp.asarray(logits), temperature=1.0,
                                              top_p=top_p))
  expected = np.stack([_reference_probs(row, 1.0, 0, top_p) for row in logits])
  np.testing.assert_array_equal(got > 0, expected > 0)
  np.testing.assert_allclose(got, expected, atol=1e-6)


def _enumerated_rows() -> np.ndarray:
  """float32 `[n, 4]`: every row of 4 logits from {-1, 0, 0.5, 2} (many ties), and -0.0."""
  values = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
  grid = np.stack(np.meshgrid(*[values] * 4, indexing="ij"), -1).reshape(-1, 4)
  return np.concatenate([grid, [[-0.0, 0.0, 0.0, -1.0], [0.0, -0.0, 2.0, -0.0]]]).astype(
      np.float32)


TOP_PS = (0.05, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 0.97)


def test_nucleus_without_sort_equals_the_sorted_reference_on_an_enumeration():
  """Every 4-token row over 4 logit values, at 8 top_p: the mask and the probabilities are
  the sorted order's, ties by token id. The negative control keeps every token tied at
  the threshold (what a threshold alone gives): the enumeration tells it apart."""
  rows = _enumerated_rows()
  naive_differs = 0
  for top_p in TOP_PS:
    got = np.asarray(sampling.probs_from_logits(jnp.asarray(rows), temperature=1.0,
                                                top_p=top_p))
    expected = np.stack([_reference_probs(row, 1.0, 0, top_p) for row in rows])
    np.testing.assert_array_equal(got > 0, expected > 0, err_msg=f"top_p={top_p}")
    np.testing.assert_allclose(got, expected, atol=1e-6)
    # Negative control: keep all tokens at or above the last kept token's logit.
    cut = np.where(expected > 0, rows, np.inf).min(-1, keepdims=True)
    naive_differs += int(np.sum(np.any((rows >= cut) != (expected > 0), axis=-1)))
  assert naive_differs > 0


def test_nucleus_at_smollm2_width():
  """49,152 tokens, flat rows (the nucleus far beyond TOP_P_CANDIDATES) with a block of
  equal logits at the threshold: equal to a stable sort's cumulative sum in float64."""
  vocab, top_p = 49_152, 0.9
  rng = np.random.default_rng(7)
  logits = rng.normal(scale=0.5, size=(3, vocab)).astype(np.float32)
  logits[2] = np.round(logits[2], 1)  # ~40 distinct values: ties everywhere.
  got = np.asarray(sampling.probs_from_logits(jnp.asarray(logits), temperature=1.0,
                                              top_p=top_p))
  scaled = logits.astype(np.float64)
  probs = np.exp(scaled - scaled.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  order = np.argsort(-logits, axis=-1, kind="stable")
  sorted_probs = np.take_along_axis(probs, order, -1)
  keep_sorted = np.cumsum(sorted_probs, -1) - sorted_probs < top_p
  keep = np.zeros_like(keep_sorted)
  np.put_along_axis(keep, order, keep_sorted, -1)
  assert np.all(keep.sum(-1) > sampling.TOP_P_CANDIDATES)
  np.testing.assert_array_equal(got > 0, keep)
  expected = np.where(keep, probs, 0)
  np.testing.assert_allclose(got, expected / expected.sum(-1, keepdims=True), atol=1e-7)
