"""Tests of the seqio Tasks/Mixture and the numpy training batches on a tiny data dir."""

import os

import numpy as np
import pytest
import seqio

from specdec_jax import atomic_io
from specdec_jax.data import corpora, layout, pipeline, tasks, vocab

_ROWS = {
    "ende": [("Choose Tools - Options.", "Wählen Sie Extras - Optionen."),
             ("Resize the overview.", "Größe der Übersicht ändern."),
             ("Press Ctrl + F.", "Drücken Sie Strg + F.")],
    "mansum": [("alarm() arranges for a signal to be delivered.", "set an alarm clock"),
               ("ldd prints the shared objects.", "print shared object dependencies")],
}


def _make_data_dir(root: str, limit: int | None = None) -> str:
  manifest = {"corpora": {}}
  for corpus, rows in _ROWS.items():
    manifest["corpora"][corpus] = {}
    for split in layout.SPLITS:
      examples = [corpora.Example(f"{corpus}{i}", src, tgt, f"{corpus}{i}")
                  for i, (src, tgt) in enumerate(rows[:limit])]
      n = corpora.write_jsonl(layout.corpus_file(root, corpus, split), examples)
      manifest["corpora"][corpus][split] = {"rows": n}
  atomic_io.write_json(os.path.join(root, layout.MANIFEST), manifest)
  return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return _make_data_dir(str(tmp_path_factory.mktemp("data")))


def test_task_adds_prefix_tokenizes_and_appends_eos(data_dir):
  tasks.register_tasks(data_dir)
  tasks.register_tasks(data_dir)  # Idempotent.
  task = seqio.get_mixture_or_task("specdec_ende")
  ds = task.get_dataset({"inputs": 64, "targets": 64}, split="validation", shuffle=False)
  ex = next(ds.as_numpy_iterator())
  v = vocab.get_vocabulary()
  assert v.decode(ex["inputs"].tolist()) == "translate English to German: Choose Tools - Options."
  assert ex["targets"][-1] == 1
  assert v.decode(ex["targets"].tolist()) == "Wählen Sie Extras - Optionen."


def test_mixture_rates_follow_example_counts(data_dir):
  tasks.register_tasks(data_dir)
  mix = seqio.get_mixture_or_task("specdec_mix")
  rates = {t.name: mix.get_rate(t) for t in mix.tasks}
  assert rates == {"specdec_ende": 3.0, "specdec_mansum": 2.0}


def test_batches_have_t5x_shapes_and_shifted_decoder_inputs(data_dir):
  batches = pipeline.get_batches("specdec_mix", "train", batch_size=2, inputs_length=24,
                                 targets_length=8, data_dir=data_dir, seed=3)
  batch = next(batches)
  assert set(batch) == set(pipeline.BATCH_FEATURES)
  assert batch["encoder_input_tokens"].shape == (2, 24)
  targets, inputs = batch["decoder_target_tokens"], batch["decoder_input_tokens"]
  assert targets.shape == inputs.shape == batch["decoder_loss_weights"].shape == (2, 8)
  np.testing.assert_array_equal(inputs[:, 0], 0)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  np.testing.assert_array_equal(batch["decoder_loss_weights"], targets > 0)


def test_registering_another_data_dir_replaces_the_tasks(data_dir, tmp_path):
  tasks.register_tasks(data_dir)
  assert seqio.get_mixture_or_task("specdec_mansum").num_input_examples("test") == 2
  tasks.register_tasks(_make_data_dir(str(tmp_path), limit=1))
  try:
    assert seqio.get_mixture_or_task("specdec_mansum").num_input_examples("test") == 1
  finally:
    tasks.register_tasks(data_dir)


def test_shuffled_source_permutes_the_whole_split_afresh_each_pass(tmp_path):
  rows = [corpora.Example(f"r{i}", f"sentence {i}", f"Satz {i}", f"page{i // 10}")
          for i in range(200)]
  corpora.write_jsonl(layout.corpus_file(str(tmp_path), "ende", "train"), rows)

  def ids(dataset):
    return [x["id"].decode() for x in dataset.as_numpy_iterator()]

  ordered = ids(tasks._jsonl_dataset(str(tmp_path), "ende", "train", False))
  assert ordered == [r.id for r in rows]
  shuffled = ids(tasks._jsonl_dataset(str(tmp_path), "ende", "train", True, seed=1).repeat(2))
  passes = [shuffled[:200], shuffled[200:]]
  assert all(sorted(p) == sorted(ordered) for p in passes)
  assert passes[0] != passes[1]
  # The first 20 rows span many pages, not the first two pages of a page-sorted file.
  assert len({int(i[1:]) // 10 for i in passes[0][:20]}) >= 8
  # Seeded: the same seed gives the same order (so a resumed run sees the same batches).
  assert ids(tasks._jsonl_dataset(str(tmp_path), "ende", "train", True, seed=1)) == passes[0]
