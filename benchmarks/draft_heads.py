"""Drafts with a shortlist output layer: alpha and c against the shortlist's size.

  python -m benchmarks draft_heads --draft_dirs=assets/models/draft_shared_enc_signals \
      [--head_sizes=4096,3072,2048] [--output=results/alpha/draft_heads.json]

`specdec_jax.draft_pricing.draft_heads.head_sweep` (held-out En-De alpha with the real loop;
c timed in turn inside the guard). Needs the distillation data (the shortlist is ranked
on the target's outputs). Writes one JSON (atomically; drafts already in it and not named
now are kept) and prints a row per draft and head.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.draft_pricing import draft_heads

_DRAFT_DIRS = flags.DEFINE_list("draft_dirs", None, "Draft model directories, comma-separated.")
_HEAD_SIZES = flags.DEFINE_list("head_sizes", ["4096", "3072", "2048"],
                                "Shortlist sizes, each below the vocabulary.")
_TARGET = flags.DEFINE_string("target", "assets/models/target", "The target.")
_EXAMPLES = flags.DEFINE_integer("examples", 128, "En-De validation inputs alpha is measured "
                                 "on.", lower_bound=1)
_OUTPUT = flags.DEFINE_string("output", "results/alpha/draft_heads.json", "The JSON written.")
flags.mark_flag_as_required("draft_dirs")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  try:
    sizes = [int(s) for s in _HEAD_SIZES.value]
  except ValueError as e:
    raise app.UsageError(f"--head_sizes must be integers, got {_HEAD_SIZES.value}.") from e
  try:
    record = draft_heads.head_sweep(_DRAFT_DIRS.value, sizes, target_dir=_TARGET.value,
                                    examples=_EXAMPLES.value)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(str(e)) from e
  if os.path.exists(_OUTPUT.value):
    with open(_OUTPUT.value, encoding="utf-8") as f:
      record["drafts"] = {**json.load(f)["drafts"], **record["drafts"]}
  atomic_io.write_json(_OUTPUT.value, record)
  for name, heads in record["drafts"].items():
    for head, v in heads.items():
      row = " | ".join(f"{t}: alpha {a['beta']:.3f} c {a['c']:.3f} model calls "
                       f"{a['speedup_steps_only']:.2f}X (gamma {a['gamma_steps_only']})"
                       for t, a in v["alpha"].items())
      print(f"{name:28s} {head:>5s} covers {v['coverage']:.3f}  {row}")
  print(f"Wrote {_OUTPUT.value}.")
