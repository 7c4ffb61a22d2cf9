"""Distillation data made by the target: its own outputs for every training input.

  python -m experiments.distill_data [--tasks=ende,mansum] [--num_samples=4]
      [--teacher=assets/models/target] [--output_dir=data_cache/distill]
      [--max_examples=N] [--max_shards=K]

Decodes every training input of each corpus with `temperature_sample` on the teacher:
one greedy output (T=0) and `--num_samples` samples at `--temperature`. The encoder
tokens are the training pipeline's (task prefix, SentencePiece pieces cut to
inputs_length - 1, EOS), so the teacher sees exactly what it was trained on. Inputs are
sorted by length and cut to the smallest of `--buckets` that holds them, so a few shapes
compile and a batch's rows finish at similar steps.

Writes `<output_dir>/<corpus>/shard-NNNNN.npz` and `manifest.json` (format:
`specdec_jax/data/distill.py`), each atomically, the manifest after each shard. Killed
at any point, a rerun with the same flags resumes after the last shard in the manifest
and writes the same data as an uninterrupted run (each batch's PRNG key is folded from
the seed, corpus, shard, batch and decoding). A rerun with a larger `--num_samples` adds
the missing samples to every shard, giving what a run with that many from the start would
have written. Before decoding anything it refuses a bad teacher path, a teacher whose
vocabulary is not the SentencePiece model's, an output directory written with other
settings, and a listed shard that is empty or corrupt. Runs paused with SIGSTOP / SIGCONT
simply continue; the command registers itself (`specdec_jax.contention.register_job`), so
every timing command pauses it while it times.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import sys
import time
import zlib
from typing import IO

import jax
import numpy as np
import sentencepiece as spm
import tqdm
from absl import app, flags, logging

from specdec_jax import atomic_io, contention
from specdec_jax.checkpoints import load_hf_checkpoint
from specdec_jax.data import corpora, distill, layout
from specdec_jax.decoding.baseline import temperature_sample
from specdec_jax.experiment import prompts
from specdec_jax.models import T5Config, T5Model

DEFAULT_TEACHER = os.path.join(layout.ASSETS_DIR, "models", "target")
DEFAULT_VOCAB = prompts.VOCAB_PATH
LOCK = ".distill.lock"

# The command's flags live in their own namespace: its names (tasks, seed, data_dir, ...)
# are other commands' too, and the tests load several commands in one process.
_FLAGS = flags.FlagValues()
_TEACHER = flags.DEFINE_string("teacher", DEFAULT_TEACHER,
                               "The target: a HF T5 directory (config.json + safetensors).",
                               flag_values=_FLAGS)
_VOCAB = flags.DEFINE_string("vocab", DEFAULT_VOCAB, "SentencePiece .model of the inputs.",
                             flag_values=_FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Prepared data directory; default ${layout.DATA_DIR_ENV} or "
    "<repo>/data_cache.", flag_values=_FLAGS)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Default <data_dir>/distill.",
                                  flag_values=_FLAGS)
_TASKS = flags.DEFINE_list("tasks", list(layout.CORPORA), "Corpora to decode.",
                           flag_values=_FLAGS)
_SPLIT = flags.DEFINE_enum("split", "train", list(layout.SPLITS), "Split to decode.",
                           flag_values=_FLAGS)
_NUM_SAMPLES = flags.DEFINE_integer(
    "num_samples", 4, "Samples per input at --temperature, besides the greedy output (one "
    "decoding of both training splits takes 20-40 min on this 2-core CPU, idle to shared; "
    "a larger value later adds samples to a finished run).", flag_values=_FLAGS)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Temperature of the samples.",
                                  flag_values=_FLAGS)
# gin_configs/train/base.gin: train.inputs_length = 128, train.targets_length = 64.
_INPUTS_LENGTH = flags.DEFINE_integer(
    "inputs_length", 128, "Encoder length of training (train.inputs_length).",
    flag_values=_FLAGS)
_MAX_DECODE_LEN = flags.DEFINE_integer(
    "max_decode_len", 64, "Most tokens per output, EOS included (train.targets_length); "
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
    "max_examples", None, "Decode only the first N rows of each split (a trial slice; "
    "write it to another --output_dir than the full run's).", flag_values=_FLAGS)
_MAX_SHARDS = flags.DEFINE_integer(
    "max_shards", None, "Stop after writing this many new shards (a rerun resumes).",
    flag_values=_FLAGS)


def _parse_flags(argv: list[str]) -> list[str]:
  """This command's flags first, then absl's own (logging, --help) from what remains."""
  return flags.FLAGS(_FLAGS(argv, known_only=True))


class DistillError(ValueError):
  """A setting or input that makes the run impossible (found before any decoding)."""


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """Everything a run depends on (the flags, as values).

  Attributes:
    teacher: HF T5 directory of the target.
    vocab: SentencePiece .model.
    data_dir: prepared data directory (its corpora are read).
    output_dir: the distill root; one subdirectory per corpus.
    tasks: corpora to decode.
    split: which split of each.
    num_samples: samples per input besides the greedy output.
    temperature: the samples' temperature.
    inputs_length: encoder length of training; longer inputs are cut, keeping EOS.
    max_decode_len: most output tokens, EOS included.
    buckets: ascending encoder lengths; the last equals `inputs_length`.
    batch_size: rows per decoder call (short batches are padded with copies).
    shard_size: examples per shard.
    seed: PRNG seed of the samples.
    max_examples: only the first this many rows of each split (None: all).
  """
  teacher: str = DEFAULT_TEACHER
  vocab: str = DEFAULT_VOCAB
  data_dir: str = dataclasses.field(default_factory=layout.default_data_dir)
  output_dir: str | None = None
  tasks: tuple[str, ...] = tuple(layout.CORPORA)
  split: str = "train"
  num_samples: int = 4
  temperature: float = 1.0
  inputs_length: int = 128
  max_decode_len: int = 64
  buckets: tuple[int, ...] = (16, 32, 64, 128)
  batch_size: int = 32
  shard_size: int = 512
  seed: int = 0
  max_examples: int | None = None

  @property
  def root(self) -> str:
    return self.output_dir or distill.distill_root(self.data_dir)

  @property
  def temperatures(self) -> tuple[float, ...]:
    """Temperature of each decoding: greedy first, then the samples."""
    return (0.0,) + (float(self.temperature),) * self.num_samples


@dataclasses.dataclass
class TaskPlan:
  """One corpus's work: its inputs in decoding order and the shards still to write.

  Attributes:
    corpus: "ende" or "mansum".
    directory: where its shards and manifest go.
    ids: str `[n]` row ids, file order.
    inputs: int32 `[n, inputs_length]` encoder tokens, file order.
    input_lengths: int32 `[n]`.
    order: int64 `[n]` file rows sorted by (input length, row): the decoding order.
    manifest: the manifest to extend (read on resume, else fresh).
    todo: shard numbers still to decode (or to add samples to), ascending.
    have: decodings already written per listed shard (fewer than the settings' when a
      run with a larger --num_samples adds samples to an earlier run's shards).
  """
  corpus: str
  directory: str
  ids: np.ndarray
  inputs: np.ndarray
  input_lengths: np.ndarray
  order: np.ndarray
  manifest: dict
  todo: list[int]
  have: dict[int, int] = dataclasses.field(default_factory=dict)

  def shard_range(self, shard: int) -> tuple[int, int]:
    size = self.manifest["settings"]["shard_size"]
    return shard * size, min((shard + 1) * size, len(self.order))

  @property
  def todo_examples(self) -> int:
    return sum(stop - start for start, stop in map(self.shard_range, self.todo))


def _sha256_files(paths: list[str]) -> str:
  digest = hashlib.sha256()
  for path in paths:
    digest.update(os.path.basename(path).encode())
    with open(path, "rb") as f:
      for block in iter(lambda f=f: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()


def load_teacher(path: str) -> tuple[T5Config, dict, str]:
  """The teacher's config, params and a sha256 over its config.json and weights.

  Raises:
    DistillError: `path` is not a loadable HF T5 directory.
  """
  hint = ("pass --teacher=<a HF T5 directory with config.json and model.safetensors>, "
          f"e.g. {DEFAULT_TEACHER}.")
  if not os.path.isdir(path):
    raise DistillError(f"--teacher={path!r} is not a directory: {hint}")
  try:
    cfg, params = load_hf_checkpoint(path)
  except (OSError, ValueError) as e:
    raise DistillError(f"--teacher={path!r} cannot be loaded ({e}): {hint}") from e
  files = sorted(os.path.join(path, f) for f in os.listdir(path)
                 if f == "config.json" or f.endswith(".safetensors"))
  return cfg, params, _sha256_files(files)


def check_vocab(cfg: T5Config, vocab_path: str, teacher_path: str) -> spm.SentencePieceProcessor:
  """The SentencePiece processor, after checking that it is the teacher's vocabulary.

  Raises:
    DistillError: the file is missing or unreadable, its piece count is not the
      teacher's `vocab_size`, or the teacher ships another `spiece.model`.
  """
  if not os.path.isfile(vocab_path):
    raise DistillError(f"--vocab={vocab_path!r} does not exist: pass the SentencePiece .model "
                       f"the teacher was trained with (e.g. {DEFAULT_VOCAB}).")
  try:
    processor = spm.SentencePieceProcessor(model_file=vocab_path)
  except (OSError, RuntimeError) as e:
    raise DistillError(f"--vocab={vocab_path!r} is not a SentencePiece model ({e}).") from e
  pieces = processor.get_piece_size()
  if pieces != cfg.vocab_size:
    raise DistillError(
        f"vocabulary mismatch: the teacher {teacher_path} has vocab_size={cfg.vocab_size} "
        f"in its config.json, but --vocab={vocab_path} has {pieces} pieces; pass the "
        "teacher's own vocabulary (its spiece.model) or a teacher trained on this one.")
  shipped = os.path.join(teacher_path, "spiece.model")
  if os.path.isfile(shipped) and corpora.sha256_file(shipped) != corpora.sha256_file(vocab_path):
    raise DistillError(
        f"vocabulary mismatch: the teacher ships {shipped}, which differs from "
        f"--vocab={vocab_path}; pass --vocab={shipped}.")
  return processor


def _settings(config: DistillConfig, corpus_sha: str, num_examples: int, teacher_sha: str,
              cfg: T5Config, vocab_sha: str) -> dict:
  """What the data depends on; a resumed run must match it exactly."""
  return {
      "split": config.split, "corpus_sha256": corpus_sha, "num_examples": num_examples,
      "max_examples": config.max_examples, "teacher_sha256": teacher_sha,
      "teacher_vocab_size": cfg.vocab_size, "eos_id": cfg.eos_token_id,
      "vocab_sha256": vocab_sha, "inputs_length": config.inputs_length,
      "max_decode_len": config.max_decode_len, "temperatures": list(config.temperatures),
      "num_samples": config.num_samples, "top_k": 0, "top_p": 1.0, "seed": config.seed,
      "buckets": list(config.buckets), "batch_size": config.batch_size,
      "shard_size": config.shard_size, "order": "input_length, then row",
  }


def _check_config(config: DistillConfig) -> None:
  unknown = sorted(set(config.tasks) - set(layout.CORPORA))
  if unknown or not config.tasks:
    raise DistillError(f"--tasks={list(config.tasks)}: use some of {sorted(layout.CORPORA)}.")
  buckets = list(config.buckets)
  if not buckets or buckets != sorted(set(buckets)) or buckets[-1] != config.inputs_length:
    raise DistillError(f"--buckets={buckets} must be ascending and end at "
                       f"--inputs_length={config.inputs_length}.")
  for name in ("num_samples", "batch_size", "shard_size", "max_decode_len"):
    minimum = 0 if name == "num_samples" else 1
    if getattr(config, name) < minimum:
      raise DistillError(f"--{name}={getattr(config, name)} must be >= {minimum}.")
  if config.num_samples and config.temperature <= 0:
    raise DistillError(f"--temperature={config.temperature} must be > 0 for samples.")
  if config.max_examples is not None and config.max_examples < 1:
    raise DistillError(f"--max_examples={config.max_examples} must be >= 1.")


def plan_task(config: DistillConfig, corpus: str, processor: spm.SentencePieceProcessor,
              teacher_sha: str, cfg: T5Config, vocab_sha: str) -> TaskPlan:
  """Tokenises a corpus split, orders it, and reads (and checks) any earlier progress.

  Raises:
    DistillError: the split is missing, or the directory holds another run's settings.
    distill.ShardError: a shard that the manifest lists is empty, corrupt or
      inconsistent with this plan.
  """
  path = layout.corpus_file(config.data_dir, corpus, config.split)
  if not os.path.exists(path):
    raise DistillError(f"{path} does not exist: run `python -m specdec_jax.data.prepare "
                       f"--data_dir={config.data_dir}` first.")
  examples = corpora.read_jsonl(path)[:config.max_examples]
  if not examples:
    raise DistillError(f"{path} has no examples.")
  prefix = layout.CORPORA[corpus].prefix  # As tasks._add_prefix puts it before tokenising.
  inputs = prompts.tokenize(processor, [prefix + ex.inputs for ex in examples],
                            config.inputs_length)
  input_lengths = (inputs != prompts.PAD_ID).sum(axis=1).astype(np.int32)
  order = np.lexsort((np.arange(len(examples)), input_lengths)).astype(np.int64)
  settings = _settings(config, corpora.sha256_file(path), len(examples), teacher_sha, cfg,
                       vocab_sha)
  num_shards = -(-len(examples) // config.shard_size)
  directory = distill.task_dir(config.root, corpus)
  plan = TaskPlan(corpus, directory, np.array([ex.id for ex in examples]), inputs,
                  input_lengths, order, {}, [])
  if os.path.exists(os.path.join(directory, distill.MANIFEST)):
    manifest = distill.read_manifest(directory)
    old = manifest["settings"]
    grows = {"num_samples", "temperatures"}
    changed = sorted(k for k in settings.keys() | old.keys() if settings.get(k) != old.get(k))
    fewer = settings["temperatures"][:len(old["temperatures"])] != old["temperatures"]
    if fewer or set(changed) - grows:
      diff = "; ".join(f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now" for k in changed)
      raise DistillError(
          f"{directory} holds a run with other settings ({diff}): rerun with its flags to "
          "resume it (a larger --num_samples adds samples to it), or pass another "
          "--output_dir (or delete that directory) to start afresh.")
    manifest["settings"] = settings  # Written with the next shard.
  else:
    manifest = {"format": distill.FORMAT, "corpus": corpus,
                "task": f"specdec_distill_{corpus}", "settings": settings,
                "num_examples": len(examples), "num_shards": num_shards, "shards": [],
                "complete": False}
  plan.manifest = manifest
  kept = []
  for entry in sorted(manifest["shards"], key=lambda e: e["shard"]):
    if not os.path.exists(os.path.join(directory, entry["file"])):
      logging.warning("%s: shard %d is listed but its file is gone; decoding it again.",
                      directory, entry["shard"])
      continue
    arrays = distill.load_shard(directory, entry)
    entry["decodings"] = arrays["outputs"].shape[1]
    start, stop = plan.shard_range(entry["shard"])
    if (entry["start"], entry["stop"]) != (start, stop) or not np.array_equal(
        arrays["index"], order[start:stop]):
      raise distill.ShardError(
          f"{os.path.join(directory, entry['file'])} holds other examples than this run "
          f"orders into shard {entry['shard']}: delete {directory} and rerun.")
    kept.append(entry)
  manifest["shards"] = kept
  plan.have = {e["shard"]: e["decodings"] for e in kept}
  decodings = len(config.temperatures)
  plan.todo = [s for s in range(num_shards) if plan.have.get(s, 0) < decodings]
  manifest["complete"] = not plan.todo
  return plan


def _batches(buckets_of_rows: np.ndarray, batch_size: int) -> list[tuple[int, int, int]]:
  """(lo, hi, bucket) batches over a shard's rows: runs of one bucket, cut at batch_size.

  Args:
    buckets_of_rows: int `[m]` the encoder length of each row, non-decreasing.
    batch_size: most rows per batch.
  """
  out, lo = [], 0
  while lo < len(buckets_of_rows):
    bucket = int(buckets_of_rows[lo])
    hi = lo + 1
    while hi < len(buckets_of_rows) and hi - lo < batch_size and buckets_of_rows[hi] == bucket:
      hi += 1
    out.append((lo, hi, bucket))
    lo = hi
  return out


def decode_shard(model: T5Model, params: dict, plan: TaskPlan, shard: int,
                 config: DistillConfig, bar: tqdm.tqdm | None = None,
                 first: int = 0) -> dict[str, np.ndarray]:
  """Decodes one shard: the greedy output and every sample of each of its examples.

  Args:
    model: the teacher.
    params: its parameters.
    plan: the corpus's plan.
    shard: which shard.
    config: the settings.
    bar: advanced by each batch's examples.
    first: decode only decodings `first..D-1` (those an earlier run lacks); each
      decoding's PRNG key does not depend on the others, so the result is the same.

  Returns:
    The shard's arrays (`distill.SHARD_FIELDS`; shapes in specdec_jax/data/distill.py),
    with `D - first` decodings.
  """
  start, stop = plan.shard_range(shard)
  rows = plan.order[start:stop]                                           # [m] file rows
  lengths = plan.input_lengths[rows]                                      # [m]
  buckets = np.asarray(config.buckets)[np.searchsorted(config.buckets, lengths)]  # [m]
  temperatures = config.temperatures[first:]
  eos = model.config.eos_token_id
  outputs = np.zeros((len(rows), len(temperatures), config.max_decode_len), np.int32)
  output_lengths = np.zeros((len(rows), len(temperatures)), np.int32)
  key = jax.random.fold_in(jax.random.PRNGKey(config.seed), zlib.crc32(plan.corpus.encode()))
  key = jax.random.fold_in(key, shard)
  for b, (lo, hi, bucket) in enumerate(_batches(buckets, config.batch_size)):
    batch = plan.inputs[rows[lo:hi], :bucket]                             # [hi-lo, bucket]
    pad = np.repeat(batch[-1:], config.batch_size - len(batch), axis=0)   # copies of a row
    batch = np.concatenate([batch, pad])                                  # [batch, bucket]
    for d, temperature in enumerate(temperatures):
      rng = jax.random.fold_in(jax.random.fold_in(key, b), first + d)
      out = temperature_sample(model, params, batch, max_decode_len=config.max_decode_len,
                               temperature=temperature, rng=rng)
      outputs[lo:hi, d] = np.asarray(out.sequences)[:hi - lo]            # [hi-lo, L_out]
      output_lengths[lo:hi, d] = np.asarray(out.lengths)[:hi - lo]
    if bar is not None:
      bar.update(hi - lo)
  return {
      "ids": plan.ids[rows], "index": rows, "inputs": plan.inputs[rows],
      "input_lengths": lengths, "outputs": outputs, "output_lengths": output_lengths,
      "truncated": ~np.any(outputs == eos, axis=2),
  }


def _merge(old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A shard with `new`'s decodings appended to `old`'s (same examples)."""
  if not np.array_equal(old["index"], new["index"]):
    raise distill.ShardError("internal: merging shards of different examples.")
  per_decoding = ("outputs", "output_lengths", "truncated")
  return {k: np.concatenate([old[k], new[k]], axis=1) if k in per_decoding else old[k]
          for k in distill.SHARD_FIELDS}


def _lock(root: str) -> IO[str]:
  """Holds an exclusive lock on `root` for the run (a second run there is refused)."""
  os.makedirs(root, exist_ok=True)
  handle = open(os.path.join(root, LOCK), "a+")  # noqa: SIM115 (held until exit)
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError as e:
    handle.close()
    raise DistillError(f"another distill_data run is writing to {root}; wait for it or "
                       "stop it (its pid is in that run's PID file, if started so).") from e
  return handle


def distill_data(config: DistillConfig, *, max_shards: int | None = None,
                 progress: bool = True) -> dict[str, dict]:
  """Runs (or resumes) the decoding of every corpus in `config.tasks`.

  Args:
    config: the settings.
    max_shards: stop after writing this many new shards (None: finish).
    progress: show a tqdm bar with the ETA on stderr.

  Returns:
    Per corpus: {"examples", "shards", "complete", "decoded", "seconds",
    "examples_per_s"} of this run (decoded and seconds count only new shards).

  Raises:
    DistillError, distill.ShardError: before any decoding (see `plan_task`).
  """
  _check_config(config)
  cfg, params, teacher_sha = load_teacher(config.teacher)
  processor = check_vocab(cfg, config.vocab, config.teacher)
  vocab_sha = corpora.sha256_file(config.vocab)
  lock = _lock(config.root)
  try:
    plans = [plan_task(config, corpus, processor, teacher_sha, cfg, vocab_sha)
             for corpus in config.tasks]
    model, params = T5Model(cfg), jax.device_put(params)
    total = sum(len(p.order) for p in plans)
    remaining = sum(p.todo_examples for p in plans)
    summary = {}
    written = 0
    bar = tqdm.tqdm(total=total, initial=total - remaining, unit="ex", file=sys.stderr,
                    dynamic_ncols=True, smoothing=0.05, disable=not progress,
                    mininterval=1.0 if sys.stderr.isatty() else 30.0)
    with bar:
      for plan in plans:
        decoded, seconds = 0, 0.0
        for shard in plan.todo:
          if max_shards is not None and written >= max_shards:
            break
          bar.set_description(f"{plan.corpus} shard {shard + 1}/{plan.manifest['num_shards']}",
                              refresh=False)
          t0 = time.perf_counter()
          first = plan.have.get(shard, 0)
          arrays = decode_shard(model, params, plan, shard, config, bar, first)
          elapsed = time.perf_counter() - t0
          entries = {e["shard"]: e for e in plan.manifest["shards"]}
          if first:  # Samples added to an earlier run's shard.
            arrays = _merge(distill.load_shard(plan.directory, entries[shard]), arrays)
          data = distill.shard_bytes(arrays)
          name = distill.shard_name(shard)
          atomic_io.atomic_write_bytes(os.path.join(plan.directory, name), data)
          start, stop = plan.shard_range(shard)
          entries[shard] = {
              "shard": shard, "file": name, "start": start, "stop": stop,
              "count": stop - start, "decodings": len(config.temperatures),
              "sha256": distill.sha256_bytes(data),
              "truncated": arrays["truncated"].sum(axis=0).tolist(),
              "mean_output_length": np.round(arrays["output_lengths"].mean(axis=0), 2).tolist(),
              "seconds": round(elapsed + entries.get(shard, {}).get("seconds", 0.0), 1)}
          plan.manifest["shards"] = [entries[k] for k in sorted(entries)]
          plan.have[shard] = len(config.temperatures)
          plan.manifest["complete"] = all(
              plan.have.get(k, 0) == len(config.temperatures)
              for k in range(plan.manifest["num_shards"]))
          distill.write_manifest(plan.directory, plan.manifest)
          written += 1
          decoded += stop - start
          seconds += elapsed
          bar.write(f"{plan.corpus} shard {shard}: {stop - start} examples x "
                    f"{len(config.temperatures) - first} decodings in {elapsed:.0f} s "
                    f"({(stop - start) / elapsed:.1f} examples/s); truncated per decoding "
                    f"{arrays['truncated'].sum(axis=0).tolist()}")
        summary[plan.corpus] = {
            "examples": len(plan.order), "shards": len(plan.manifest["shards"]),
            "complete": plan.manifest["complete"], "decoded": decoded,
            "seconds": round(seconds, 1),
            "examples_per_s": round(decoded / seconds, 2) if seconds else None}
  finally:
    lock.close()
  return summary


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    buckets = tuple(int(b) for b in _BUCKETS.value)
  except ValueError as e:
    raise app.UsageError(f"--buckets={_BUCKETS.value}: integers, please.") from e
  config = DistillConfig(
      teacher=_TEACHER.value, vocab=_VOCAB.value,
      data_dir=_DATA_DIR.value or layout.default_data_dir(), output_dir=_OUTPUT_DIR.value,
      tasks=tuple(_TASKS.value), split=_SPLIT.value, num_samples=_NUM_SAMPLES.value,
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
