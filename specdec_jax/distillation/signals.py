"""The target's signals along its own distillation data, computed once (no TensorFlow).

For every shard of a task's distillation data (`specdec_jax.data.distill`) the target
(any `teacher.Teacher`: a T5, a GGUF Llama) runs once, teacher-forced along each stored
output, and its top-k log-probabilities (and a T5's encoder outputs) are written to
`<root>/<task>/signals/` (format: `specdec_jax/data/teacher_signals.py`), so a draft's
training step no longer runs it.

A shard's rows are grouped by (input bucket, output bucket) (`buckets.bucket_length`:
powers of two from 16), cut at `batch_size` examples and padded to a power of two of
rows, so a handful of shapes compile. Per batch the target runs over all D decodings of
its examples, in float32. Each shard is written atomically, then the manifest. A rerun skips the
shards listed with a file whose sha256 matches and that were computed from the
distillation shard listed now; `follow` keeps polling the distillation manifest until
its decoding is complete and every shard has its signals, so a run can trail a running
`python -m experiments.distill_data`. The command is `python -m experiments.teacher_signals`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable

import numpy as np
from absl import logging
from jax.sharding import Mesh

from specdec_jax import atomic_io
from specdec_jax.data import corpora, distill, layout
from specdec_jax.data import teacher_signals as ts
from specdec_jax.decoding.buckets import bucket_length
from specdec_jax.distillation.teacher import (
    DATA_AXIS,
    DEFAULT_TEACHER,
    DistillError,
    Teacher,
    default_root,
    default_tasks,
    load_teacher,
    lock_directory,
)

LOCK = ".signals.lock"


@dataclasses.dataclass(frozen=True)
class SignalsConfig:
  """Everything a run depends on (the flags, as values).

  Attributes:
    teacher: the target that decoded the data (`teacher.load_teacher`: a HF T5
      directory, a .gguf file or "smollm2").
    data_dir: prepared data directory.
    output_dir: the distill root holding the distillation data (None:
      `teacher.default_root`).
    tasks: tasks to compute signals for (None: the corpora's for a T5 teacher,
      mansum and explain for a GGUF one).
    top_k: log-probabilities stored per position.
    batch_size: examples per call (the target runs over batch_size x D rows).
    max_disk_gb: the most the signals of all `tasks` may take on disk (GB, 1e9 bytes):
      a shard that would pass it is not computed, and the run stops with an error.
  """
  teacher: str = DEFAULT_TEACHER
  data_dir: str = dataclasses.field(default_factory=layout.default_data_dir)
  output_dir: str | None = None
  tasks: tuple[str, ...] | None = None
  top_k: int = 32
  batch_size: int = 32
  max_disk_gb: float = 20.0

  @property
  def root(self) -> str:
    return self.output_dir or default_root(self.data_dir, self.teacher)

  @property
  def task_names(self) -> tuple[str, ...]:
    return self.tasks if self.tasks is not None else default_tasks(self.teacher)


@dataclasses.dataclass(frozen=True)
class Batch:
  """Rows of a shard computed in one call.

  Attributes:
    rows: int64 `[m]` the shard's rows.
    padded: rows of the call (m, rounded up to a power of two, at most batch_size, then
      to a multiple of the devices; padded with copies of the last row).
    input_bucket: encoder length of the call.
    output_bucket: decoder length of the call.
  """
  rows: np.ndarray
  padded: int
  input_bucket: int
  output_bucket: int


def plan_batches(input_lengths: np.ndarray, output_lengths: np.ndarray, input_width: int,
                 output_width: int, batch_size: int, split: int = 1) -> list[Batch]:
  """A shard's rows grouped by (input bucket, output bucket), cut at `batch_size`.

  Args:
    input_lengths: int `[n]`.
    output_lengths: int `[n, D]`; a row's output bucket holds its longest decoding.
    input_width: the inputs' padded length (the largest bucket).
    output_width: the outputs' padded length.
    batch_size: most rows per batch.
    split: the devices the rows are split over: each call's rows are padded to a
      multiple of it.
  """
  in_b = np.array([bucket_length(int(v), input_width) for v in input_lengths])
  out_b = np.array([bucket_length(int(v), output_width) for v in output_lengths.max(axis=1)])
  order = np.lexsort((np.arange(len(in_b)), out_b, in_b))
  batches, lo = [], 0
  while lo < len(order):
    key = (in_b[order[lo]], out_b[order[lo]])
    hi = lo + 1
    while (hi < len(order) and hi - lo < batch_size
           and (in_b[order[hi]], out_b[order[hi]]) == key):
      hi += 1
    padded = -(-min(1 << (hi - lo - 1).bit_length(), batch_size) // split) * split
    batches.append(Batch(order[lo:hi].astype(np.int64), padded, int(key[0]), int(key[1])))
    lo = hi
  return batches


def shard_signals(teacher: Teacher, arrays: dict[str, np.ndarray], top_k: int,
                  batch_size: int, mesh: Mesh | None = None) -> dict[str, np.ndarray]:
  """The signals of one distillation shard.

  Args:
    teacher: the target.
    arrays: the shard (`distill.load_shard`).
    top_k: log-probabilities kept per position.
    batch_size: most examples per call.
    mesh: each call's rows are split over its data axis (`teacher.split_rows`); None:
      one device.

  Returns:
    The signals shard's arrays (`ts.SIGNAL_FIELDS`, in `ts.DTYPES`; shapes in
    specdec_jax/data/teacher_signals.py).

  Raises:
    ValueError: an encoder output does not fit float16.
  """
  inputs, outputs = arrays["inputs"], arrays["outputs"]                   # [n, W_in], [n, D, W_out]
  in_len, out_len = arrays["input_lengths"], arrays["output_lengths"]     # [n], [n, D]
  n, d = out_len.shape
  l_in, l_out = int(in_len.max()), int(out_len.max())
  decoder_inputs = np.pad(outputs[..., :-1], ((0, 0), (0, 0), (1, 0)))   # [n, D, W_out]
  hidden = np.zeros((n, l_in, teacher.d_model), np.float32)
  features = np.zeros((n, d, l_out, teacher.feature_size), np.float32)
  ids = np.zeros((n, d, l_out, top_k), np.int32)
  logprobs = np.zeros((n, d, l_out, top_k), np.float32)
  rest = np.zeros((n, d, l_out), np.float32)
  split = 1 if mesh is None else mesh.shape[DATA_AXIS]
  for batch in plan_batches(in_len, out_len, inputs.shape[1], outputs.shape[2], batch_size,
                            split):
    m = len(batch.rows)
    rows = np.concatenate([batch.rows, np.repeat(batch.rows[-1:], batch.padded - m)])
    out = teacher.signals(inputs[rows, :batch.input_bucket],
                          decoder_inputs[rows, :, :batch.output_bucket], top_k, mesh=mesh)
    a, b = min(batch.input_bucket, l_in), min(batch.output_bucket, l_out)
    hidden[batch.rows, :a] = out.encoder_hidden[:m, :a]
    if out.decoder_hidden is not None:
      features[batch.rows, :, :b] = out.decoder_hidden[:m, :, :b]
    ids[batch.rows, :, :b] = out.topk_ids[:m, :, :b]
    logprobs[batch.rows, :, :b] = out.topk_logprobs[:m, :, :b]
    rest[batch.rows, :, :b] = out.rest_logprob[:m, :, :b]
  in_mask = np.arange(l_in) < in_len[:, None]                            # [n, L_in]
  out_mask = np.arange(l_out) < out_len[..., None]                       # [n, D, L_out]
  hidden = np.where(in_mask[..., None], hidden, 0)
  features = np.where(out_mask[..., None], features, 0)
  largest = max(float(np.abs(hidden).max(initial=0.0)), float(np.abs(features).max(initial=0.0)))
  if largest > np.finfo(np.float16).max:
    raise ValueError(f"the target's hidden states reach {largest:.4g}, beyond float16's "
                     f"range; {ts.FORMAT} stores them as float16.")
  return {
      "index": arrays["index"].astype(np.int64), "encoder_hidden": hidden.astype(np.float16),
      "decoder_hidden": features.astype(np.float16),
      "topk_ids": np.where(out_mask[..., None], ids, 0).astype(np.int32),
      "topk_logprobs": np.where(out_mask[..., None], logprobs, 0).astype(np.float16),
      "rest_logprob": np.where(out_mask, rest, 0).astype(np.float32)}


def _check_config(config: SignalsConfig) -> None:
  if not config.task_names:
    raise DistillError("--tasks is empty: name the tasks to compute signals for.")
  for name in ("top_k", "batch_size"):
    if getattr(config, name) < 1:
      raise DistillError(f"--{name}={getattr(config, name)} must be >= 1.")
  if not config.max_disk_gb > 0:
    raise DistillError(f"--max_disk_gb={config.max_disk_gb} must be > 0.")


def shard_size_bound(arrays: dict[str, np.ndarray], teacher: Teacher, top_k: int) -> int:
  """An upper bound on the bytes of a distillation shard's signals (`ts.SIGNAL_FIELDS`
  at their stored dtypes, and 4 kB for the .npz's headers)."""
  n, d, _ = arrays["outputs"].shape
  l_in, l_out = int(arrays["input_lengths"].max()), int(arrays["output_lengths"].max())
  per_position = 2 * teacher.feature_size + top_k * (4 + 2) + 4
  return n * (8 + 2 * l_in * teacher.d_model + d * l_out * per_position) + 4096


