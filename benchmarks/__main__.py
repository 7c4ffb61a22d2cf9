"""The benchmarks' one entry point: `python -m benchmarks NAME [flags]`.

  python -m benchmarks                      # lists them
  python -m benchmarks NAME --help          # one benchmark's flags

Imports only the benchmark named (some set XLA flags before JAX starts) and runs its
`main` under absl, with its own flags parser where it has one (`parse_flags`: gin's
`--gin_file` / `--gin.X=V` beside absl's flags); its `--help` is its docstring.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

BENCHMARKS = {
    "draft_heads": "a draft's alpha and c against the size of a shortlist output layer",
    "draft_speedups": "trained drafts ranked by the speedup their held-out alpha and c predict",
    "loop_overhead": "what each decoding loop itself costs per iteration, beside its model "
                     "calls",
    "panel_dot": "the decode step's weight products alone, k rows at a time, against a dense "
                 "yardstick",
    "profile_loops": "every op of both compiled loop bodies, by phase and kind",
    "prompt_prefix": "a chat target's system turn prefilled once against in every prompt",
    "student_shapes": "a decoder-only draft's candidate shapes priced (c) before training",
    "train_step": "a draft's distillation step: target in the step, stored signals, on-policy",
    "vocab_ops": "the decoders' operations over the vocabulary against their one-pass forms",
}


def usage() -> str:
  """The list a bare `python -m benchmarks` prints."""
  width = max(map(len, BENCHMARKS))
  return ("usage: python -m benchmarks NAME [flags]   (NAME --help: its flags)\n\n"
          + "\n".join(f"  {name:<{width}}  {about}" for name, about in BENCHMARKS.items()))


def main(argv: Sequence[str]) -> None:
  """Runs the benchmark `argv[1]` names with the flags after it.

  Raises:
    SystemExit: no name, or one that is not a benchmark (status 2, with the list).
  """
  if len(argv) > 1 and argv[1] in ("-h", "--help"):
    print(usage())
    return
  if len(argv) < 2:
    sys.exit(usage())
  name = argv[1]
  if name not in BENCHMARKS:
    sys.exit(f"python -m benchmarks: {name!r} is not a benchmark; use one of "
             f"{', '.join(BENCHMARKS)}.\n\n{usage()}")
  from absl import app  # noqa: PLC0415  (after the name is known: nothing starts JAX first)

  module = importlib.import_module(f"benchmarks.{name}")
  sys.modules["__main__"].__doc__ = module.__doc__  # What absl's --help prints.
  app.run(module.main, argv=[f"python -m benchmarks {name}", *argv[2:]],
          flags_parser=getattr(module, "parse_flags", None) or app.parse_flags_with_usage)


if __name__ == "__main__":
  main(sys.argv)
