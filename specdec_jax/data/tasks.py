"""seqio Tasks `specdec_ende`, `specdec_mansum` and the Mixture `specdec_mix`.

Nothing is registered at import: call `register_tasks(data_dir)` (idempotent; calling it
with another data_dir re-registers the three names on that directory).
"""

from __future__ import annotations

import functools
import json
import os

import seqio
import tensorflow as tf

from specdec_jax.data import corpora, layout, vocab

_registered_data_dir: str | None = None


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
  _registered_data_dir = data_dir
