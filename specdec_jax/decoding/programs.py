"""The decoding loops' programs: compiled with the XLA options their scorer's model carries.

A loop over a `Scorer` (the baseline's, the speculative one, the timing loops
of `specdec_jax.costs.timing`) is one compiled program per scorer kind,
shapes and settings. The XLA options of that program are the model's
(`DecodeOptions.compiler_options`, e.g. on XLA:CPU those that keep YNNPACK
off small dots), read from the loop's first argument: a scorer or a draft
(`Scorer.compiler_options`, `Draft.compiler_options`). Nothing else chooses
them: two models with different options get two programs, side by side.

Within `compile_only()`, a top-level loop call compiles its program and
returns zeros in the shape of its outputs without running it: a timing's
warm-up then pays the compilation, not a whole decoding (jax keeps the
compiled program, and the next call with those shapes runs it).

A command that compiles program after program (a sweep's points, a ranking's
drafts) calls `drop_when_crowded` after each unit of work: it keeps the
programs a later unit may run again until the process nears the kernel's limit
on memory maps.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

CompilerOptions = tuple[tuple[str, Any], ...]

_mode = threading.local()  # `compile_only`'s switch, per thread.

# XLA:CPU maps memory for every program it compiles and unmaps it only when the program is
# dropped; past the kernel's limit on one process's maps (`vm.max_map_count`, 65,530 by
# default) LLVM fails to compile ('Cannot allocate memory'): a 160-point sweep in one process
# died so at its 45th point (6 speculative loops mapped ~3,800). Half the limit leaves room
# for the largest unit of work measured since.
MAPS_FRACTION = 0.5


@contextlib.contextmanager
def compile_only() -> Iterator[None]:
  """Within: top-level `loop_jit` calls compile and return zeros of their outputs' shapes.

  Nothing else changes: other jitted functions (a T5's encoder) run, and a call
  under an outer trace is traced as always. Use it for warm-ups whose outputs
  are thrown away.
  """
  previous = getattr(_mode, "compile_only", False)
  _mode.compile_only = True
  try:
    yield
  finally:
    _mode.compile_only = previous


def _compiled_zeros(program: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
  """Compiles `program` for these arguments (kept by jax for the next call) and returns
  zeros shaped, typed and placed as its outputs."""
  compiled = program.lower(*args, **kwargs).compile()
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype, device=s.sharding),
                      compiled.out_info)


def loop_jit(fn: Callable[..., Any], *, static_argnames: tuple[str, ...]) -> Callable[..., Any]:
  """`jax.jit(fn)`, compiled at top level with its first argument's `compiler_options`.

  `fn`'s first positional argument is a scorer or a draft (a pytree whose
  `compiler_options` is static). Compiler options can only be given to a
  top-level program, so a call under an outer trace (the data-parallel
  decoders, a user's `jit`) runs a plain `jax.jit(fn)` that the outer program
  inlines. Each set of options compiles and keeps its own program.

  Args:
    fn: the loop.
    static_argnames: `jax.jit`'s.

  Returns:
    The jitted loop, with `lower`, `_cache_size` (the programs compiled at top
    level, all options together) and `clear_cache`.
  """
  nested = jax.jit(fn, static_argnames=static_argnames)
  top_level: dict[CompilerOptions, Callable[..., Any]] = {}

  def top(first: Any) -> Callable[..., Any]:
    options = tuple(getattr(first, "compiler_options", ()))
    if options not in top_level:
      top_level[options] = jax.jit(fn, static_argnames=static_argnames,
                                   compiler_options=dict(options))
    return top_level[options]

  @functools.wraps(fn)
  def call(*args: Any, **kwargs: Any) -> Any:
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
      return nested(*args, **kwargs)
    if getattr(_mode, "compile_only", False):
      return _compiled_zeros(top(args[0]), *args, **kwargs)
    return top(args[0])(*args, **kwargs)

  call.lower = lambda *args, **kwargs: top(args[0]).lower(*args, **kwargs)
  call._cache_size = lambda: sum(  # Tests: no recompilation.
      program._cache_size() for program in top_level.values())  # noqa: SLF001

  def clear_cache() -> None:
    for program in top_level.values():
      program.clear_cache()
    nested.clear_cache()

  call.clear_cache = clear_cache
  return call


def memory_maps() -> tuple[int, int] | None:
  """(maps this process holds, the kernel's limit per process), or None where they cannot be
  read (not Linux)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      used = sum(1 for _ in f)
    with open("/proc/sys/vm/max_map_count", encoding="ascii") as f:
      limit = int(f.read())
  except (OSError, ValueError):
    return None
  return used, limit


def drop_when_crowded(fraction: float = MAPS_FRACTION) -> bool:
  """Drops every compiled program and trace (`jax.clear_caches`) once this process holds more
  than `fraction` of its memory-map limit, or always where the maps cannot be counted.

  Returns:
    Whether it dropped them. A program dropped and needed again is compiled again (from the
    persistent cache where that is on), so a command calls this between units of work,
    never inside a timing.
  """
  maps = memory_maps()
  if maps is not None and maps[0] < fraction * maps[1]:
    return False
  jax.clear_caches()
  return True
