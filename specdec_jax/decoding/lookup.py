"""Prompt lookup's one rule: where the text's last n-gram last appeared in a source.

The longest n-gram (n = max_ngram .. 1) that ends at the last generated token
and occurs in the source (the prompt) wins, and within it the earliest
occurrence; what follows it in the source is the proposal. Used by
`drafts.PromptLookupDraft` (a chain of gamma, q a point mass) and by
`proposers.PromptLookup` (a subtree of the token tree).

Conventions of `drafts.py`: `tokens [batch, buffer_len]` holds the start token
at index 0 and the generated tokens after it; `lengths [batch]` = m generated,
so `tokens[:, m]` is the last. Position 0 (the start token) never matches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def last_grams(tokens: Array, lengths: Array, n: int) -> tuple[Array, Array]:
  """The n-gram ending at each row's last token: int32 `[batch, n]`, and bool `[batch]`
  whether it lies after position 0 (the start token's place never matches)."""
  idx = lengths[:, None] - jnp.arange(n - 1, -1, -1)[None]  # [batch, n]
  return jnp.take_along_axis(tokens, jnp.maximum(idx, 0), axis=1), jnp.all(idx >= 1, axis=1)


def match_start(source: Array, tokens: Array, lengths: Array, max_ngram: int
                ) -> tuple[Array, Array]:
  """Where the continuation of the longest match starts in `source`.

  Args:
    source: int32 `[batch, L]`, 0-padded (0 never matches).
    tokens: int32 `[batch, buffer_len]`, the text so far.
    lengths: int32 `[batch]`.
    max_ngram: the longest n-gram tried.

  Returns:
    bool `[batch]`, whether a row has a match with at least one source token
    after it, and int32 `[batch]`, the source index just after the match (0
    where none).
  """
  batch, source_len = source.shape
  found = jnp.zeros((batch,), bool)
  start = jnp.zeros((batch,), jnp.int32)
  for n in range(max_ngram, 0, -1):
    gram, inside = last_grams(tokens, lengths, n)
    windows = jnp.stack([jnp.roll(source, -i, axis=1) for i in range(n)], -1)  # [b, L, n]
    in_range = jnp.arange(source_len) <= source_len - n - 1  # A continuation exists.
    match = jnp.all(windows == gram[:, None, :], -1) & in_range & (source != 0)  # [b, L]
    hit = jnp.any(match, axis=1) & inside & ~found
    start = jnp.where(hit, jnp.argmax(match, axis=1) + n, start)
    found = found | hit
  return found, start
