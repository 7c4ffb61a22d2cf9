"""Both decoding loops lower for accelerators on this CPU, with no CPU-only op in them.

`panel_dot` (an XLA:CPU custom call) and XLA:CPU compiler options are the CPU's
alone: a model for an accelerator takes `DecodeOptions.for_backend("gpu")`
(XLA's dots, so its weights are prepared unpacked, and no compiler options for
its loops, `programs.loop_jit`). Lowering
the loops for 'cuda' and 'tpu' here (jax's cross-platform lowering) shows that
what those backends would compile holds nothing of the CPU's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from conftest import make_model

from specdec_jax.decoding import acceptance, baseline, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models import panel_dot
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import T5Draft, T5Scorer

# What XLA:CPU alone runs: panel_dot's custom call target.
CPU_ONLY = (panel_dot.TARGET,)
# Every decoder matrix a whole number of panels, so packing (the control) packs them all.
CONFIG = dict(vocab_size=128, d_model=64, d_kv=32, num_heads=2, d_ff=64)


def _traced_loops(panels: bool) -> dict[str, jax.stages.Traced]:
  """The baseline's and the speculative loop at T = 0 and 1, traced once for any platform."""
  options = (DecodeOptions(weight_kernel="panel_dot") if panels
             else DecodeOptions.for_backend("gpu"))
  target, params = make_model("test-v1_1", **CONFIG)
  draft_model, draft_params = make_model("test-v1_1", seed=1, **CONFIG)
  target = dataclasses.replace(target, options=options)
  draft_model = dataclasses.replace(draft_model, options=options)
  scorer = T5Scorer(target, target.prepare(params))
  draft = T5Draft(draft_model, draft_model.prepare(draft_params))
  inputs = jnp.arange(3, 11, dtype=jnp.int32)[None]
  context = scorer.encode(inputs)
  rng = jax.random.PRNGKey(0)
  eos = target.config.eos_token_id
  out = {}
  for t in (0.0, 1.0):
    loops = {
        "baseline": (baseline.decode_context, (scorer, context, rng),
                     dict(max_decode_len=8, warp=Warp(t), eos_id=eos)),
        "speculative": (speculative._speculative_sample,  # noqa: SLF001
                        (scorer, context, draft, inputs, rng),
                        dict(gamma=3, max_decode_len=8, warp=Warp(t), eos_id=eos,
                             verify=acceptance.verify)),
    }
    for name, (loop, args, kwargs) in loops.items():
      jitted = jax.jit(loop.__wrapped__, static_argnames=tuple(kwargs))
      out[f"{name}, T={t:g}"] = jitted.trace(*args, **kwargs)
  return out


@pytest.fixture(scope="module")
def accelerator_loops() -> dict[str, jax.stages.Traced]:
  return _traced_loops(panels=False)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_the_loops_lower_for_an_accelerator_with_no_cpu_only_op(accelerator_loops, platform):
  for name, traced in accelerator_loops.items():
    text = traced.lower(lowering_platforms=(platform,)).as_text()
    assert "stablehlo.while" in text, name
    assert not [op for op in CPU_ONLY if op in text], f"{name} for {platform}"


def test_negative_control_weights_packed_for_the_cpu_leak_its_custom_call():
  assert panel_dot.available(), panel_dot.status()
  for name, traced in _traced_loops(panels=True).items():
    assert panel_dot.TARGET in traced.lower(lowering_platforms=("cuda",)).as_text(), name
