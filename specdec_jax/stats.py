"""The statistics a speculative run reports, each defined once.

Every command, the notebook and `specdec_jax.costs.gamma_choice` pool the loop's counters
(`decoding.speculative.SpeculativeStats`, fetched to the host) with `Pooled`
and read alpha, tokens per target call and the draft cost c from here:

  alpha (beta)       mean of beta = sum_x min(p(x), q(x)) over the verified
                     positions of the output: the paper's estimator (section 3.1).
  alpha (S/(S+R))    accepted proposals over accepted plus rejections: the
                     maximum-likelihood estimate under the paper's i.i.d. model.
  tokens per call    tokens emitted per target call (Theorem 3.8's
                     E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)).
  c                  the draft's time per proposed token over the target's
                     one-token step (both timed in jitted loops, `timing`).

numpy only: no JAX arrays are created, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

# The `SpeculativeStats` counters that are pooled (summed over rows and calls).
COUNTERS = ("iterations", "draft_forward_passes", "tokens", "accepted_histogram", "accepted",
            "rejections", "beta_sum", "beta_count", "loop_iterations")


def alpha_beta(beta_sum: Any, beta_count: Any) -> np.ndarray:
  """The paper's alpha: mean beta, clipped to [0, 1] (element-wise).

  Each beta lies in [0, 1]; a float32 sum of them can round a hair past the
  count, and the clip removes only that rounding.

  Args:
    beta_sum: float32 sums of beta (pooled: a numpy scalar; per row: `[batch]`);
      the quotient is taken in their precision, as every committed row was.
    beta_count: the numbers of verified positions summed (same shape).
  """
  beta_sum = np.asarray(beta_sum)
  return np.clip(beta_sum / np.maximum(np.asarray(beta_count), 1).astype(beta_sum.dtype),
                 0.0, 1.0)


def alpha_empirical(accepted: Any, rejections: Any) -> np.ndarray:
  """S / (S + R): accepted proposals over accepted proposals plus rejections (element-wise)."""
  accepted = np.asarray(accepted, np.int64)
  return accepted / np.maximum(accepted + np.asarray(rejections, np.int64), 1)


def tokens_per_call(tokens: Any, calls: Any) -> np.ndarray:
  """Tokens emitted per target call, element-wise (0 calls: 0)."""
  return np.asarray(tokens, np.int64) / np.maximum(np.asarray(calls, np.int64), 1)


def nondecreasing_fit(values: Sequence[float]) -> np.ndarray:
  """The non-decreasing sequence closest to `values` in least squares (pool adjacent violators).

  Scoring k + 1 tokens in one call costs at least what scoring k does, so
  measured T_verify(k) / T_step that dip as k grows are timing noise: each run
  of values that breaks the order is replaced by its mean. A sequence already
  in order is returned as it is.

  Args:
    values: `[n]` measurements in the order that must not decrease.

  Returns:
    float64 `[n]`, non-decreasing.
  """
  blocks: list[list[float]] = []  # [mean, count] of each pooled run, in order.
  for value in np.asarray(values, np.float64).ravel():
    blocks.append([float(value), 1.0])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      mean, count = blocks.pop()
      prev_mean, prev_count = blocks[-1]
      blocks[-1] = [(prev_mean * prev_count + mean * count) / (prev_count + count),
                    prev_count + count]
  return np.concatenate([np.full(int(count), mean) for mean, count in blocks]
                        ) if blocks else np.zeros(0)


def draft_cost(t_draft_token_s: float, t_step_s: float) -> float:
  """c: seconds per proposed draft token over seconds per one-token target step."""
  return t_draft_token_s / t_step_s


@dataclasses.dataclass(frozen=True)
class Pooled:
  """`SpeculativeStats` counters summed over the rows of one or more calls.

  Attributes:
    counts: counter name (`COUNTERS`) -> numpy sum; `accepted_histogram` is
      `[gamma + 1]`, the others are scalars (`beta_sum` float32).
  """

  counts: dict[str, np.ndarray]

  @classmethod
  def of(cls, stats: Sequence[Any]) -> Pooled:
    """Pools fetched `SpeculativeStats` (or outputs carrying them as `.stats`).

    Args:
      stats: per call, its counters as numpy arrays (`[batch]`, or `[]` for
        `loop_iterations`); all calls at one gamma.
    """
    stats = [getattr(s, "stats", s) for s in stats]
    return cls({f: np.sum([np.sum(getattr(s, f), axis=0) for s in stats], axis=0)
                for f in COUNTERS})

  def __getitem__(self, name: str) -> np.ndarray:
    return self.counts[name]

  def alpha_beta(self) -> float:
    return float(alpha_beta(self["beta_sum"], self["beta_count"]))

  def alpha_empirical(self) -> float:
    return float(alpha_empirical(self["accepted"], self["rejections"]))

  def tokens_per_call(self) -> float:
    return float(tokens_per_call(self["tokens"], self["iterations"]))