def _disk_used(states: dict[str, _CorpusState]) -> int:
  """Bytes of the signals files listed by the runs' manifests."""
  return sum(os.path.getsize(os.path.join(s.signals_dir, e["file"]))
             for s in states.values() for e in s.done.values())


def check_disk(bound: int, used: int, config: SignalsConfig, free: int) -> None:
  """Refuses a shard of at most `bound` bytes when `used` bytes are written already.

  Raises:
    DistillError: the shard would pass `config.max_disk_gb`, or the disk's `free`
      bytes; the message names --max_disk_gb and what is used.
  """
  budget = int(config.max_disk_gb * 1e9)
  if used + bound > budget:
    raise DistillError(
        f"the signals take {used / 1e9:.2f} GB and the next shard up to {bound / 1e9:.2f} GB: "
        f"that passes --max_disk_gb={config.max_disk_gb}; raise it, or pass --tasks with "
        "fewer tasks.")
  if bound > free:
    raise DistillError(f"the next shard needs up to {bound / 1e9:.2f} GB and the disk has "
                       f"{free / 1e9:.2f} GB free: free some space, then rerun to resume.")


def _check_teacher(config: SignalsConfig, teacher: Teacher) -> None:
  known = set(teacher.tasks) | set(teacher.text_corpora)
  unknown = sorted(set(config.task_names) - known)
  if unknown:
    raise DistillError(f"--tasks={list(config.task_names)}: the {teacher.kind} teacher knows "
                       f"{sorted(known)}.")
  if config.top_k > teacher.vocab_size:
    raise DistillError(f"--top_k={config.top_k} exceeds the target's vocab_size "
                       f"{teacher.vocab_size}: pass a smaller --top_k.")


