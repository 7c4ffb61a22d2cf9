r"""The decoders' operations over the vocabulary, each against its one-pass form.

Every sampled or greedy token ends in an operation over the whole vocabulary:
the greedy argmax (`sampling.first_argmax` against `jnp.argmax`) and the
draw from probabilities (`sampling.sample_from_probs`, a two-level inverse
CDF, against one cumulative sum over the vocabulary). Each runs `--calls`
times inside a jitted loop with the decoders' XLA options, on `[rows, vocab]`
inputs that depend on the call before; every (operation, rows) program is
called once per repetition in a rotated order (`timing.time_rotated`),
and the medians are printed per call, with a plain softmax of the same rows as
a yardstick.

  python -m benchmarks vocab_ops --output=results/decode_step/vocab_ops.json
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from absl import flags

from specdec_jax import atomic_io, contention
from specdec_jax.costs import timing
from specdec_jax.decoding import sampling
from specdec_jax.models.options import DecodeOptions

_VOCAB = flags.DEFINE_integer("vocab", 8192, "Vocabulary size.", lower_bound=2)
_ROWS = flags.DEFINE_list("rows", ["1", "4"], "Rows per call (gamma + 1 for a verification).")
_CALLS = flags.DEFINE_integer("calls", 500, "Calls per jitted loop.", lower_bound=1)
_REPETITIONS = flags.DEFINE_integer("repetitions", 20, "Interleaved timed repetitions.",
                                    lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/decode_step/vocab_ops.json",
                              "JSON file written atomically.")


def one_pass_sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """The inverse CDF in one cumulative sum over the vocabulary (the reference form)."""
  cdf = jnp.cumsum(probs, axis=-1)
  u = jax.random.uniform(rng, probs.shape[:-1] + (1,), dtype=jnp.float32) * cdf[..., -1:]
  return jnp.minimum(jnp.sum(cdf <= u, axis=-1), probs.shape[-1] - 1).astype(jnp.int32)


OPERATIONS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "argmax": lambda rng, x: jnp.argmax(x, axis=-1).astype(jnp.int32),
    "first_argmax": lambda rng, x: sampling.first_argmax(x),
    "one_pass_sample": lambda rng, x: one_pass_sample(rng, jax.nn.softmax(x)),
    "sample_from_probs": lambda rng, x: sampling.sample_from_probs(rng, jax.nn.softmax(x)),
    "softmax": lambda rng, x: jax.nn.softmax(x)[..., 0],
}


def op_loop(x: jax.Array, *, name: str, calls: int) -> jax.Array:
  """`calls` calls of `OPERATIONS[name]` on `x [rows, vocab]`, each input shifted by the last."""
  operation = OPERATIONS[name]

  def body(i, x):
    out = operation(jax.random.fold_in(jax.random.PRNGKey(0), i), x)  # [rows]
    return x + 1e-30 * out[:, None].astype(x.dtype)

  return jax.lax.fori_loop(0, calls, body, x)


def main(argv: Sequence[str]) -> None:
  del argv
  rows = [int(r) for r in _ROWS.value]
  # Compiled as the decoding loops are, with the options of a model loaded here.
  options = DecodeOptions.for_backend()
  loop = jax.jit(op_loop, static_argnames=("name", "calls"),
                 compiler_options=dict(options.compiler_options))
  programs = {}
  for r in rows:
    x = jax.random.normal(jax.random.PRNGKey(r), (r, _VOCAB.value), jnp.float32)
    for name in OPERATIONS:
      programs[name, r] = functools.partial(loop, x, name=name, calls=_CALLS.value)
  with contention.quiet("benchmark_vocab_ops") as guard:
    times = timing.time_rotated(programs, _REPETITIONS.value)
  results = [{"operation": name, "rows": r,
              "us_per_call": 1e6 * statistics.median(times[name, r]) / _CALLS.value}
             for r in rows for name in OPERATIONS]
  for row in results:
    print(f"rows {row['rows']}  {row['operation']:>18}  {row['us_per_call']:8.2f} us")
  atomic_io.write_json(_OUTPUT.value, {
      "command": "python -m benchmarks vocab_ops", "vocab": _VOCAB.value,
      "calls": _CALLS.value, "repetitions": _REPETITIONS.value, "results": results,
      "idle_check": guard.record(), "environment": timing.environment(options.provenance())})
  print(f"wrote {_OUTPUT.value}")

