"""Logits -> the distribution we sample from (temperature, top-k, top-p).

This module is the single place where logits become a sampling distribution.
The settings travel as one value, `Warp`; the baseline decoder and both sides
of speculative sampling (draft q and target p) call its methods with the same
value, so "the speculative sampler draws from the same distribution as the
baseline" holds by construction. `warp_logits`, `probs_from_logits` and
`sample` are the same as functions of keyword settings.

Order of the transforms follows HuggingFace: temperature, then top-k, then
top-p. Ties are broken towards the lower token id everywhere (like
`jnp.argmax`, `first_argmax` and `lax.top_k`), so top-k keeps exactly k tokens and the result
is a deterministic function of the logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax import validation


def _check_logits(logits: jax.Array) -> None:
  """Raises ValueError unless `logits` is a floating-point `[..., vocab]` array, vocab >= 1."""
  if logits.ndim < 1 or logits.shape[-1] < 1:
    raise ValueError(f"logits must have shape [..., vocab] with vocab >= 1, got shape "
                     f"{logits.shape}.")
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"logits must be a floating-point array, got dtype {logits.dtype}; "
                     "cast with .astype(jnp.float32).")


# Top-p without top-k first tries the TOP_P_CANDIDATES most likely tokens; only
# when they hold less than top_p of some row's mass is the threshold searched for
# over the whole vocabulary (`_nucleus_by_bisection`).
TOP_P_CANDIDATES = 256


def _keep_in_order(sorted_logits: jax.Array, log_norm: jax.Array, top_p: float) -> jax.Array:
  """Top-p over tokens in descending order: `[n, m]` bool, True while the mass above < top_p.

  Args:
    sorted_logits: `[n, m]` logits in descending order (ties by token id).
    log_norm: `[n, 1]` log of the normaliser (the logsumexp over all surviving tokens).
    top_p: the nucleus mass.
  """
  sorted_probs = jnp.exp(sorted_logits - log_norm)
  # Mass strictly above each token; the token is kept while that is < top_p, which
  # always keeps the first (mass above it is 0 < top_p).
  return jnp.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p


def _scatter(keep_sorted: jax.Array, order: jax.Array, vocab: int) -> jax.Array:
  """Flags `[n, m]` of the token ids `order` `[n, m]` -> a `[n, vocab]` mask (others False)."""
  index = jnp.arange(order.shape[0])[:, None]
  return jnp.zeros((order.shape[0], vocab), dtype=bool).at[index, order].set(keep_sorted)


def _order_keys(rows: jax.Array) -> jax.Array:
  """uint32 `[n, vocab]` keys in the order of the float32 logits `rows`: a < b iff key(a) < key(b).

  IEEE-754 bits read as unsigned: positives above negatives (the sign bit set
  to 1), negatives' magnitudes reversed (every bit flipped). -0.0 becomes +0.0
  first, so equal logits have equal keys.
  """
  rows = jnp.where(rows == 0, jnp.float32(0), rows)
  bits = jax.lax.bitcast_convert_type(rows, jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(1 << 31))


def _nucleus_by_bisection(rows: jax.Array, log_norm: jax.Array, top_p: float) -> jax.Array:
  """Top-p alone over `[n, vocab]` logits, without sorting: the `[n, vocab]` mask kept.

  In descending order (ties by token id) the nucleus is every token up to the
  first at which the cumulative mass reaches top_p. Its last token's logit is
  the threshold v*: the largest logit v whose tokens at or above v hold at
  least top_p. A bisection over the 2^32 uint32 keys of float32 logits
  (`_order_keys`) finds it in 32 masked sums over the vocabulary. Every token
  above v* is kept; of the tokens tied at v* (mass a each, the tokens above
  holding A < top_p), the lowest ids are kept while A + r a < top_p for the
  r-th of them (r = 0, 1, ...), as the sorted order would keep them. Where
  all tokens hold less than top_p (rounding, top_p near 1), v* is the least
  logit and all are kept. The masses are float32 sums, so only a cumulative
  mass within rounding of top_p can fall the other way than in a sorted
  cumulative sum.

  Args:
    rows: `[n, vocab]` float32 logits.
    log_norm: `[n, 1]` their logsumexp.
    top_p: the nucleus mass, in (0, 1).
  """
  keys = _order_keys(rows)  # [n, vocab]
  probs = jnp.exp(rows - log_norm)  # [n, vocab]

  def mass_from(key: jax.Array) -> jax.Array:
    """`[n]`: each row's mass of the tokens whose key is >= its `key` `[n]`."""
    return jnp.sum(jnp.where(keys >= key[:, None], probs, 0.0), axis=-1)

  def halve(_, bounds):
    # Invariant: the threshold's key lies in [lo, hi]; hi is the row's greatest key or
    # mass_from(hi + 1) < top_p.
    lo, hi = bounds
    mid = lo + (hi - lo) // 2 + (hi - lo) % 2  # The upper middle: no overflow at 2^32 - 1.
    enough = mass_from(mid) >= top_p
    open_ = lo < hi
    return (jnp.where(open_ & enough, mid, lo),
            jnp.where(open_ & ~enough, mid - jnp.uint32(1), hi))

  bounds = (jnp.min(keys, axis=-1), jnp.max(keys, axis=-1))
  threshold, _ = jax.lax.fori_loop(0, 32, halve, bounds)  # [n]
  at = keys == threshold[:, None]  # [n, vocab], the tokens tied at v*
  above = jnp.where(threshold < jnp.max(keys, axis=-1),
                    mass_from(threshold + jnp.uint32(1)), 0.0)  # [n], A
  tie_mass = jnp.max(jnp.where(at, probs, 0.0), axis=-1)  # [n], a
  rank = jnp.cumsum(at, axis=-1, dtype=jnp.int32) - 1  # [n, vocab], r among the ties
  # The first tie is kept by v*'s definition (A < top_p); saying so keeps it whatever the
  # rounding of A outside the search.
  kept_tie = (above[:, None] + rank.astype(jnp.float32) * tie_mass[:, None] < top_p) | (rank == 0)
  return (keys > threshold[:, None]) | (at & kept_tie)


