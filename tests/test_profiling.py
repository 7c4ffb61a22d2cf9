"""The account's parsing (`specdec_jax.costs.profiling`): a compiled program's ops by phase and
kind."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.costs import profiling


def _program(x: jax.Array, w: jax.Array) -> jax.Array:
  with jax.named_scope("verify"):
    y = jnp.einsum("bqd,bdk->bqk", x, w)  # A batched (attention-like) dot.
  with jax.named_scope("accept"):
    z = jnp.argmax(jnp.cumsum(y, axis=-1), axis=-1)
  return z


def test_every_op_gets_its_phase_and_kind():
  x, w = jnp.ones((2, 3, 8)), jnp.ones((2, 8, 5))
  hlo = jax.jit(_program).lower(x, w).compile().as_text()
  ops = profiling.parse_ops(hlo)
  assert ops and not any(op.opcode in profiling.FREE + profiling.CONTROL for op in ops.values())
  phases = {op.phase for op in ops.values()}
  assert {"verify", "accept"} <= phases, phases
  dots = [op for op in ops.values() if op.kind == "attention dots"]  # A dot or a YNN fusion.
  assert dots and all(op.phase == "verify" for op in dots)
  # The argmax's reducer and comparator run inside their ops: none is an op of its own.
  assert all(op.phase in ("verify", "accept") for op in ops.values()), ops


def test_an_op_without_a_name_stack_takes_the_one_before_it():
  hlo = "\n".join([
      "ENTRY %main (p: f32[4]) -> f32[4] {",
      '  %a = f32[4]{0} exponential(f32[4]{0} %p), metadata={op_name="jit(f)/draft/exp"}',
      "  %b = f32[4]{0} copy(f32[4]{0} %a)",
      '  ROOT %c = f32[4]{0} add(f32[4]{0} %b, f32[4]{0} %b), metadata={op_name="jit(f)/add"}',
      "}"])
  ops = profiling.parse_ops(hlo)
  assert ops["a"].phase == ops["b"].phase == "draft"
  assert ops["b"].kind == "copies" and ops["a"].kind == "norms, softmax, reductions"
  assert ops["c"].phase == profiling.OUTSIDE
