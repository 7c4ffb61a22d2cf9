"""The measured speedup at T > 0: every pass samples anew, per generated token (`timing.Draws`,
`timing.decoder_times`)."""

import types

import jax
import numpy as np
import pytest

from specdec_jax.costs import timing


def test_every_call_on_a_batch_draws_a_key_of_its_own_shared_by_the_decoders():
  draws = timing.Draws(0, ("baseline", "speculative"), 2, 1.0)
  base = [np.asarray(jax.random.key_data(draws.key("baseline", 0))).tolist() for _ in range(3)]
  spec = [np.asarray(jax.random.key_data(draws.key("speculative", 0))).tolist()
          for _ in range(3)]
  other = np.asarray(jax.random.key_data(draws.key("baseline", 1))).tolist()
  assert len({str(k) for k in base}) == 3
  assert base == spec
  assert other not in base


def _out(tokens: int):
  return types.SimpleNamespace(lengths=np.array([tokens]),
                               sequences=np.zeros((1, 4), np.int32))


def test_the_speedup_divides_every_pass_by_its_own_tokens():
  # Two passes, two batches; the speculative decoder's texts are twice as long in pass 0:
  # 50 ms a token there, 25 in pass 1.
  draws = timing.Draws(0, ("baseline", "speculative"), 2, 1.0)
  for pass_tokens in ({"baseline": (10, 10), "speculative": (20, 20)},
                      {"baseline": (10, 10), "speculative": (10, 10)}):
    for i in range(2):
      draws.record(i, {name: _out(n[i]) for name, n in pass_tokens.items()})
  timings = {"baseline": timing.DecoderTiming((1.0,), ((1.0, 1.0), (1.0, 1.0))),
             "speculative": timing.DecoderTiming((1.0,), ((1.0, 1.0), (0.25, 0.25)))}
  fields = timing.decoder_times(timings, draws.tokens)
  assert fields["baseline_ms_per_token"] == pytest.approx(100.0)
  assert fields["speculative_ms_per_token"] == pytest.approx(np.median([50.0, 25.0]))
  assert fields["speedup_measured"] == pytest.approx(100.0 / 37.5)
  assert fields["baseline_tokens"] == 20 and fields["speculative_tokens"] == 40
  # Dividing by the first pass's tokens alone would say otherwise.
  assert fields["speedup_measured"] != pytest.approx(
      fields["baseline_median_s"] / 20 / (fields["speculative_median_s"] / 40))


def test_greedy_outputs_that_differ_are_refused():
  draws = timing.Draws(0, ("baseline", "speculative"), 1, 0.0, what="a point")
  with pytest.raises(RuntimeError, match=r"output differs from the baseline \(a point, batch 0"):
    draws.record(0, {"baseline": _out(3), "speculative": _out(4)})
  assert draws.greedy_identical is True  # Nothing recorded before the refusal.


def test_greedy_outputs_that_differ_are_recorded_where_not_enforced():
  draws = timing.Draws(0, ("baseline", "speculative"), 2, 0.0, enforce_greedy=False)
  draws.record(0, {"baseline": _out(3), "speculative": _out(3)})
  assert draws.greedy_identical is True
  draws.record(1, {"baseline": _out(3), "speculative": _out(4)})
  assert draws.greedy_identical is False and draws.tokens["speculative"] == [[3, 4]]
  assert timing.Draws(0, ("baseline",), 1, 1.0).greedy_identical is None
