"""Where a compiled program's time goes, op by op, on XLA:CPU.

The account of a decoding loop (`account`): every op of the compiled program
is listed from its optimized HLO with its kind (a weight product, an attention
dot, a cache write, a reduction, ...) and its phase, the innermost
`jax.named_scope` of the loop that made it (`PHASES`: the speculative loop's
"init" before it, and its step's "draft", "verify", "accept", "write",
"rewind"; the baseline step's "score", "sample", "write"); the program then
runs under `jax.profiler` with XLA:CPU's per-op trace events, so each op's time
is summed into its
(phase, kind). The traced run is slower than an untraced one (the profiler's
own cost per op), so the account reports both: the untraced wall time per
iteration, and the traced time of each part with its share.

Per-op trace events need `--xla_cpu_enable_xprof_traceme=true` in `XLA_FLAGS`
before JAX starts (`enable_op_tracing`); the commands that profile set it at
import. Timings must be taken on a quiet machine (`contention.quiet`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax

TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"

# The named scopes of the loops (speculative._speculative_step and its set-up,
# baseline._sampling_step).
PHASES = ("init", "draft", "verify", "accept", "write", "rewind", "score", "sample")
OUTSIDE = "loop control"  # Ops of no phase: the loop's condition, copies of its state.
FREE = ("get-tuple-element", "constant", "parameter", "tuple", "bitcast")  # No thunk.
CONTROL = ("while", "conditional", "call")  # Their events span the ops they run.


def enable_op_tracing() -> None:
  """Adds `TRACE_FLAG` to `XLA_FLAGS`; call before JAX initialises its backend."""
  flags = os.environ.get("XLA_FLAGS", "")
  if TRACE_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {TRACE_FLAG}".strip()


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of an optimized HLO module.

  Attributes:
    name: the instruction's name (what the trace events carry).
    opcode: its HLO opcode (`fusion`, `custom-call`, `dot`, ...).
    shape: its output shape, as printed (e.g. `f32[1,4,8192]{2,1,0}`).
    op_name: the JAX name stack of its metadata ("" if none).
  """

  name: str
  opcode: str
  shape: str
  op_name: str

  @property
  def phase(self) -> str:
    """The innermost loop phase its name stack lies in, or `OUTSIDE`."""
    parts = self.op_name.split("/")
    for part in reversed(parts):
      if part in PHASES:
        return part
    return OUTSIDE

  @property
  def kind(self) -> str:
    """What the op does, from its opcode, its name (a fusion's names what it fuses) and
    its output shape."""
    name, opcode = self.name, self.opcode
    text = f"{name} {opcode}"
    if opcode == "custom-call" and name.startswith("ffi_call"):
      return "weight products (panel_dot)"
    if opcode == "dot" or name.startswith(("dot", "ynn_fusion")):
      return "attention dots" if self.shape.count(",") >= 2 else "weight products (XLA)"
    if "dynamic-update-slice" in text or "scatter" in text:
      return "cache / buffer writes"
    if "gather" in text:
      return "gathers"
    if any(op in text for op in ("reduce", "rsqrt", "exponential", "divide")):
      return "norms, softmax, reductions"
    if opcode == "copy" or name.startswith("copy"):
      return "copies"
    return "elementwise"


