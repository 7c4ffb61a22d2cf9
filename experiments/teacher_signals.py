"""The target's signals along its distillation data, computed once and stored.

  python -m experiments.teacher_signals [--tasks=ende,mansum] [--top_k=32]
      [--teacher=assets/models/target] [--data_dir=data_cache] [--batch_size=32]
      [--follow] [--max_shards=K]
  python -m experiments.teacher_signals --teacher=smollm2 --batch_size=4 [--follow]

For every shard of `<root>/<task>/` (made by `python -m experiments.distill_data`; root
`<data_dir>/distill` for a T5 teacher, `<data_dir>/distill_<file stem>` for a GGUF one):
a T5's encoder outputs (float16) and, at every position of every stored output, the
target's top-k log-probabilities and the log of the mass left over, written to
`<root>/<task>/signals/` (format:
`specdec_jax/data/teacher_signals.py`; the computation: `specdec_jax/distillation/signals.py`).
The rows of each call are split over every device (a mesh's data axis, as the decoders
split them), and the signals stay within --max_disk_gb. Each shard's line gives its tokens
per hour. Killed at any point (kill -9 included), a rerun resumes after the shards already
written. With `--follow` it
trails a running `distill_data`, polling its manifest until the decoding is complete and
every shard has its signals. The command registers itself
(`specdec_jax.contention.register_job`), so every timing command pauses it while it times.
"""

from __future__ import annotations

import sys
import time

from absl import app, flags

from specdec_jax import contention, partitioning
from specdec_jax.data import distill, layout
from specdec_jax.distillation.signals import SignalsConfig, compute_signals
from specdec_jax.distillation.teacher import DEFAULT_TEACHER, DistillError

# Flags in their own namespace: their names are other commands' too (tests load several).
_FLAGS = flags.FlagValues()
_TASKS = flags.DEFINE_list(
    "tasks", None, "Tasks to compute signals for; default the corpora for a T5 teacher, "
    "mansum and explain for a GGUF one.", flag_values=_FLAGS)
_TOP_K = flags.DEFINE_integer("top_k", 32, "Log-probabilities stored per position.",
                              flag_values=_FLAGS)
_TEACHER = flags.DEFINE_string(
    "teacher", DEFAULT_TEACHER, "The target that decoded the data: a HF T5 directory "
    "(config.json + safetensors), a .gguf file or 'smollm2'.", flag_values=_FLAGS)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "The distill root (as distill_data's --output_dir); default "
    "<data_dir>/distill for a T5 teacher, <data_dir>/distill_<file stem> for a GGUF one.",
    flag_values=_FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Prepared data directory; default "
    f"${layout.DATA_DIR_ENV} or <repo>/data_cache.", flag_values=_FLAGS)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 32, "Examples per call (the decoder runs over all their decodings).",
    flag_values=_FLAGS)
_FOLLOW = flags.DEFINE_boolean(
    "follow", False, "Keep polling the distillation manifests (every 60 s) until the "
    "decoding is complete and every shard has its signals.", flag_values=_FLAGS)
_MAX_DISK_GB = flags.DEFINE_float(
    "max_disk_gb", 20.0, "The most the signals of all --tasks may take on disk (GB); a shard "
    "that would pass it stops the run with an error.", flag_values=_FLAGS)
_MAX_SHARDS = flags.DEFINE_integer(
    "max_shards", None, "Stop after writing this many new shards (a rerun resumes).",
    flag_values=_FLAGS)


def _parse_flags(argv: list[str]) -> list[str]:
  """This command's flags first, then absl's own (logging, --help) from what remains."""
  return flags.FLAGS(_FLAGS(argv, known_only=True))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = SignalsConfig(
      teacher=_TEACHER.value,
      data_dir=_DATA_DIR.value or layout.default_data_dir(), output_dir=_OUTPUT_DIR.value,
      tasks=tuple(_TASKS.value) if _TASKS.value else None, top_k=_TOP_K.value,
      batch_size=_BATCH_SIZE.value, max_disk_gb=_MAX_DISK_GB.value)
  t0 = time.time()
  contention.register_job("teacher_signals")  # Timing commands pause it (SIGSTOP / SIGCONT).
  mesh = partitioning.make_mesh()  # Every device: the rows are split over them.
  try:
    summary = compute_signals(config, mesh=mesh, follow=_FOLLOW.value,
                              max_shards=_MAX_SHARDS.value,
                              report=lambda line: print(line, flush=True))
  except (DistillError, distill.ShardError, FileNotFoundError) as e:
    sys.exit(f"teacher_signals: error: {e}")
  for corpus, s in summary.items():
    state = "complete" if s["complete"] else "incomplete (rerun to resume)"
    ran = (f"this run computed {s['computed']} examples, {s['tokens']:,} tokens in "
           f"{s['seconds']:.0f} s ({s['tokens_per_hour']:,} tokens/hour)" if s["computed"]
           else "nothing to compute")
    print(f"{corpus}: signals for {s['shards']} of {s['num_shards']} shards, {state}; {ran}")
  print(f"{config.root}: done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
