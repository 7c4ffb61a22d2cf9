"""A weight product for cached decoding on XLA:CPU, as an XLA FFI custom call.

A decoder call multiplies a few rows (batch x chunk length) by every weight
matrix, so its cost is reading the weights. XLA:CPU (jaxlib 0.10) reads them
well for one row but on one thread (its GEMV), and its products of 2-8 rows
cost 1.5-1.9X a one-row one: a verification chunk is not free where it should
be. `panel_dot.cc` reads each weight from memory once per call for any number of
rows, from weights stored as `[N / P, K, P]` panels (`pack`: one contiguous walk
down K per P output columns, done once per parameter set by
each family's `prepare`), and shares the panels between the calling thread
and helper threads that stay awake between the products of a decoder step
(as many as XLA's intra-op pool has beyond the caller), so both decoders use
every core. The panel width P is the build's (`panel_width`): two vector
registers of columns with AVX2, four with AVX-512, so that six rows' sums of a
panel stay in registers, and up to 14 rows' of its column halves: a
verification of up to 14 tokens reads each weight once. Panels are float16
where that holds every weight exactly (checkpoints stored in float16, as ours
are), widened to float32 in registers: half the bytes to read for the same
products; float32 otherwise.

The library is compiled on first use by the machine's C++ compiler (`$CXX`,
else `g++`) for the CPU it runs on (`-march=native`), into
`$SPECDEC_KERNEL_CACHE` (else `~/.cache/specdec_jax`) under a name that hashes
the source, the flags, jaxlib's version and the CPU, and is written
atomically, so concurrent first uses are safe. Where it cannot be built,
`available()` is False, `status()` says why, and `DecodeOptions.for_backend`
keeps XLA's dots (as it does with `$SPECDEC_PANEL_DOT=0`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
from absl import logging

Array = jax.Array

TARGET = "specdec_panel_dot"
TARGET_F16 = "specdec_panel_dot_f16"
SOURCE = pathlib.Path(__file__).with_name("panel_dot.cc")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")

_lock = threading.Lock()
_status: list[str] = []  # Set once per process: "ready: <library>" or the reason it is not.
_width: list[int] = []  # The built library's panel width, once it is ready.


def _cpu_identity() -> str:
  """The CPU's model name and feature flags (what -march=native compiles for)."""
  try:
    with open("/proc/cpuinfo") as f:
      lines = [line for line in f if line.startswith(("model name", "flags"))]
    return "".join(sorted(set(lines)))
  except OSError:
    return os.uname().machine


def _library_path(source: bytes, compiler: str) -> pathlib.Path:
  key = hashlib.sha256()
  for part in (source, " ".join(FLAGS).encode(), compiler.encode(),
               jaxlib.__version__.encode(), _cpu_identity().encode()):
    key.update(part)
  cache = os.environ.get("SPECDEC_KERNEL_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "specdec_jax")
  return pathlib.Path(cache) / f"panel_dot-{key.hexdigest()[:16]}.so"


def _compile(source: bytes) -> pathlib.Path | str:
  """The library built from `source` (cached), or "off: <why>"."""
  compiler = shutil.which(os.environ.get("CXX", "g++"))
  if compiler is None:
    return f"off: no C++ compiler ({os.environ.get('CXX', 'g++')!r} not found; set $CXX)"
  path = _library_path(source, compiler)
  if path.exists():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  work = tempfile.mkdtemp(dir=path.parent)
  try:
    # Compiled where the source lies, for the compiler's messages to name it.
    source_path = os.path.join(work, SOURCE.name)
    with open(source_path, "wb") as f:
      f.write(source)
    tmp = os.path.join(work, "panel_dot.so")
    done = subprocess.run(
        [compiler, *FLAGS, "-w", "-I", jax.ffi.include_dir(), source_path, "-o", tmp],
        capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
      return f"off: {compiler} failed: {done.stderr.strip()[-500:]}"
    os.replace(tmp, path)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return path


def _register(path: pathlib.Path) -> int:
  """Registers the library's two products as `TARGET`, `TARGET_F16`; returns its panel
  width."""
  library = ctypes.cdll.LoadLibrary(str(path))
  jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.SpecdecPanelDot),
                              platform="cpu")
  jax.ffi.register_ffi_target(TARGET_F16, jax.ffi.pycapsule(library.SpecdecPanelDotF16),
                              platform="cpu")
  library.SpecdecPanelWidth.restype = ctypes.c_int64
  return int(library.SpecdecPanelWidth())


