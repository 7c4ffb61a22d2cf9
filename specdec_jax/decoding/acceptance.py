"""The modified rejection rule of speculative sampling, batched, as pure functions.

Leviathan, Kalman & Matias (2023), Algorithm 1: a proposal x ~ q is accepted
with probability min(1, p(x)/q(x)); on the first rejection the next token is
drawn from the residual norm(max(0, p - q)); if all gamma proposals are
accepted, one more token is drawn from the target's distribution after them.
The emitted tokens are then distributed exactly as the target p.

`p` and `q` are the *warped* distributions (`sampling.probs_from_logits`) with
the same settings. At temperature 0 they are one-hot, and the rule reduces
exactly to "accept iff proposal == target argmax" (see `verify`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import sampling


def _token_probs(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  """`probs[..., tokens]`: `[..., vocab]`, `[...]` -> `[...]`."""
  return jnp.take_along_axis(probs, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _prefix_length(accept: jax.Array) -> jax.Array:
  """int32 `[batch]`: how many leading entries of each row of `accept [batch, gamma]` are True."""
  return jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1, dtype=jnp.int32)


def residual_distribution(p_probs: jax.Array, q_probs: jax.Array) -> jax.Array:
  """The distribution to resample from after a rejection: norm(max(0, p - q)).

  Where the residual mass is 0 (p <= q everywhere, i.e. p == q) this returns p
  instead. That branch is reached only after a rejection, and when p == q the
  rule never rejects (p(x)/q(x) = 1), so the fallback has probability 0; it
  only keeps the output a valid distribution (no 0/0).

  Args:
    p_probs: `[..., vocab]` target probabilities.
    q_probs: `[..., vocab]` draft probabilities.

  Returns:
    `[..., vocab]` float32 probabilities summing to 1.
  """
  p_probs = p_probs.astype(jnp.float32)
  residual = jnp.maximum(p_probs - q_probs.astype(jnp.float32), 0.0)  # [..., vocab]
  mass = jnp.sum(residual, axis=-1, keepdims=True)  # [..., 1]
  return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_probs)


@flax.struct.dataclass
class VerifyOutput:
  """Result of verifying one chunk of gamma proposals per row.

  Attributes:
    num_accepted: `[batch]` int32 in 0..gamma, the length n of the accepted
      prefix of the proposals.
    next_token: `[batch]` int32, the token emitted after the accepted prefix:
      drawn from residual(p[n], q[n]) if n < gamma, else from p[gamma].
    beta: `[batch, gamma]` float32, sum_x min(p(x), q(x)) at each proposal
      position, the paper's per-token acceptance rate (alpha = E[beta]).
      Position j's context ends with proposals[:j], so positions j > n sit on
      rejected text; beta[:, 0] is the one whose context is purely the text
      generated so far.
  """

  num_accepted: jax.Array
  next_token: jax.Array
  beta: jax.Array


def verify(rng: jax.Array, proposals: jax.Array, q_probs: jax.Array,
           p_probs: jax.Array) -> VerifyOutput:
  """Applies the modified rejection rule to a batch of proposal chunks.

  One uniform u ~ U[0, 1) per proposal; proposal j is accepted iff
  u_j * q_j(x_j) < p_j(x_j) (no division). `rng` is split once into the key
  for the uniforms and the key for the next token, so the result is a
  deterministic function of `rng`.

  At temperature 0 the caller passes one-hot p and q (`probs_from_logits` gives
  exactly 1.0 and 0.0), and proposals are the draft's argmax, so q_j(x_j) = 1:
  the test is `u < 1` (always true) when x_j is the target's argmax and `u < 0`
  (never) otherwise. The residual of two different one-hots is the target's
  one-hot, and sampling a one-hot returns its index, so the next token is the
  target argmax, exactly. `verify_greedy` computes the same without the
  probabilities and random numbers.

  Args:
    rng: a PRNG key.
    proposals: `[batch, gamma]` int draft tokens, proposals[:, j] ~ q_probs[:, j].
    q_probs: `[batch, gamma, vocab]` draft probabilities at each proposal.
    p_probs: `[batch, gamma + 1, vocab]` target probabilities at each proposal
      and after the last one.

  Returns:
    A `VerifyOutput`.

  Raises:
    ValueError: if the shapes do not fit together.
  """
  proposals, q_probs, p_probs = map(jnp.asarray, (proposals, q_probs, p_probs))
  if proposals.ndim != 2 or not jnp.issubdtype(proposals.dtype, jnp.integer):
    raise ValueError(f"proposals must be an int array [batch, gamma], got shape "
                     f"{proposals.shape} dtype {proposals.dtype}.")
  batch, gamma = proposals.shape
  if gamma < 1:
    raise ValueError("proposals must hold gamma >= 1 tokens per row, got shape "
                     f"{proposals.shape}.")
  if q_probs.ndim != 3 or q_probs.shape[:2] != (batch, gamma):
    raise ValueError(f"q_probs must have shape [batch, gamma, vocab] = [{batch}, {gamma}, V], "
                     f"got {q_probs.shape}.")
  vocab = q_probs.shape[2]
  if p_probs.shape != (batch, gamma + 1, vocab):
    raise ValueError(f"p_probs must have shape [batch, gamma + 1, vocab] = "
                     f"{(batch, gamma + 1, vocab)}, got {p_probs.shape}.")
  p_probs = p_probs.astype(jnp.float32)
  q_probs = q_probs.astype(jnp.float32)
  accept_rng, next_rng = jax.random.split(rng)

  p_head = p_probs[:, :gamma]  # [batch, gamma, vocab]
  u = jax.random.uniform(accept_rng, (batch, gamma), dtype=jnp.float32)  # in [0, 1)
  accept = u * _token_probs(q_probs, proposals) < _token_probs(p_head, proposals)
  num_accepted = _prefix_length(accept)  # [batch]

  # Position gamma has no proposal: q = 0 there makes its residual exactly p.
  q_padded = jnp.pad(q_probs, ((0, 0), (0, 1), (0, 0)))  # [batch, gamma + 1, vocab]
  at_n = num_accepted[:, None, None]
  p_n = jnp.take_along_axis(p_probs, at_n, axis=1)[:, 0]  # [batch, vocab]
  q_n = jnp.take_along_axis(q_padded, at_n, axis=1)[:, 0]  # [batch, vocab]
  next_probs = residual_distribution(p_n, q_n)  # [batch, vocab]
  next_token = sampling.sample_from_probs(next_rng, next_probs)

  beta = jnp.sum(jnp.minimum(p_head, q_probs), axis=-1)  # [batch, gamma]
  return VerifyOutput(num_accepted=num_accepted, next_token=next_token.astype(jnp.int32),
                      beta=beta)


def verify_greedy(proposals: jax.Array, p_logits: jax.Array) -> VerifyOutput:
  """`verify` at temperature 0, from the target's logits alone.

  Proposal j is accepted iff it equals the target's argmax at j (ties -> the
  lowest id, as `sampling.sample`); the next token is the target's argmax at
  the first mismatch, or at position gamma. For greedy proposals this equals
  `verify` on the one-hot p and q of `sampling.probs_from_logits(temperature=0)`,
  for any rng (tested), without a softmax or a random number over the vocabulary.

  Args:
    proposals: `[batch, gamma]` int draft tokens (the draft's argmax).
    p_logits: `[batch, gamma + 1, vocab]` target logits.

  Returns:
    A `VerifyOutput`; beta is 1 where the draft's and the target's argmax agree.
  """
  gamma = proposals.shape[1]
  target = sampling.first_argmax(p_logits)  # [batch, gamma + 1]
  match = proposals == target[:, :gamma]  # [batch, gamma]
  num_accepted = _prefix_length(match)  # [batch]
  next_token = jnp.take_along_axis(target, num_accepted[:, None], axis=1)[:, 0]
  return VerifyOutput(num_accepted=num_accepted, next_token=next_token,
                      beta=match.astype(jnp.float32))
