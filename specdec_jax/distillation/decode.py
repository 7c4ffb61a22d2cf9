"""The target's own outputs for every training input: one greedy output and samples.

Decodes every training input of each task with the teacher (`teacher.Teacher`: a T5 or
a GGUF Llama): one greedy output (T=0) and `num_samples` samples at `temperature`. A T5
reads the training pipeline's encoder tokens (task prefix, SentencePiece pieces cut to
inputs_length - 1, EOS), so it sees exactly what it was trained on; a chat model reads
the task's chat prompt (`data.chat_prompts`). Inputs are sorted by length and cut to the
smallest of `buckets` that holds them, so a few shapes compile and a batch's rows finish
at similar steps.

Writes `<output_dir>/<task>/shard-NNNNN.npz` and `manifest.json` (format:
`specdec_jax/data/distill.py`), each atomically, the manifest after each shard. Killed
at any point, a rerun with the same settings resumes after the last shard in the manifest
and writes the same data as an uninterrupted run (each batch's PRNG key is folded from
the seed, corpus, shard, batch and decoding). A rerun with a larger `num_samples` adds
the missing samples to every shard, giving what a run with that many from the start would
have written. Before decoding anything it refuses a bad teacher path, a teacher whose
vocabulary is not the SentencePiece model's, an output directory written with other
settings, and a listed shard that is empty or corrupt. The command is
`python -m experiments.distill_data`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import zlib

import jax
import numpy as np
import tqdm
from absl import logging

from specdec_jax import atomic_io
from specdec_jax.data import chat_prompts, corpora, distill, layout
from specdec_jax.distillation.teacher import (
    DEFAULT_TEACHER,
    DEFAULT_VOCAB,
    DistillError,
    Teacher,
    default_root,
    default_tasks,
    load_teacher,
    lock_directory,
)

LOCK = ".distill.lock"

@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """Everything a run depends on (the flags, as values).

  Attributes:
    teacher: the target (`teacher.load_teacher`: a HF T5 directory, a .gguf file or
      "smollm2").
    vocab: a T5 teacher's SentencePiece .model.
    data_dir: prepared data directory (its corpora are read).
    output_dir: the distill root, one subdirectory per task (None:
      `teacher.default_root`).
    tasks: tasks to decode (None: `teacher.default_tasks`).
    split: which split of each.
    num_samples: samples per input besides the greedy output.
    temperature: the samples' temperature.
    inputs_length: encoder length of training; longer inputs are cut, keeping EOS.
    max_decode_len: most output tokens, EOS included.
    buckets: ascending encoder lengths; the last equals `inputs_length`.
    batch_size: rows per decoder call (short batches are padded with copies).
    shard_size: examples per shard.
    seed: PRNG seed of the samples.
    max_examples: only this many sources of each split, evenly spaced through it
      (None: all).
  """
  teacher: str = DEFAULT_TEACHER
  vocab: str = DEFAULT_VOCAB
  data_dir: str = dataclasses.field(default_factory=layout.default_data_dir)
  output_dir: str | None = None
  tasks: tuple[str, ...] | None = None
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
    return self.output_dir or default_root(self.data_dir, self.teacher)

  @property
  def task_names(self) -> tuple[str, ...]:
    return self.tasks if self.tasks is not None else default_tasks(self.teacher)

  @property
  def temperatures(self) -> tuple[float, ...]:
    """Temperature of each decoding: greedy first, then the samples."""
    return (0.0,) + (float(self.temperature),) * self.num_samples


@dataclasses.dataclass
class TaskPlan:
  """One corpus's work: its inputs in decoding order and the shards still to write.

  Attributes:
    corpus: the task's name.
    directory: where its shards and manifest go.
    ids: str `[n]` row ids, file order.
    inputs: int32 `[n, inputs_length]` the teacher's inputs, file order.
    file_rows: int64 `[n]` each row's position in the corpus's `<split>.jsonl`.
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
  file_rows: np.ndarray
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

def _settings(config: DistillConfig, corpus_sha: str, num_examples: int,
              teacher: Teacher) -> dict:
  """What the data depends on; a resumed run must match it exactly."""
  return {
      "split": config.split, "corpus_sha256": corpus_sha, "num_examples": num_examples,
      "max_examples": config.max_examples, "teacher_kind": teacher.kind,
      "teacher_sha256": teacher.sha256, "teacher_vocab_size": teacher.vocab_size,
      "eos_id": teacher.eos_id, "vocab_sha256": teacher.tokenizer_sha256,
      "inputs_length": config.inputs_length,
      "max_decode_len": config.max_decode_len, "temperatures": list(config.temperatures),
      "num_samples": config.num_samples, "top_k": 0, "top_p": 1.0, "seed": config.seed,
      "buckets": list(config.buckets), "batch_size": config.batch_size,
      "shard_size": config.shard_size, "order": "input_length, then row",
  }


