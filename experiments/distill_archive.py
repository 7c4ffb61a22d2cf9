"""The distillation data's token ids packed into one small file, or unpacked from it.

  python -m experiments.distill_archive --action=export [--tasks=ende,mansum]
      [--archive=assets/distill/distill_tokens.npz] [--data_dir=data_cache]
  python -m experiments.distill_archive --action=import [--archive=...] [--data_dir=...]

Export packs the complete corpora of `<data_dir>/distill/` (the target's outputs, hours of
decoding) into a few MB; import writes them back, byte for byte, on a new machine. Format:
`specdec_jax/data/distill_archive.py`.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from specdec_jax.data import distill, distill_archive, layout

DEFAULT_ARCHIVE = os.path.join(layout.ASSETS_DIR, "distill", "distill_tokens.npz")

# Flags in their own namespace: their names are other commands' too (tests load several).
_FLAGS = flags.FlagValues()
_ACTION = flags.DEFINE_enum("action", None, ["export", "import"],
                            "export: data_dir -> archive; import: archive -> data_dir.",
                            flag_values=_FLAGS)
_ARCHIVE = flags.DEFINE_string("archive", DEFAULT_ARCHIVE, "The archive file.",
                               flag_values=_FLAGS)
_TASKS = flags.DEFINE_list("tasks", list(layout.CORPORA), "Corpora to export.",
                           flag_values=_FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Prepared data directory holding distill/; default "
    f"${layout.DATA_DIR_ENV} or <repo>/data_cache.", flag_values=_FLAGS)


def _parse_flags(argv: list[str]) -> list[str]:
  """This command's flags first, then absl's own (logging, --help) from what remains."""
  return flags.FLAGS(_FLAGS(argv, known_only=True))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _ACTION.value is None:
    raise app.UsageError("pass --action=export or --action=import.")
  data_dir = _DATA_DIR.value or layout.default_data_dir()
  try:
    if _ACTION.value == "export":
      counts = distill_archive.export_archive(_ARCHIVE.value, tuple(_TASKS.value),
                                              data_dir=data_dir)
    else:
      counts = distill_archive.import_archive(_ARCHIVE.value, data_dir=data_dir)
  except (ValueError, FileNotFoundError) as e:  # distill.ShardError is a ValueError.
    sys.exit(f"distill_archive: error: {e}")
  archive = f"{_ARCHIVE.value} ({os.path.getsize(_ARCHIVE.value) / 1e6:.2f} MB)"
  root = distill.distill_root(data_dir)
  for corpus, n in counts.items():
    if _ACTION.value == "export":
      print(f"{corpus}: {n} examples packed from {root} into {archive}")
    else:
      print(f"{corpus}: {n} examples unpacked from {archive} into {root}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
