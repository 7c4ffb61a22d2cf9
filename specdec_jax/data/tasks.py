"""seqio Tasks `specdec_ende`, `specdec_mansum` and the Mixture `specdec_mix`; and over the
target's own outputs (`python -m experiments.distill_data`), the Tasks `specdec_distill_ende`,
`specdec_distill_mansum` and the Mixture `specdec_distill_mix` (train split only).

Nothing is registered at import: call `register_tasks(data_dir)` (idempotent; calling it
with another data_dir re-registers every name on that directory).
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import seqio
import tensorflow as tf

from specdec_jax.data import corpora, distill, layout, vocab

_registered_data_dir: str | None = None
DISTILL_MIXTURE = "specdec_distill_mix"


def _jsonl_dataset(data_dir: str, corpus: str, split: str, shuffle_files: bool,
                   seed: int | None = None) -> tf.data.Dataset:
  """The rows of one split as {"id", "inputs", "targets", "page"} string features.

  The files are sorted by page, so neighbouring rows share a topic. When shuffling, the
  whole split is permuted here, afresh on each pass (seqio repeats the source before its
  own shuffle): seqio's 1,000-example buffer alone would feed training one topic at a
  time, a window of ~3% of En-De sliding through the help sections.
  """
  examples = corpora.read_jsonl(layout.corpus_file(data_dir, corpus, split))
  dataset = tf.data.Dataset.from_tensor_slices({
      field: tf.constant([getattr(ex, field) for ex in examples], dtype=tf.string)
      for field in ("id", "inputs", "targets", "page")})
  if shuffle_files:
    dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
  return dataset


def _add_prefix(dataset: tf.data.Dataset, prefix: str) -> tf.data.Dataset:
  """Prepends the task prefix to "inputs"."""

  def fn(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {**ex, "inputs": tf.strings.join([prefix, ex["inputs"]])}

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def _row_counts(data_dir: str, corpus: str) -> dict[str, int]:
  manifest_path = os.path.join(data_dir, layout.MANIFEST)
  if not os.path.exists(manifest_path):
    raise FileNotFoundError(
        f"data_dir={data_dir!r} has no {layout.MANIFEST}: run "
        f"`python -m specdec_jax.data.prepare --data_dir={data_dir}` first.")
  with open(manifest_path, encoding="utf-8") as f:
    by_split = json.load(f)["corpora"][corpus]
  return {split: by_split[split]["rows"] for split in layout.SPLITS}


def register_tasks(data_dir: str | None = None, vocab_path: str | None = None) -> None:
  """Registers the Tasks and the Mixture on the corpora in `data_dir`.

  Args:
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    vocab_path: SentencePiece model; default the committed one.
  """
  global _registered_data_dir
  data_dir = os.path.abspath(data_dir or layout.default_data_dir())
  if _registered_data_dir == data_dir:
    return
  vocabulary = vocab.get_vocabulary(vocab_path)
  features = {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=True),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=True),
  }
  for name in (layout.MIXTURE, *(c.task for c in layout.CORPORA.values())):
    seqio.MixtureRegistry.remove(name)
    seqio.TaskRegistry.remove(name)
  for corpus in layout.CORPORA.values():
    seqio.TaskRegistry.add(
        corpus.task,
        source=seqio.FunctionDataSource(
            dataset_fn=functools.partial(_jsonl_dataset, data_dir, corpus.name),
            splits=layout.SPLITS,
            num_input_examples=_row_counts(data_dir, corpus.name)),
        preprocessors=[
            functools.partial(_add_prefix, prefix=corpus.prefix),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features)
  seqio.MixtureRegistry.add(
      layout.MIXTURE, [c.task for c in layout.CORPORA.values()],
      default_rate=seqio.mixing_rate_num_examples)
  _register_distill_tasks(data_dir, vocabulary)
  _registered_data_dir = data_dir


def distill_task_name(corpus: str) -> str:
  """The seqio Task over a corpus's distillation data, e.g. "specdec_distill_ende"."""
  return f"specdec_distill_{corpus}"


def _distill_dataset(root: str, corpus: str, split: str, shuffle_files: bool,
                     seed: int | None = None) -> tf.data.Dataset:
  """Every (example, decoding) of the distillation data, as token features.

  Features: "inputs" int32 [input_len] (the target's encoder tokens, EOS included),
  "targets" int32 [output_len] (the target's output: EOS included unless it was truncated),
  "id" string, "decoding" int32 (0 greedy, 1.. samples). The data is read and checked
  (`distill.read_distilled`) when the dataset is built, so a missing, unfinished or
  corrupt run is an error naming the file and the command to rerun.
  """
  if split != "train":
    raise ValueError(f"split={split!r}: the distillation data covers the train split only.")
  data = distill.read_distilled(corpus, root=root)
  inputs, targets, which = data.pairs()
  rows, decodings = which[:, 0], which[:, 1]
  dataset = tf.data.Dataset.from_tensor_slices({
      "inputs": inputs, "input_length": data.input_lengths[rows],
      "targets": targets, "target_length": data.output_lengths[rows, decodings],
      "id": np.char.encode(data.ids[rows], "utf-8"), "decoding": decodings})
  if shuffle_files:  # The whole set, as in _jsonl_dataset: shards are sorted by length.
    dataset = dataset.shuffle(len(inputs), seed=seed, reshuffle_each_iteration=True)

  def strip(ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {"inputs": ex["inputs"][:ex["input_length"]],
            "targets": ex["targets"][:ex["target_length"]],
            "id": ex["id"], "decoding": ex["decoding"]}

  return dataset.map(strip, num_parallel_calls=tf.data.AUTOTUNE)


def _register_distill_tasks(data_dir: str, vocabulary: seqio.Vocabulary) -> None:
  """Registers the distillation Tasks and their Mixture on `<data_dir>/distill`.

  Registered whether or not the data exists yet; it is read when a dataset is built.
  The tokens carry their EOS already, so no EOS is appended (a truncated output stays
  as the target wrote it).
  """
  root = distill.distill_root(data_dir)
  features = {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=False, required=True),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=False, required=True),
  }
  names = [distill_task_name(c) for c in layout.CORPORA]
  for name in (DISTILL_MIXTURE, *names):
    seqio.MixtureRegistry.remove(name)
    seqio.TaskRegistry.remove(name)
  for corpus, name in zip(layout.CORPORA, names, strict=True):
    try:
      counts = {"train": distill.num_rows(corpus, root=root)}
    except (FileNotFoundError, ValueError):
      counts = None  # Not made yet (or unreadable): building a dataset says so.
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(
            dataset_fn=functools.partial(_distill_dataset, root, corpus), splits=("train",),
            num_input_examples=counts),
        preprocessors=[],
        output_features=features)
  # Rates read the manifests when the mixture is used (rows = examples x decodings).
  seqio.MixtureRegistry.add(DISTILL_MIXTURE, [
      (name, functools.partial(_distill_rate, root, corpus))
      for corpus, name in zip(layout.CORPORA, names, strict=True)])


def _distill_rate(root: str, corpus: str, task: seqio.Task) -> float:
  del task
  return float(distill.num_rows(corpus, root=root))
