"""Device meshes, T5X-style logical axis rules, and shardings of params, batches and caches.

Model parallelism follows T5X / Megatron: every array dimension carries a
*logical* axis name ("batch", "heads", "mlp", "vocab", "embed", ...) and a
table of rules maps logical names to the axes of a `(data, model)` device mesh.
With the default rules the batch is split over "data"; attention heads, MLP
hidden units and the vocabulary over "model"; everything else is replicated.

The logical axes are declared where each parameter is created
(`models.layers.declare`); `param_shardings` reads them from the model
(`T5Model.param_info()`) and maps them by the rules, so a parameter without
declared axes cannot be sharded, and none is matched by its name.

Decoding runs under `jax.jit` with the parameters placed by `shard_params`,
inside `jax.set_mesh(mesh)` (JAX's successor of `with mesh:`): GSPMD partitions
the whole generation loop. A model built with rules (`T5Model(cfg,
axis_rules=DEFAULT_RULES)`) constrains the KV caches and cross-attention
keys/values where it creates them (`kernels.KEY_AXES` / `VALUE_AXES`);
without, propagation from the sharded kernels splits them the same way (the
tests check the compiled per-device shapes). A model for a mesh takes
`DecodeOptions.for_backend(devices=mesh.size)`: its caches keep batch and heads
apart (`[batch, heads, d_kv, max_len]`, `DecodeOptions.split_heads`), so both
can be split, and its weights stay `[K, N]` for XLA's dots; on one device they
are merged (`[batch * heads, d_kv, max_len]`, the layout XLA:CPU's dots read
without copies).

`make_mesh`, `axis_rules` and `draft_axis_rules` are gin-configurable: a command
calls them once, where it assembles its objects (`experiment.gin_flags.placement`), and
passes the `Placement` down; nothing below calls them, and a function here that is given
no rules uses `DEFAULT_RULES` (what `axis_rules()` gives when gin binds none of it).

Example:

  mesh = make_mesh(data=2, model=4)
  model = T5Model(cfg, axis_rules=axis_rules(),
                  options=DecodeOptions.for_backend(devices=mesh.size))
  params = shard_params(model, params, mesh)
  with jax.set_mesh(mesh):
    out = temperature_sample(model, params, shard_batch(inputs, mesh), max_decode_len=64)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import gin
import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from specdec_jax.models.layers import LogicalAxes, LogicalRules
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import SharedEncoderModel, T5Config, T5Model

Array = jax.Array
Model = T5Model | SharedEncoderModel

MESH_AXES = ("data", "model")
# `axis_rules()` with none of its arguments bound: batch over "data"; heads, MLP units and
# vocabulary over "model"; the rest replicated.
DEFAULT_RULES: LogicalRules = (
    ("batch", "data"), ("heads", "model"), ("mlp", "model"), ("vocab", "model"),
    ("embed", None), ("length", None), ("kv", None), ("relpos_buckets", None))
# `draft_axis_rules()` unbound: the batch over "data", the rest replicated.
DEFAULT_DRAFT_RULES: LogicalRules = tuple(
    (name, "data" if name == "batch" else None) for name, _ in DEFAULT_RULES)


@gin.configurable
def axis_rules(*, batch: str | None = "data", heads: str | None = "model",
               mlp: str | None = "model", vocab: str | None = "model",
               embed: str | None = None, length: str | None = None, kv: str | None = None,
               relpos_buckets: str | None = None) -> LogicalRules:
  """Logical axis -> mesh axis ("data", "model", or None: replicated).

  Args:
    batch: rows of a batch (and of the KV caches).
    heads: attention heads (q/k/v kernels' output, out kernel's input, caches).
    mlp: MLP hidden units.
    vocab: the vocabulary (embedding rows, logits columns).
    embed: d_model.
    length: sequence positions.
    kv: d_kv, the per-head width.
    relpos_buckets: relative position buckets.

  Returns:
    The rules: (logical axis, mesh axis or None) pairs, T5X's format.
  """
  rules = dict(batch=batch, heads=heads, mlp=mlp, vocab=vocab, embed=embed, length=length,
               kv=kv, relpos_buckets=relpos_buckets)
  for name, axis in rules.items():
    if axis not in (*MESH_AXES, None):
      raise ValueError(f"axis_rules: {name}={axis!r}; use one of {MESH_AXES} or None.")
  return tuple(rules.items())


@gin.configurable
def draft_axis_rules(rules: LogicalRules = DEFAULT_RULES, *, heads: str | None = None,
                     mlp: str | None = None, vocab: str | None = None) -> LogicalRules:
  """Rules for draft models: the target's `rules` but replicating heads, MLP and vocab by
  default.

  Drafts are small (Flan-T5-small has 6 heads, which no model axis of 4 or 8
  divides) and fast; splitting them would add collectives to every draft step.

  Args:
    rules: the target's rules (a command passes its `axis_rules()`).
    heads, mlp, vocab: the mesh axis of each for drafts (None: replicated).
  """
  return tuple((name, {"heads": heads, "mlp": mlp, "vocab": vocab}.get(name, axis))
               for name, axis in rules)


@gin.configurable
def make_mesh(data: int | None = None, model: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `(data, model)` mesh over `devices` (default: all devices, of every process).

  Axes are `AxisType.Auto` (GSPMD propagation), not JAX's newer default Explicit.

  Args:
    data: size of the data-parallel axis (batch rows are split over it); default:
      the number of devices / `model`.
    model: size of the model-parallel axis (heads, MLP units, vocab).
    devices: the devices to use; their number must be `data * model`.
  """
  return _mesh(jax.devices() if devices is None else list(devices), data, model)