def _check_config(config: DistillConfig) -> None:
  if not config.task_names:
    raise DistillError("--tasks is empty: name the tasks to decode.")
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


def plan_task(config: DistillConfig, corpus: str, teacher: Teacher) -> TaskPlan:
  """Tokenises a task's split, orders it, and reads (and checks) any earlier progress.

  A plan's rows are the task's sources (`Teacher.sources`; `max_examples` of them evenly
  spaced when set); `index` records each one's row in the corpus file.

  Raises:
    DistillError: the split is missing, or the directory holds another run's settings.
    distill.ShardError: a shard that the manifest lists is empty, corrupt or
      inconsistent with this plan.
  """
  texts, file_rows = teacher.sources(corpus, config.split, config.data_dir)
  path = layout.corpus_file(config.data_dir, _corpus_of(corpus), config.split)
  if config.max_examples is not None and config.max_examples < len(texts):
    picks = np.linspace(0, len(texts) - 1, config.max_examples).round().astype(int)
    texts, file_rows = [texts[i] for i in picks], [file_rows[i] for i in picks]
  if not texts:
    raise DistillError(f"{path} has no examples for task {corpus!r}.")
  ids = [ex.id for ex in corpora.read_jsonl(path)]
  inputs = teacher.tokenize(corpus, texts, config.inputs_length)
  input_lengths = (inputs != 0).sum(axis=1).astype(np.int32)
  order = np.lexsort((np.arange(len(texts)), input_lengths)).astype(np.int64)
  settings = _settings(config, corpora.sha256_file(path), len(texts), teacher)
  num_shards = -(-len(texts) // config.shard_size)
  directory = distill.task_dir(config.root, corpus)
  plan = TaskPlan(corpus, directory, np.array([ids[i] for i in file_rows]), inputs,
                  np.asarray(file_rows, np.int64), input_lengths, order, {}, [])
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
                "num_examples": len(texts), "num_shards": num_shards, "shards": [],
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
        arrays["index"], plan.file_rows[order[start:stop]]):
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


def _corpus_of(task: str) -> str:
  """The corpus a task's sources come from (a chat task's, or the corpus itself)."""
  return chat_prompts.TASKS[task].corpus if task in chat_prompts.TASKS else task


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


def decode_shard(teacher: Teacher, plan: TaskPlan, shard: int,
                 config: DistillConfig, bar: tqdm.tqdm | None = None,
                 first: int = 0) -> dict[str, np.ndarray]:
  """Decodes one shard: the greedy output and every sample of each of its examples.

  Args:
    teacher: the target.
    plan: the task's plan.
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
  eos = teacher.eos_id
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
      sequences, lengths_out = teacher.decode(batch, rng, temperature=temperature,
                                              max_decode_len=config.max_decode_len)
      outputs[lo:hi, d] = sequences[:hi - lo]                             # [hi-lo, L_out]
      output_lengths[lo:hi, d] = lengths_out[:hi - lo]
    if bar is not None:
      bar.update(hi - lo)
  return {
      "ids": plan.ids[rows], "index": plan.file_rows[rows], "inputs": plan.inputs[rows],
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


def distill_data(config: DistillConfig, *, max_shards: int | None = None,
                 progress: bool = True) -> dict[str, dict]:
  """Runs (or resumes) the decoding of every task in `config.task_names`.

  Args:
    config: the settings.
    max_shards: stop after writing this many new shards (None: finish).
    progress: show a tqdm bar with the ETA on stderr.

  Returns:
    Per task: {"examples", "shards", "complete", "decoded", "seconds",
    "examples_per_s"} of this run (decoded and seconds count only new shards).

  Raises:
    DistillError, distill.ShardError: before any decoding (see `plan_task`).
  """
  _check_config(config)
  teacher = load_teacher(config.teacher, config.vocab)
  lock = lock_directory(config.root, LOCK, "distill_data")
  try:
    plans = [plan_task(config, corpus, teacher) for corpus in config.task_names]
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
          arrays = decode_shard(teacher, plan, shard, config, bar, first)
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