def _build() -> str:
  """Builds (if needed) and registers the library; returns the status line."""
  path = _compile(SOURCE.read_bytes())
  if isinstance(path, str):
    return path
  _width.append(_register(path))
  return f"ready: {path}"


def status() -> str:
  """"ready: <library path>", or "off: <why>" (built and registered on first call)."""
  with _lock:
    if not _status:
      try:
        _status.append(_build())
      except (OSError, subprocess.SubprocessError) as e:
        _status.append(f"off: {type(e).__name__}: {e}")
      if not _status[0].startswith("ready"):
        logging.warning("panel_dot %s; decoding uses XLA's dots.", _status[0])
    return _status[0]


def available() -> bool:
  """Whether the custom call is built and registered (builds it on first call)."""
  return status().startswith("ready")


def panel_width() -> int:
  """P, the output columns per panel of the built library (needs `available()`)."""
  if not available():
    raise RuntimeError(f"panel_dot is {status()}: there is no panel width.")
  return _width[0]


def packable(kernel: Array) -> bool:
  """Whether a `[K, N]` weight can be packed: float32 and N a multiple of `panel_width()`."""
  return (kernel.ndim == 2 and kernel.dtype == jnp.float32
          and kernel.shape[1] % panel_width() == 0)


def pack(kernel: Array, half: bool = False) -> Array:
  """`[K, N]` -> `[N / P, K, P]` panels, P = `panel_width()` (`packable(kernel)` must hold).

  Args:
    kernel: float32 `[K, N]`.
    half: store the panels in float16. Lossless only where float16 holds every
      weight exactly (`exact_in_half`): then the products are the float32 panels',
      bit for bit, for half the bytes read.

  Returns:
    float32, or float16 with `half`, `[N / P, K, P]`.
  """
  k, n = kernel.shape
  width = panel_width()
  panels = kernel.reshape(k, n // width, width).transpose(1, 0, 2)
  return panels.astype(jnp.float16) if half else panels


def exact_in_half(tree: Any) -> bool:
  """Whether float16 holds every float32 array of `tree` exactly (a checkpoint saved in
  float16 and loaded as float32 does); False where a leaf is traced (values unknown)."""
  leaves = jax.tree.leaves(tree)
  if any(isinstance(x, jax.core.Tracer) for x in leaves):
    return False

  def exact(x: Array) -> bool:
    x = jnp.asarray(x)
    return x.dtype != jnp.float32 or bool(jnp.all(x.astype(jnp.float16).astype(x.dtype) == x))

  return all(exact(x) for x in leaves)


def unpack(panels: Array) -> Array:
  """`pack`'s inverse: `[N / P, K, P]` -> float32 `[K, N]`."""
  p, k, width = panels.shape
  return panels.transpose(1, 0, 2).reshape(k, p * width).astype(jnp.float32)


def dot(x: Array, panels: Array) -> Array:
  """`x [..., K] @ unpack(panels)` -> float32 `[..., N]` (needs `available()`)."""
  p, k, width = panels.shape
  if x.shape[-1] != k:
    raise ValueError(f"panel_dot.dot: x has {x.shape[-1]} features, the panels {k}.")
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (p * width,), jnp.float32)
  target = TARGET_F16 if panels.dtype == jnp.float16 else TARGET
  return jax.ffi.ffi_call(target, out, vmap_method="sequential")(x.astype(jnp.float32), panels)
