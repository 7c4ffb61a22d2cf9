"""The statistics every row reports, each defined once (`specdec_jax.stats`)."""

import numpy as np
import pytest

from specdec_jax import stats


def test_alpha_estimators():
  """The two estimators every row reports (`stats`), on betas and on accepted-prefix lengths."""
  betas = np.array([[0.5, 0.7], [0.9, 0.1]], np.float32)
  assert float(stats.alpha_beta(betas.sum(), betas.size)) == pytest.approx(0.55)
  assert float(stats.alpha_beta(np.float32(1.0000001), 1)) == 1.0  # Rounding, clipped.
  np.testing.assert_allclose(stats.alpha_beta(betas.sum(1), [2, 2]), [0.6, 0.5])
  # Under the paper's i.i.d. assumption S / (S + R) is the maximum-likelihood alpha.
  alpha, gamma = 0.7, 4
  accepted = np.minimum(np.random.default_rng(0).geometric(1 - alpha, size=200_000) - 1, gamma)
  assert float(stats.alpha_empirical(accepted.sum(), np.sum(accepted < gamma))) == (
      pytest.approx(alpha, abs=0.005))