def _top_p_mask(rows: jax.Array, top_p: float) -> jax.Array:
  """Top-p alone over `[n, vocab]` logits: the `[n, vocab]` mask of kept tokens.

  `lax.top_k` of the TOP_P_CANDIDATES best tokens orders them exactly as a full
  stable sort would (ties by token id). If they hold at least top_p of every row's
  mass, no token after them can be kept, so the answer is the sorted order's;
  else the threshold is searched for (`_nucleus_by_bisection`), which gives the
  same set without sorting the vocabulary. Over a vocabulary of at most
  TOP_P_CANDIDATES the search alone runs.
  """
  vocab = rows.shape[-1]
  log_norm = jax.nn.logsumexp(rows, axis=-1, keepdims=True)  # [n, 1]
  if vocab <= TOP_P_CANDIDATES:
    return _nucleus_by_bisection(rows, log_norm, top_p)
  best, order = jax.lax.top_k(rows, TOP_P_CANDIDATES)  # [n, m]
  covered = jnp.sum(jnp.exp(best - log_norm), axis=-1) >= top_p  # [n]

  def candidates(_):
    return _scatter(_keep_in_order(best, log_norm, top_p), order, vocab)

  def bisection(_):
    return _nucleus_by_bisection(rows, log_norm, top_p)

  return jax.lax.cond(jnp.all(covered), candidates, bisection, None)


