"""JAX's persistent compilation cache, kept in the user's cache directory by the commands.

A command that compiles the same programs on every run (the first command's decoders, a
resumed training step) reads them back instead: `enable` points JAX at
`$XDG_CACHE_HOME/specdec_jax/xla` (default `~/.cache/specdec_jax/xla`). Entries are
keyed by JAX on the program, its compiler options and the backend, so a stale entry is
never used for another program; deleting the directory only costs compile time.
"""

from __future__ import annotations

import os

import jax

# The environment variable JAX itself reads; a directory set there (the tests' per-run
# cache) is kept.
ENV = "JAX_COMPILATION_CACHE_DIR"


def default_dir() -> str:
  """`$XDG_CACHE_HOME/specdec_jax/xla`, or `~/.cache/specdec_jax/xla`."""
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "specdec_jax", "xla")


def enable(directory: str | None) -> str | None:
  """Keeps compiled programs in `directory` ('' or None: off), every program whatever its
  compile time; returns the directory in use (`$JAX_COMPILATION_CACHE_DIR` wins), or None
  where the cache is off (also when `JAX_ENABLE_COMPILATION_CACHE=false`, as in the tests)."""
  directory = os.environ.get(ENV) or directory
  if not directory or not jax.config.jax_enable_compilation_cache:
    return None
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return directory