def _mesh(devices: list[jax.Device], data: int | None, model: int) -> Mesh:
  """`make_mesh` of its arguments, `devices` given."""
  data = len(devices) // max(model, 1) if data is None else data
  if data < 1 or model < 1:
    raise ValueError(f"make_mesh: data={data} and model={model} must both be >= 1 (model may "
                     f"be at most the device count, {len(devices)}).")
  if data * model != len(devices):
    raise ValueError(
        f"make_mesh: data * model = {data} * {model} = {data * model}, but there are "
        f"{len(devices)} devices; choose data and model whose product is {len(devices)} (on "
        "CPU, simulate devices with XLA_FLAGS=--xla_force_host_platform_device_count=N).")
  return jax.make_mesh((data, model), MESH_AXES, axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a run's arrays live: the device mesh, and the rules its target and drafts are
  sharded by.

  A command builds it once from gin (`experiment.gin_flags.placement`: `make_mesh()`,
  `axis_rules()`, `draft_axis_rules(rules)`) and passes it down; the library reads these
  fields and calls none of those.

  Attributes:
    mesh: the `(data, model)` device mesh.
    rules: the target's logical axis rules (its parameters, caches and the input batches).
    draft_rules: the drafts' rules (by default heads, MLP and vocab replicated).
  """

  mesh: Mesh
  rules: LogicalRules = DEFAULT_RULES
  draft_rules: LogicalRules = DEFAULT_DRAFT_RULES

  @classmethod
  def data_parallel(cls, devices: Sequence[jax.Device] | None = None) -> Placement:
    """Every device (default: all, of every process) on the data axis, the default rules:
    what `gin_flags.placement` builds when gin binds none of its configurables."""
    return cls(_mesh(jax.devices() if devices is None else list(devices), None, 1))


def logical_to_spec(axes: LogicalAxes, rules: LogicalRules | None = None) -> PartitionSpec:
  """Logical axis names (None: replicated) -> a `PartitionSpec` of mesh axes."""
  table = dict(rules or DEFAULT_RULES)
  unknown = [a for a in axes if a is not None and a not in table]
  if unknown:
    raise ValueError(f"Logical axes {unknown} have no rule; known: {sorted(table)}.")
  return PartitionSpec(*(None if a is None else table[a] for a in axes))


def _sharding(shape: tuple[int, ...], axes: LogicalAxes, mesh: Mesh | AbstractMesh,
              rules: LogicalRules,
              what: str) -> NamedSharding:
  spec = logical_to_spec(axes, rules)
  for size, axis, logical in zip(shape, spec, axes, strict=True):
    if axis is not None and size % mesh.shape[axis]:
      raise ValueError(
          f"{what}: dimension '{logical}' of size {size} does not divide by the mesh's "
          f"'{axis}' axis ({mesh.shape[axis]}); choose a mesh whose '{axis}' size divides "
          f"{size}, or replicate it with axis_rules({logical}=None).")
  return NamedSharding(mesh, spec)


def check_model_fits(config: T5Config, mesh: Mesh | AbstractMesh,
                     rules: LogicalRules | None = None) -> None:
  """Raises ValueError if the heads (or another split dimension) don't divide the mesh
  (`rules`: default `DEFAULT_RULES`)."""
  table = dict(rules or DEFAULT_RULES)
  for name, size in (("heads", config.num_heads), ("mlp", config.d_ff),
                     ("vocab", config.vocab_size)):
    axis = table.get(name)
    if axis is not None and size % mesh.shape[axis]:
      field = {"heads": "num_heads", "mlp": "d_ff", "vocab": "vocab_size"}[name]
      raise ValueError(
          f"{field}={size} does not divide by the mesh's '{axis}' axis ({mesh.shape[axis]}); "
          f"use a '{axis}' size that divides {size}, or axis_rules({name}=None) to replicate "
          f"'{name}'.")


def param_shardings(model: Model, mesh: Mesh | AbstractMesh,
                    rules: LogicalRules | None = None) -> dict:
  """A `NamedSharding` per parameter of `model`, from its declared logical axes.

  Args:
    model: the model (`param_info()` gives each parameter's shape and axes).
    mesh: the mesh (an `AbstractMesh` suffices).
    rules: logical axis rules; default `model.axis_rules`, else `DEFAULT_RULES`.

  Returns:
    The parameter tree with a `NamedSharding` per leaf.

  Raises:
    ValueError: a split dimension does not divide by its mesh axis; the heads are
      checked through the relative-position tables `[heads, buckets]`.
  """
  rules = rules or model.axis_rules or DEFAULT_RULES
  return jax.tree_util.tree_map_with_path(
      lambda path, p: _sharding(p.shape, p.axes, mesh, rules, jax.tree_util.keystr(path)),
      model.param_info())


def batch_sharding(mesh: Mesh, rules: LogicalRules | None = None) -> NamedSharding:
  """Sharding of `[batch, length]` token arrays."""
  return NamedSharding(mesh, logical_to_spec(("batch", "length"), rules))


def _put(x: Array | np.ndarray, sharding: NamedSharding) -> Array:
  """`jax.device_put`, or, across processes, assembled from each process's full copy."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _leaf_names(tree: dict) -> set[str]:
  return {jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)}


def shard_params(model: Model, params: dict, mesh: Mesh,
                 rules: LogicalRules | None = None) -> dict:
  """Places every parameter of `model` on `mesh` by its declared axes and the rules.

  Args:
    model: the model whose parameters these are.
    params: its parameter tree (each process passes the full tree).
    mesh: the device mesh.
    rules: default `model.axis_rules`, else `DEFAULT_RULES`; give the model the
      rules its parameters are sharded by, so that its caches follow them.

  Returns:
    The tree of global arrays, one per parameter.

  Raises:
    ValueError: `params` is not `model`'s tree, or a split dimension does not
      divide by its mesh axis.
  """
  shardings = param_shardings(model, mesh, rules)
  got, want = (_leaf_names(tree) for tree in (params, shardings))
  if got != want:
    raise ValueError(f"shard_params: params are not {type(model).__name__}'s tree: unknown "
                     f"{sorted(got - want)[:5]}, missing {sorted(want - got)[:5]}; pass the "
                     "model these parameters belong to.")
  return jax.tree_util.tree_map(_put, params, shardings)


def shard_batch(tokens: Array | np.ndarray, mesh: Mesh,
                rules: LogicalRules | None = None) -> Array:
  """Places `[batch, length]` tokens on `mesh`, rows split as `rules` (default
  `DEFAULT_RULES`: over "data") say."""
  sharding = batch_sharding(mesh, rules)
  _sharding(tokens.shape, ("batch", "length"), mesh, rules or DEFAULT_RULES, "inputs")
  return _put(tokens, sharding)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Per-device bytes of one model's decoding state.

  Attributes:
    params: parameter bytes on one device.
    kv_cache: self-attention cache bytes on one device (`max_len` positions).
    cross_kv: cross-attention keys/values of the encoded inputs on one device.
  """

  params: int
  kv_cache: int
  cross_kv: int

  @property
  def total(self) -> int:
    return self.params + self.kv_cache + self.cross_kv


def estimate_memory(config: T5Config, mesh: Mesh | tuple[int, int], batch: int, max_len: int,
                    input_len: int | None = None,
                    rules: LogicalRules | None = None) -> MemoryEstimate:
  """Per-device memory of decoding with `config` on a `(data, model)` mesh.

  Counts the parameters (each split as the rules split it) and the KV caches
  (`[batch, max_len, heads, d_kv]` self-attention per decoder layer, twice; and
  the same for cross-attention over `input_len` positions), but not activations
  or XLA's temporaries (small at decoding time: one chunk of tokens).

  Args:
    config: the model.
    mesh: a `Mesh` or its `(data, model)` shape (no devices needed).
    batch: global batch size.
    max_len: cache positions (for speculative decoding: max_decode_len + gamma + 1).
    input_len: encoder input length (default `max_len`).
    rules: logical axis rules (default `DEFAULT_RULES`).
  """
  shape = dict(mesh.shape) if isinstance(mesh, Mesh) else dict(zip(MESH_AXES, mesh, strict=True))
  table = dict(rules or DEFAULT_RULES)

  def split(axes: LogicalAxes) -> int:
    return math.prod(shape[table[a]] for a in axes if a is not None and table.get(a))

  param_bytes = sum(math.prod(p.shape) * p.dtype.itemsize // split(p.axes)
                    for p in jax.tree_util.tree_leaves(
                        T5Model(config, options=DecodeOptions()).param_info()))
  per_position = (config.num_heads * config.d_kv * config.compute_dtype.itemsize * 2
                  * config.num_decoder_layers)  # K and V, every decoder layer.
  rows = math.ceil(batch / shape[table["batch"]]) if table["batch"] else batch
  per_position //= split(("heads",))
  input_len = max_len if input_len is None else input_len
  return MemoryEstimate(param_bytes, rows * max_len * per_position,
                        rows * input_len * per_position)