def _top_k_top_p_mask(scaled: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Which tokens survive top-k and then top-p.

  Top-k uses `lax.top_k` (no sort of the vocabulary); top-p then works on the
  k survivors in order. Top-p without top-k looks at the TOP_P_CANDIDATES best
  tokens and searches for the threshold over the whole vocabulary only when
  they are not enough (no sort either way).

  Args:
    scaled: `[..., vocab]` float32 temperature-scaled logits.
    top_k: keep the k highest tokens (0 or >= vocab: keep all).
    top_p: then keep the smallest set of highest-probability tokens whose
      renormalised mass is >= top_p (1.0: keep all).

  Returns:
    `[..., vocab]` bool, True for kept tokens; at least one token is kept.
  """
  vocab = scaled.shape[-1]
  rows = scaled.reshape(-1, vocab)  # [n, vocab]
  if 0 < top_k < vocab:
    # Descending; equal logits by token id.
    sorted_logits, order = jax.lax.top_k(rows, top_k)  # [n, k]
    keep_sorted = jnp.ones(sorted_logits.shape, dtype=bool)
    if top_p < 1.0:
      log_norm = jax.nn.logsumexp(sorted_logits, axis=-1, keepdims=True)
      keep_sorted = _keep_in_order(sorted_logits, log_norm, top_p)
    keep = _scatter(keep_sorted, order, vocab)
  else:
    keep = _top_p_mask(rows, top_p)
  return keep.reshape(scaled.shape)


@struct.dataclass
class Warp:
  """The sampling settings: which distribution logits become, and how a token is drawn.

  One value carries them through every decoder: the baseline's loop, both sides
  of speculative sampling and every draft's `propose` receive it (a static
  argument under `jax.jit`: one compiled program per setting). The public
  decoders take `temperature`, `top_k` and `top_p` as keywords and build it
  once from the arguments `validation.check_scorer_decode_args` checked (`Warp.of`);
  from there on (the scorer-level `baseline.decode` and
  `speculative.speculative_decode`, the data-parallel shards) only the `Warp`
  travels.

  Attributes:
    temperature: 0 means greedy; otherwise logits are divided by it.
    top_k: keep only the k most likely tokens; 0 means off. Ties at the k-th
      place go to the lower token id, so exactly min(k, vocab) tokens are kept.
    top_p: nucleus sampling; keep the smallest set of most likely tokens (after
      top-k) whose mass is >= top_p, always at least one; 1.0 means off.

  Raises:
    ValueError: from the constructor, for settings outside their domain or not
      Python (or NumPy) scalars (`validation.check_sampling`).
  """

  temperature: float = struct.field(pytree_node=False, default=0.0)
  top_k: int = struct.field(pytree_node=False, default=0)
  top_p: float = struct.field(pytree_node=False, default=1.0)

  def __post_init__(self):
    settings = validation.check_sampling(self.temperature, self.top_k, self.top_p)
    for name, value in zip(("temperature", "top_k", "top_p"), settings, strict=True):
      object.__setattr__(self, name, value)

  @classmethod
  def of(cls, args: validation.DecodeArgs) -> Warp:
    """The settings of a decoder call's checked arguments
    (`validation.check_scorer_decode_args`)."""
    return cls(args.temperature, args.top_k, args.top_p)

  def log_probs(self, logits: jax.Array) -> jax.Array:
    """Log-probabilities of the distribution we sample from.

    Args:
      logits: `[..., vocab]` float logits.

    Returns:
      `[..., vocab]` float32 normalised log-probabilities (`log_softmax`);
      excluded tokens get -inf. At temperature 0 a one-hot at the first argmax:
      0.0 there and -inf elsewhere (top-k/top-p cannot change the argmax, so
      they are not applied).

    Raises:
      ValueError: on non-float logits or logits without a vocabulary axis.
    """
    logits = jnp.asarray(logits)
    _check_logits(logits)
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    if self.temperature == 0:
      argmax = first_argmax(logits)  # [...]
      return jnp.where(jnp.arange(vocab) == argmax[..., None], 0.0, -jnp.inf)
    scaled = logits / jnp.float32(self.temperature)  # [..., vocab]
    if 0 < self.top_k < vocab or self.top_p < 1.0:
      keep = _top_k_top_p_mask(scaled, self.top_k, self.top_p)
      scaled = jnp.where(keep, scaled, -jnp.inf)
    return jax.nn.log_softmax(scaled, axis=-1)

  def probs(self, logits: jax.Array) -> jax.Array:
    """Probabilities of the distribution we sample from: `exp(log_probs(logits))`.

    Args:
      logits: `[..., vocab]` float logits.

    Returns:
      `[..., vocab]` float32 probabilities summing to 1 over the last axis;
      exactly 0.0 for excluded tokens, and exactly 1.0/0.0 at temperature 0.
    """
    return jnp.exp(self.log_probs(logits))

  def sample(self, rng: jax.Array | None, logits: jax.Array) -> jax.Array:
    """Draws one token per row from the distribution of `probs`.

    Args:
      rng: a PRNG key; unused at temperature 0 (greedy: `argmax`, ties -> lowest id).
      logits: `[..., vocab]` float logits.

    Returns:
      `[...]` int32 token ids.
    """
    logits = jnp.asarray(logits)
    _check_logits(logits)
    if self.temperature == 0:
      return first_argmax(logits)
    return sample_from_probs(rng, self.probs(logits))


def warp_logits(logits: jax.Array, *, temperature: float, top_k: int = 0,
                top_p: float = 1.0) -> jax.Array:
  """`Warp(temperature, top_k, top_p).log_probs(logits)`: `[..., vocab]` -> `[..., vocab]`."""
  return Warp(temperature, top_k, top_p).log_probs(logits)


def probs_from_logits(logits: jax.Array, *, temperature: float, top_k: int = 0,
                      top_p: float = 1.0) -> jax.Array:
  """`Warp(temperature, top_k, top_p).probs(logits)`: `[..., vocab]` -> `[..., vocab]`."""
  return Warp(temperature, top_k, top_p).probs(logits)


def sample(rng: jax.Array | None, logits: jax.Array, *, temperature: float, top_k: int = 0,
           top_p: float = 1.0) -> jax.Array:
  """`Warp(temperature, top_k, top_p).sample(rng, logits)`: `[..., vocab]` -> int32 `[...]`."""
  return Warp(temperature, top_k, top_p).sample(rng, logits)


def first_argmax(logits: jax.Array) -> jax.Array:
  """The lowest index of the maximum over the last axis: `[..., vocab]` -> int32 `[...]`.

  `jnp.argmax`, with a NaN counted as +inf, as two vectorised reductions (the
  maximum, then the least index holding it): XLA:CPU runs argmax's (value,
  index) reduction one element at a time, 1.5-3X the time over an 8k
  vocabulary (`python -m benchmarks vocab_ops`).
  """
  vocab = logits.shape[-1]
  nan = jnp.isnan(logits)  # [..., vocab]
  top = jnp.max(jnp.where(nan, jnp.inf, logits), axis=-1, keepdims=True)  # [..., 1]
  index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  return jnp.min(jnp.where((logits == top) | nan, index, vocab), axis=-1)


# Tokens per block of `sample_from_probs`' two-level inverse CDF.
CDF_BLOCK = 128


def _first_passing(cdf: jax.Array, mass: jax.Array, u: jax.Array) -> jax.Array:
  """int32 `[...]`: the first entry of `[..., n]` whose cdf passes `u [..., 1]`, of positive mass.

  Where rounding leaves no such entry (u at the very top), the last entry of
  positive mass; the caller ensures one exists. An entry of mass 0 is never returned.
  """
  n = cdf.shape[-1]
  index = jax.lax.broadcasted_iota(jnp.int32, cdf.shape, cdf.ndim - 1)
  positive = mass > 0
  first = jnp.min(jnp.where((cdf > u) & positive, index, n), axis=-1)
  last = jnp.max(jnp.where(positive, index, -1), axis=-1)
  return jnp.where(first < n, first, last)


def sample_from_probs(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per row of `[..., vocab]` probabilities by inverting the CDF.

  One uniform per row instead of the vocab-many that Gumbel-max
  (`jax.random.categorical`) draws: on CPU, threefry for an 8k vocabulary costs
  more than a small draft model's step. The CDF is inverted in two levels: the
  vocabulary is cut into blocks of `CDF_BLOCK` tokens, u * mass picks the block
  where the blocks' cumulative masses pass it, then the token where the block's
  own cumulative masses pass what is left. Two short cumulative sums replace
  one over the vocabulary, which XLA:CPU runs in ~35 us per 8k row, more than
  the rest of a sampled token's bookkeeping (`python -m benchmarks vocab_ops`).
  A token with probability 0 is never drawn, and the row need not sum to
  exactly 1.

  Args:
    rng: a PRNG key.
    probs: `[..., vocab]` non-negative probabilities, some positive in every row.

  Returns:
    `[...]` int32 token ids.
  """
  probs = probs.astype(jnp.float32)
  lead, vocab = probs.shape[:-1], probs.shape[-1]
  num_blocks = -(-vocab // CDF_BLOCK)
  padding = [(0, 0)] * len(lead) + [(0, num_blocks * CDF_BLOCK - vocab)]
  blocks = jnp.pad(probs, padding).reshape(*lead, num_blocks, CDF_BLOCK)  # [..., blocks, block]
  block_mass = jnp.sum(blocks, axis=-1)  # [..., blocks]
  block_cdf = jnp.cumsum(block_mass, axis=-1)  # [..., blocks]
  u = jax.random.uniform(rng, lead + (1,), dtype=jnp.float32) * block_cdf[..., -1:]  # [..., 1]
  block = _first_passing(block_cdf, block_mass, u)[..., None]  # [..., 1]
  inner = jnp.take_along_axis(blocks, block[..., None], axis=-2)[..., 0, :]  # [..., block]
  before = (jnp.take_along_axis(block_cdf, block, axis=-1)
            - jnp.take_along_axis(block_mass, block, axis=-1))  # [..., 1]
  token = _first_passing(before + jnp.cumsum(inner, axis=-1), inner, u)  # [...]
  return (block[..., 0] * CDF_BLOCK + token).astype(jnp.int32)
