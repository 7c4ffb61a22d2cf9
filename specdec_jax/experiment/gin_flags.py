"""The gin flags the entry points share (defined once) and T5X-style `--gin.X=Y` parsing."""

from __future__ import annotations

from absl import app, flags

GIN_FILE = flags.DEFINE_multi_string("gin_file", [], "Gin files, applied in order.")
GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings, e.g. 'Experiment.gammas = [1, 2]'; also --gin.NAME=VALUE.")

GIN_PREFIX = "--gin."


def split_gin_args(argv: list[str]) -> tuple[list[str], list[str]]:
  """Separates T5X-style `--gin.NAME=VALUE` arguments from the rest.

  Returns:
    (argv without them, bindings "NAME=VALUE").
  """
  rest, bindings = [], []
  for arg in argv:
    if arg.startswith(GIN_PREFIX):
      binding = arg[len(GIN_PREFIX):]
      if "=" not in binding:
        raise app.UsageError(f"{arg!r} has no value; write --gin.NAME=VALUE.")
      bindings.append(binding)
    else:
      rest.append(arg)
  return rest, bindings


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run`'s flags parser, with `--gin.NAME=VALUE` read as `--gin_bindings`."""
  rest, bindings = split_gin_args(argv)
  return flags.FLAGS(rest + [f"--gin_bindings={b}" for b in bindings])
