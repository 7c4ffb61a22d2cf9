r"""The decode step's weight products alone: `panel_dot`, k rows at a time.

Times, for k = 1..`--max_rows` rows, the target's every decoder weight product of one
step (its prepared panels, in the decoder's order: 37 calls for the shipped target),
inside a jitted loop of `--calls` steps. Every k's program is called once per
repetition, in an order rotated per repetition, so all see the same machine. Medians
over `--repetitions`; the first call of each program (compilation) is not timed. The
ratio T(k) / T(1) is what verification of k tokens costs in weight products alone,
over one step's.

After them, a yardstick of the machine's arithmetic: a dense float32 product of
`--dense` rows through XLA's own dot (both cores), which no memory bound holds. Each
k's row gives what its products did in those units: GFLOP/s (2 x weights x k per
step) and GB/s of panels read, so the table says from which k verification is bound
by the cores' arithmetic rather than by the weights' bytes.

  python -m benchmarks panel_dot --output=results/decode_step/panel_dot_roofline.json
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from absl import app, flags

from specdec_jax import atomic_io, contention
from specdec_jax.costs import timing
from specdec_jax.models import panel_dot
from specdec_jax.models.t5 import T5Model
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint

_TARGET_DIR = flags.DEFINE_string("target_dir", "assets/models/target",
                                  "HF-format target checkpoint whose decoder panels are timed.")
_MAX_ROWS = flags.DEFINE_integer("max_rows", 8, "Rows k timed: 1..max_rows.", lower_bound=1)
_CALLS = flags.DEFINE_integer("calls", 8, "Steps per jitted loop.", lower_bound=1)
_REPETITIONS = flags.DEFINE_integer("repetitions", 40, "Interleaved timed repetitions.",
                                    lower_bound=1)
_DENSE = flags.DEFINE_integer("dense", 512, "Rows of the dense yardstick product (its K and N "
                              "are 1024).", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/decode_step/panel_dot_roofline.json",
                              "JSON file written atomically.")


def decoder_panels(target_dir: str) -> list[jax.Array]:
  """The panels a decoder step of the checkpoint multiplies, in the prepared tree's order."""
  config, params = load_hf_checkpoint(target_dir, dropout_rate=0.0)
  prepared = T5Model(config).prepare(jax.device_put(params))
  width = panel_dot.panel_width()
  return [x for x in jax.tree.leaves(prepared.decoder)
          if x.ndim == 3 and x.shape[-1] == width]


@functools.partial(jax.jit, static_argnames=("calls",))
def step_products(x: jax.Array, panels: list[jax.Array], *, calls: int) -> jax.Array:
  """`calls` steps of every product `x [1, k, d_model] @ panels[i]`; a scalar using all.

  Each product reads the first K features of a value that depends on the step
  before, so nothing is hoisted out of the loop.
  """

  def body(_, acc: jax.Array) -> jax.Array:
    for p in panels:
      y = panel_dot.dot(x[..., :p.shape[1]] + acc, p)
      acc = acc + 1e-30 * y[0, 0, 0]
    return acc

  return jax.lax.fori_loop(0, calls, body, jnp.zeros((), jnp.float32))


@functools.partial(jax.jit, static_argnames=("calls",))
def dense_products(x: jax.Array, w: jax.Array, *, calls: int) -> jax.Array:
  """`calls` dense products `x [m, K] @ w [K, N]` (XLA's dot), each depending on the one
  before; a scalar using all."""

  def body(_, acc: jax.Array) -> jax.Array:
    return acc + 1e-30 * jnp.dot(x + acc, w)[0, 0]

  return jax.lax.fori_loop(0, calls, body, jnp.zeros((), jnp.float32))


def main(argv: Sequence[str]) -> None:
  del argv
  if not panel_dot.available():
    raise app.UsageError(f"panel_dot is {panel_dot.status()}; there is nothing to time.")
  panels = decoder_panels(_TARGET_DIR.value)
  width = max(p.shape[1] for p in panels)
  ks = range(1, _MAX_ROWS.value + 1)
  programs = {k: functools.partial(step_products, jnp.full((1, k, width), 0.01, jnp.float32),
                                   panels, calls=_CALLS.value) for k in ks}
  dense_x = jnp.full((_DENSE.value, 1024), 0.01, jnp.float32)
  dense = functools.partial(dense_products, dense_x, jnp.full((1024, 1024), 0.01, jnp.float32),
                            calls=_CALLS.value)
  with contention.quiet("panel_dot") as guard:
    times = timing.time_rotated(programs, _REPETITIONS.value)
    # Apart: in the rotation its 6 MB would evict panels from the last-level cache
    # before whichever program follows it, always the same one.
    dense_times = timing.time_rotated({"dense": dense}, _REPETITIONS.value)["dense"]
  dense_gflops = 2 * dense_x.size * 1024 * _CALLS.value / statistics.median(dense_times) / 1e9
  weights = sum(p.size for p in panels)
  panel_bytes = sum(p.nbytes for p in panels)
  ms = {k: 1e3 * statistics.median(times[k]) / _CALLS.value for k in ks}
  rows = [{"k": k, "ms": ms[k], "over_k1": ms[k] / ms[1],
           "gflops": 2 * weights * k / ms[k] / 1e6, "gbytes_per_s": panel_bytes / ms[k] / 1e6,
           "of_dense": 2 * weights * k / ms[k] / 1e6 / dense_gflops} for k in ks]
  print(f"{'k':>2} {'ms':>8} {'/ k=1':>6} {'GFLOP/s':>8} {'GB/s':>6} {'of dense':>8}")
  for row in rows:
    print(f"{row['k']:>2} {row['ms']:>8.3f} {row['over_k1']:>6.2f} {row['gflops']:>8.1f} "
          f"{row['gbytes_per_s']:>6.1f} {row['of_dense']:>8.2f}")
  print(f"dense yardstick ({_DENSE.value} x 1024 @ 1024 x 1024, XLA's dot): "
        f"{dense_gflops:.1f} GFLOP/s")
  atomic_io.write_json(_OUTPUT.value, {
      "command": "python -m benchmarks panel_dot", "target_dir": _TARGET_DIR.value,
      "products_per_step": len(panels), "panel_bytes": panel_bytes, "weights": weights,
      "dense_rows": _DENSE.value, "dense_gflops": dense_gflops, "calls": _CALLS.value,
      "repetitions": _REPETITIONS.value, "rows": rows, "idle_check": guard.record(),
      "environment": timing.environment()})
  print(f"wrote {_OUTPUT.value}")