_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([\w\-]+)\(")


def _control_flow_computations(hlo: str) -> set[str]:
  """The computations that while loops, conditionals and calls in `hlo` run."""
  names = set(re.findall(r"\b(?:body|condition)=%?([\w.\-]+)", hlo))
  for group in re.findall(r"branch_computations=\{([^}]*)\}", hlo):
    names.update(b.strip().lstrip("%") for b in group.split(","))
  names.update(re.findall(r" call\(.*?to_apply=%?([\w.\-]+)", hlo))
  return names


def parse_ops(hlo: str) -> dict[str, Op]:
  """Every instruction of `hlo` (an optimized module's text) that runs as its own op.

  Only the entry computation's instructions and those of the computations that
  control flow runs (while bodies and conditions, branches, calls) are ops of
  their own; a fusion's body, a reducer or a comparator runs inside its op.
  `FREE` and `CONTROL` instructions are left out. An op that
  XLA made without a JAX name stack (e.g. the partial sums it splits a long
  reduction into) takes the one of the op before it in its computation, which
  the schedule runs just before it.
  """
  run = _control_flow_computations(hlo)
  ops, runs, previous = {}, False, ""
  for line in hlo.splitlines():
    if line and not line.startswith(" "):  # A computation's header (or its closing brace).
      header = line.split(" ")[0]
      runs = header == "ENTRY" or header.lstrip("%") in run
      previous = ""
      continue
    m = _INSTRUCTION.match(line)
    if m is None or not runs or m.group(3) in FREE + CONTROL:
      continue
    op_name = re.search(r'op_name="([^"]*)"', line)
    previous = op_name.group(1) if op_name else previous
    ops[m.group(1)] = Op(m.group(1), m.group(3), m.group(2), previous)
  return ops


@dataclasses.dataclass(frozen=True)
class Account:
  """Where one program's time goes, per unit of work (an iteration, a call).

  Attributes:
    wall_us: untraced wall time per unit (median of the timed runs).
    traced_us: traced wall time per unit.
    ops: op count per unit, by `(phase, kind)`.
    op_us: traced op time per unit, by `(phase, kind)`.
  """

  wall_us: float
  traced_us: float
  ops: dict[tuple[str, str], float]
  op_us: dict[tuple[str, str], float]

  @property
  def busy_us(self) -> float:
    """Traced time inside ops; `traced_us - busy_us` is the runtime's time between them."""
    return sum(self.op_us.values())

  def by_phase(self) -> dict[str, float]:
    """Traced op time per phase, largest first."""
    out: dict[str, float] = collections.defaultdict(float)
    for (phase, _), us in self.op_us.items():
      out[phase] += us
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))

  def to_json(self) -> dict[str, Any]:
    key = lambda pk: f"{pk[0]} / {pk[1]}"  # noqa: E731
    return {"wall_us": self.wall_us, "traced_us": self.traced_us, "busy_us": self.busy_us,
            "between_ops_us": self.traced_us - self.busy_us, "by_phase_us": self.by_phase(),
            "ops": {key(k): v for k, v in sorted(self.ops.items())},
            "op_us": {key(k): v for k, v in sorted(self.op_us.items(), key=lambda kv: -kv[1])}}


def _timed_runs(fn: Callable[[], Any], runs: int) -> list[float]:
  out = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - start)
  return out


def account(fn: Callable[[], Any], hlo: str, units: float, *, runs: int = 5) -> Account:
  """Runs `fn` untraced, then traced, and sums each op's time into its (phase, kind).

  Args:
    fn: runs the compiled program once (already compiled and warm).
    hlo: the program's optimized HLO text (`jit(...).lower(...).compile().as_text()`).
    units: the units of work one run does (loop iterations, calls): every figure
      is per unit.
    runs: untraced and traced runs (medians for the wall times, means for ops).

  Returns:
    An `Account`.

  Raises:
    RuntimeError: if the trace holds no op of `hlo` (op tracing not enabled).
  """
  ops = parse_ops(hlo)
  wall = statistics.median(_timed_runs(fn, runs)) / units
  directory = tempfile.mkdtemp(prefix="specdec_profile_")
  try:
    jax.profiler.start_trace(directory)
    traced = statistics.median(_timed_runs(fn, runs)) / units
    jax.profiler.stop_trace()
    path = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)["traceEvents"]
  finally:
    shutil.rmtree(directory, ignore_errors=True)
  count: dict[tuple[str, str], float] = collections.defaultdict(float)
  time_us: dict[tuple[str, str], float] = collections.defaultdict(float)
  for e in events:
    op = ops.get(e.get("name", ""))
    if e.get("ph") != "X" or op is None:
      continue
    count[(op.phase, op.kind)] += 1 / (runs * units)
    time_us[(op.phase, op.kind)] += e["dur"] / (runs * units)
  if not time_us:
    raise RuntimeError(f"The trace holds none of the program's ops: set {TRACE_FLAG} in "
                       "XLA_FLAGS before JAX starts (profiling.enable_op_tracing).")
  return Account(1e6 * wall, 1e6 * traced, dict(count), dict(time_us))
