"""Data-parallel decoding: each device decodes its own rows with a full copy of the params.

Built on `jax.shard_map`, not `jax.pmap`: in JAX 0.10 `pmap` still runs, but
its documentation calls it "the old way of doing parallel map", says it is now
implemented in terms of `jit` and `shard_map`, and recommends `shard_map`,
which also composes with multi-process meshes. `shard_map` over the mesh's
data axis is exactly the pmap program: params replicated, the batch split, and
every device running its own `lax.while_loop` (so a shard whose rows finish
early stops early, with no cross-device communication at all).

The loops are `baseline.decode` and `speculative.speculative_decode` over any
`Scorer` and `Draft`; this module imports no model (`models.t5`'s
`temperature_sample` / `speculative_sample` take a `mesh` and come here).

Sampling: shard i draws with `fold_in(rng, i)`, so sampled outputs equal the
single-device decoders run on each shard's rows with that key (greedy outputs
equal the single-device outputs outright). For sampling that does not depend
on the device count, use the GSPMD path in `specdec_jax.partitioning`.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.baseline import DecodeOutput
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.decoding.speculative import SpeculativeOutput

Array = jax.Array


def check_split(inputs: Array, mesh: Mesh, axis: str) -> None:
  """Raises ValueError unless `inputs [batch, ...]` can be split over `mesh`'s `axis`.

  The other arguments are checked by `validation` first, once (token ids that
  are themselves traced, at run time: see `specdec_jax.validation`); each
  shard runs the decoders' loops on them as checked.
  """
  if axis not in mesh.shape:
    raise ValueError(f"axis={axis!r} is not an axis of the mesh {dict(mesh.shape)}; pass the "
                     "name of its data-parallel axis.")
  if inputs.shape[0] % mesh.shape[axis]:
    raise ValueError(f"The batch ({inputs.shape[0]} rows) does not divide by the mesh's "
                     f"{axis!r} axis ({mesh.shape[axis]}); pad the batch to a multiple of it.")


def decode(scorer: Scorer, inputs: Array, rng: Array, *, mesh: Mesh, max_decode_len: int,
           warp: Warp, eos_id: int, axis: str = "data") -> DecodeOutput:
  """`baseline.decode` with rows split over `mesh`'s `axis`.

  Args:
    scorer: the model side, replicated on every device (its parameters as
      given: raw ones are prepared on each shard, inside the program).
    inputs: int32 `[batch, input_len]`, checked; batch must divide by the axis
      size (`check_split`).
    rng: one PRNG key; shard i uses `fold_in(rng, i)`.
    mesh: the device mesh; other axes than `axis` hold replicas.
    max_decode_len, warp, eos_id: as in `baseline.decode`.
    axis: the mesh axis the rows are split over.

  Returns:
    `DecodeOutput`, sharded over `axis` by rows.

  Raises:
    ValueError: the batch does not split (`check_split`).
  """
  check_split(inputs, mesh, axis)
  return _decode(scorer, inputs, rng, mesh=mesh, axis=axis, max_decode_len=max_decode_len,
                 warp=warp, eos_id=eos_id)


@functools.partial(jax.jit, static_argnames=("mesh", "axis", "max_decode_len", "warp", "eos_id"))
def _decode(scorer: Scorer, inputs: Array, rng: Array, *, mesh: Mesh, axis: str,
            max_decode_len: int, warp: Warp, eos_id: int) -> DecodeOutput:
  def shard(scorer: Scorer, inputs: Array, rng: Array) -> DecodeOutput:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis))
    return baseline.decode(scorer, inputs, rng, max_decode_len=max_decode_len, warp=warp,
                           eos_id=eos_id)

  return jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(axis), P()), out_specs=P(axis),
                       check_vma=False)(scorer, inputs, rng)


def speculative_decode(target: Scorer, draft: Draft, inputs: Array, rng: Array, *, mesh: Mesh,
                       gamma: int, max_decode_len: int, warp: Warp, eos_id: int,
                       draft_inputs: Array, axis: str = "data") -> SpeculativeOutput:
  """`speculative.speculative_decode` with rows split over `mesh`'s `axis`.

  Args:
    target: the target's `Scorer`, replicated on every device (its parameters
      as given: raw ones are prepared on each shard, inside the program).
    draft: a `drafts.Draft`, replicated.
    inputs: int32 `[batch, input_len]`, checked; batch must divide by the axis
      size (`check_split`).
    rng: one PRNG key; shard i uses `fold_in(rng, i)`.
    mesh: the device mesh; other axes than `axis` hold replicas.
    gamma, max_decode_len, warp, eos_id: as in `speculative.speculative_decode`.
    draft_inputs: int32 `[batch, draft_input_len]`, the draft's encoder tokens,
      one row per row of `inputs`; split over `axis` like them.
    axis: the mesh axis the rows are split over.

  Returns:
    `SpeculativeOutput`, sharded over `axis` by rows;
    `stats.loop_iterations` is the largest count of any shard (the slowest).

  Raises:
    ValueError: the batch does not split (`check_split`).
  """
  check_split(inputs, mesh, axis)
  return _speculative_decode(target, draft, inputs, draft_inputs, rng, mesh=mesh, axis=axis,
                             gamma=gamma, max_decode_len=max_decode_len, warp=warp,
                             eos_id=eos_id)


@functools.partial(jax.jit, static_argnames=("mesh", "axis", "gamma", "max_decode_len", "warp",
                                             "eos_id"))
def _speculative_decode(target: Scorer, draft: Draft, inputs: Array, draft_inputs: Array,
                        rng: Array, *, mesh: Mesh, axis: str, gamma: int, max_decode_len: int,
                        warp: Warp, eos_id: int) -> SpeculativeOutput:
  def shard(target: Scorer, draft: Draft, inputs: Array, draft_inputs: Array,
            rng: Array) -> SpeculativeOutput:
    rng = jax.random.fold_in(rng, jax.lax.axis_index(axis))
    out = speculative.speculative_decode(
        target, draft, inputs, rng, gamma=gamma, max_decode_len=max_decode_len, warp=warp,
        eos_id=eos_id, draft_inputs=draft_inputs)
    # A scalar per shard cannot leave shard_map unsplit: stack them as [shards].
    return out.replace(stats=out.stats.replace(loop_iterations=out.stats.loop_iterations[None]))

  out = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(), P(axis), P(axis), P()),
                      out_specs=P(axis), check_vma=False)(target, draft, inputs, draft_inputs,
                                                          rng)
  return out.replace(stats=out.stats.replace(loop_iterations=out.stats.loop_iterations.max()))