@dataclasses.dataclass
class _CorpusState:
  """One corpus's signals: the manifest being extended, and its current entries.

  Attributes:
    directory: the corpus's distillation directory.
    manifest: the signals manifest (written after each shard).
    done: shard -> entry of the signals files that are whole (sha256 checked).
    written: the manifest as last written (None: not yet).
  """
  directory: str
  manifest: dict
  done: dict[int, dict]
  written: dict | None = None

  @property
  def signals_dir(self) -> str:
    return ts.signals_dir(self.directory)

  def current(self, entry: dict) -> bool:
    """Whether the distillation shard `entry` has signals computed from it."""
    done = self.done.get(entry["shard"])
    return done is not None and done["distill_sha256"] == entry["sha256"]

  def save(self) -> None:
    self.manifest["shards"] = [self.done[k] for k in sorted(self.done)]
    if self.manifest != self.written:
      ts.write_manifest(self.signals_dir, self.manifest)
      self.written = _copy(self.manifest)


def _copy(manifest: dict) -> dict:
  return {**manifest, "shards": list(manifest["shards"])}


def _open_corpus(corpus: str, directory: str, distilled: dict, settings: dict) -> _CorpusState:
  """Reads (and checks) a corpus's earlier signals, or starts its manifest.

  Raises:
    DistillError: the signals directory holds another run's settings.
  """
  sig_dir = ts.signals_dir(directory)
  if not os.path.exists(os.path.join(sig_dir, ts.MANIFEST)):
    manifest = {"format": ts.FORMAT, "corpus": corpus, "settings": settings,
                "num_shards": distilled["num_shards"], "shards": [], "complete": False}
    return _CorpusState(directory, manifest, {})
  manifest = ts.read_manifest(sig_dir)
  old = manifest["settings"]
  changed = sorted(k for k in settings.keys() | old.keys() if settings.get(k) != old.get(k))
  if changed:
    diff = "; ".join(f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now" for k in changed)
    raise DistillError(f"{sig_dir} holds signals with other settings ({diff}): rerun with "
                       f"its flags to resume it, or delete {sig_dir} to start afresh.")
  done = {}
  for entry in manifest["shards"]:
    path = os.path.join(sig_dir, entry["file"])
    if not os.path.exists(path) or corpora.sha256_file(path) != entry["sha256"]:
      logging.warning("%s is listed but missing or corrupt; computing it again.", path)
      continue
    done[entry["shard"]] = entry
  state = _CorpusState(directory, manifest, done, written=_copy(manifest))
  state.manifest["shards"] = [done[k] for k in sorted(done)]
  return state


def _compute_shard(teacher: Teacher, state: _CorpusState, entry: dict,
                   config: SignalsConfig, mesh: Mesh | None, used: int) -> dict:
  """Computes and writes one shard's signals, `used` bytes being written already;
  returns its manifest entry."""
  t0 = time.perf_counter()
  arrays = distill.load_shard(state.directory, entry)
  os.makedirs(state.signals_dir, exist_ok=True)
  check_disk(shard_size_bound(arrays, teacher, config.top_k), used, config,
             shutil.disk_usage(state.signals_dir).free)
  signals = shard_signals(teacher, arrays, config.top_k, config.batch_size, mesh)
  data = ts.shard_bytes(signals)
  name = ts.signal_name(entry["shard"])
  atomic_io.atomic_write_bytes(os.path.join(state.signals_dir, name), data)
  seconds = time.perf_counter() - t0
  n, d, l_out = signals["rest_logprob"].shape
  tokens = int(arrays["input_lengths"].sum() + arrays["output_lengths"].sum())
  return {"shard": entry["shard"], "file": name, "format": ts.FORMAT, "count": n, "decodings": d,
          "input_length": signals["encoder_hidden"].shape[1], "output_length": l_out,
          "sha256": distill.sha256_bytes(data), "distill_file": entry["file"],
          "distill_sha256": entry["sha256"], "seconds": round(seconds, 3),
          "examples_per_s": round(n / seconds, 2), "tokens": tokens,
          "tokens_per_hour": round(tokens * 3600 / seconds)}


def compute_signals(config: SignalsConfig, *, mesh: Mesh | None = None, follow: bool = False,
                    poll_seconds: float = 60.0, max_shards: int | None = None,
                    report: Callable[[str], None] | None = None) -> dict[str, dict]:
  """Computes (or resumes) the signals of every task in `config.task_names`.

  Args:
    config: the settings.
    mesh: each call's rows are split over its data axis (None: one device); the
      values do not depend on it.
    follow: keep polling the distillation manifests (every `poll_seconds`) until each
      says complete and every shard has its signals; without it, compute the signals of
      the shards listed now and return.
    poll_seconds: the pause between looks while following.
    max_shards: stop after writing this many new shards (None: no limit).
    report: called with a line per shard written and per wait.

  Returns:
    Per corpus: {"shards", "num_shards", "complete", "computed", "tokens", "seconds",
    "examples_per_s", "tokens_per_hour"} (computed, tokens and seconds count only this
    run's shards; tokens: prompt and output tokens teacher-forced).

  Raises:
    DistillError: a bad setting or teacher, another run writing, signals of other
      settings, or a teacher that is not the one that decoded the data.
    FileNotFoundError: no distillation data for a corpus (without `follow`).
    distill.ShardError: a listed distillation shard is missing or corrupt.
  """
  _check_config(config)
  teacher = load_teacher(config.teacher, vocab=None)  # Signals score stored tokens.
  _check_teacher(config, teacher)
  teacher_sha = teacher.sha256
  settings = {"top_k": config.top_k, "teacher_sha256": teacher_sha,
              "vocab_size": teacher.vocab_size, "d_model": teacher.d_model}
  report = report or (lambda line: None)
  lock = lock_directory(config.root, LOCK, "teacher_signals")
  try:
    states: dict[str, _CorpusState] = {}
    summary = {c: {"computed": 0, "tokens": 0, "seconds": 0.0} for c in config.task_names}
    written = 0
    while True:
      waiting = []
      for corpus in config.task_names:
        directory = distill.task_dir(config.root, corpus)
        if follow and not os.path.exists(os.path.join(directory, distill.MANIFEST)):
          waiting.append(f"{corpus}: not decoded yet")
          continue
        distilled = distill.read_manifest(directory)
        if distilled["settings"]["teacher_sha256"] != teacher_sha:
          raise DistillError(
              f"--teacher={config.teacher} is not the target that decoded {directory} (its "
              f"sha256 {teacher_sha[:12]}..., the data's "
              f"{distilled['settings']['teacher_sha256'][:12]}...): pass that target.")
        if corpus not in states:
          states[corpus] = _open_corpus(corpus, directory, distilled, settings)
        state = states[corpus]
        state.manifest["num_shards"] = distilled["num_shards"]
        for entry in sorted(distilled["shards"], key=lambda e: e["shard"]):
          if state.current(entry):
            continue
          if max_shards is not None and written >= max_shards:
            break
          done = _compute_shard(teacher, state, entry, config, mesh, _disk_used(states))
          state.done[entry["shard"]] = done
          state.manifest["complete"] = False
          state.save()
          written += 1
          summary[corpus]["computed"] += done["count"]
          summary[corpus]["tokens"] += done["tokens"]
          summary[corpus]["seconds"] += done["seconds"]
          report(f"{corpus} shard {entry['shard']} ({len(state.done)} of "
                 f"{distilled['num_shards']}): {done['count']} examples x {done['decodings']} "
                 f"decodings, {done['tokens']:,} tokens in {done['seconds']:.1f} s "
                 f"({done['tokens_per_hour']:,} tokens/hour); signals "
                 f"{_disk_used(states) / 1e9:.2f} of {config.max_disk_gb} GB")
        state.manifest["complete"] = distilled["complete"] and all(
            state.current(e) for e in distilled["shards"])
        state.save()
        if not state.manifest["complete"]:
          waiting.append(f"{corpus}: {len(distilled['shards'])} of {distilled['num_shards']} "
                         f"shards decoded, {len(state.done)} with signals")
      if not follow or not waiting or (max_shards is not None and written >= max_shards):
        break
      report(f"waiting for the distillation data ({'; '.join(waiting)}); next look in "
             f"{poll_seconds:.0f} s")
      time.sleep(poll_seconds)
  finally:
    lock.close()
  for corpus, s in summary.items():
    state = states.get(corpus)
    s.update(shards=len(state.done) if state else 0,
             num_shards=state.manifest["num_shards"] if state else None,
             complete=bool(state and state.manifest["complete"]),
             seconds=round(s["seconds"], 1),
             examples_per_s=round(s["computed"] / s["seconds"], 2) if s["seconds"] else None,
             tokens_per_hour=round(s["tokens"] * 3600 / s["seconds"]) if s["seconds"] else None)
  return summary
