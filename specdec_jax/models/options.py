"""How a model's cached decoder runs: one frozen value, chosen once when the model is loaded.

`DecodeOptions` names everything that used to be a switch: which kernel
multiplies the weights (`panel_dot`'s custom call or XLA's dots), whether
panels are stored in float16, how many rows a call multiplies row by row,
the layout of the keys and values, and the XLA options of the decoding loops'
programs. A model holds it as a static field (`T5Model.options`,
`LlamaModel.options`), so a compiled program depends on it like on the
config, and the signature says what runs. `DecodeOptions.for_backend()` picks
the options this project measured best for a backend; it is the one place
that reads the environment (`$SPECDEC_PANEL_DOT`) and builds the kernel, and
it runs when a model is created, never inside a decoder call.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax

from specdec_jax.models import panel_dot

# The weight kernels: XLA's own dots, or `panel_dot`'s custom call on packed panels.
WEIGHT_KERNELS = ("xla", "panel_dot")

# XLA options for the programs that run decoding loops on XLA:CPU (jaxlib
# 0.10). Dots with 2-16 rows (a verification chunk, a small batch) otherwise go
# to YNNPACK, which costs 1.3-1.6X XLA's own emitter there (2-core Zen 4,
# results/decode_step); one-row dots never do. The dots left to XLA in a
# decoder call (attention over the cache) are a few microseconds of work that
# Eigen would split between threads: of 2-8 query rows, single-threaded costs
# 0.4-0.6X as much (2-core Zen 3; the weight products are panel_dot's, which
# shares its own work between the threads). Encoders run as their own programs
# and keep the defaults (YNNPACK and threads win at input_len rows).
CPU_COMPILER_OPTIONS = (("xla_cpu_experimental_ynn_fusion_type", ""),
                        ("xla_cpu_multi_thread_eigen", False))

# On XLA:CPU a 2-row product costs 1.8X a one-row one, two one-row products
# 1.5X: the target's 2-token call (a verification at gamma = 1, a draft's
# catch-up chunk) drops from 1.83 to 1.52 one-token steps, its batch-2 step
# from 1.9X to 1.6X a batch-1 step; from 3 rows one product wins (2-core Zen 4,
# measured side by side in commit 17c2e6a's benchmark_decode_step).
# Accelerators read every weight once per product, so they keep one product.
CPU_ROW_DOTS_MAX_ROWS = 2


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """The options of a model's cached decoder (hashable: part of a static model).

  `DecodeOptions()` runs on any backend: XLA's dots, one matrix product per
  call, merged heads, no compiler options. A model created without options
  gets `for_backend()`'s for the default backend and one device.

  Attributes:
    weight_kernel: "panel_dot" (`prepare` packs every float32 matrix whose
      width divides by the panel width into `[N / P, K, P]` panels and
      `panel_dot.dot` multiplies them: XLA:CPU only, the kernel must be built,
      `panel_dot.available()`) or "xla" (`[K, N]` matrices and XLA's dots).
    half_panels: with "panel_dot", panels are float16 where float16 holds
      every weight of the parameter tree exactly (a checkpoint saved in
      float16): half the bytes per call for bit-identical products.
    row_dots_max_rows: the most rows (batch * k) a decoder call multiplies by
      an unpacked weight one row at a time (a row-vector product per row)
      rather than in one matrix product; 1: never.
    split_heads: keys and values keep batch and heads apart (`[batch, heads,
      d_kv, len]`, which GSPMD can split over both: for a mesh of more than
      one device) rather than merged (`[batch * heads, d_kv, len]`, the layout
      XLA:CPU's dots read without copies).
    compiler_options: XLA options, as sorted `(name, value)` pairs, of the
      programs that run decoding loops over the model (`decoding.programs`);
      a dict is accepted and sorted.

  Raises:
    ValueError: from the constructor, for an unknown kernel, float16 panels
      without panels, or `row_dots_max_rows` below 1.
  """

  weight_kernel: str = "xla"
  half_panels: bool = False
  row_dots_max_rows: int = 1
  split_heads: bool = False
  compiler_options: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    if self.weight_kernel not in WEIGHT_KERNELS:
      raise ValueError(f"weight_kernel must be one of {WEIGHT_KERNELS}, got "
                       f"{self.weight_kernel!r}.")
    if self.half_panels and self.weight_kernel != "panel_dot":
      raise ValueError("half_panels needs weight_kernel='panel_dot' (float16 panels are "
                       "panel_dot's).")
    if isinstance(self.row_dots_max_rows, bool) or not isinstance(self.row_dots_max_rows, int) \
        or self.row_dots_max_rows < 1:
      raise ValueError(f"row_dots_max_rows must be an int >= 1 (1: one product per call), got "
                       f"{self.row_dots_max_rows!r}.")
    options = self.compiler_options
    if isinstance(options, Mapping):
      options = options.items()
    object.__setattr__(self, "compiler_options", tuple(sorted(options)))

  @classmethod
  def for_backend(cls, backend: str | None = None, *, devices: int = 1,
                  environ: Mapping[str, str] | None = None) -> DecodeOptions:
    """The options measured best for `backend` and `devices`, read once, here.

    Args:
      backend: "cpu", "gpu", "tpu", ... (default: `jax.default_backend()`).
      devices: the devices of the mesh the model runs on; more than one keeps
        batch and heads apart and multiplies with XLA's dots (GSPMD splits them).
      environ: the environment to read (default `os.environ`):
        `SPECDEC_PANEL_DOT=0` keeps XLA's dots on CPU.

    Returns:
      On XLA:CPU with one device: `panel_dot` (float16 panels where exact) if
      the kernel builds (`panel_dot.status()` says why not), two-row calls row
      by row, `CPU_COMPILER_OPTIONS`. Elsewhere XLA's dots, one product per
      call and no compiler options.
    """
    backend = jax.default_backend() if backend is None else backend
    environ = os.environ if environ is None else environ
    split = devices > 1
    if backend != "cpu":
      return cls(split_heads=split)
    panels = (not split and environ.get("SPECDEC_PANEL_DOT", "1") != "0"
              and panel_dot.available())
    return cls(weight_kernel="panel_dot" if panels else "xla", half_panels=panels,
               row_dots_max_rows=CPU_ROW_DOTS_MAX_ROWS, split_heads=split,
               compiler_options=CPU_COMPILER_OPTIONS)

  def replace(self, **changes: Any) -> DecodeOptions:
    """A copy with `changes` (checked again)."""
    return dataclasses.replace(self, **changes)

  @property
  def packs_panels(self) -> bool:
    """Whether `prepare` packs weights into `panel_dot`'s panels."""
    return self.weight_kernel == "panel_dot"

  def row_dots(self, rows: int) -> bool:
    """Whether a call on `rows` (batch * k) rows multiplies unpacked weights row by row."""
    return 1 < rows <= self.row_dots_max_rows

  def provenance(self) -> dict[str, str]:
    """What a results file records of how the model ran (`benchmarking.environment`)."""
    return {"weight_dots": self.weight_kernel, "decode_options": self.describe(),
            "panel_dot": panel_dot.status()}

  def describe(self) -> str:
    """One line for a results file: the kernel, the panels' dtype, the layout."""
    kernel = ("panel_dot (float16 panels where exact)" if self.half_panels
              else self.weight_kernel)
    layout = "batch and heads apart" if self.split_heads else "batch and heads merged"
    return (f"{kernel}; row by row up to {self.row_dots_max_rows} rows; {layout}; "
            f"compiler options {dict(self.compiler_options)}")
