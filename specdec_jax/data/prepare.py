"""Builds the corpora, vocabulary and n-gram statistics from Debian packages.

  python -m specdec_jax.data.prepare [--data_dir=DIR] [--deb_dir=DIR] [--force]
      [--notrain_vocab] [--export_assets]

Steps: fetch the four .deb files (`apt-get download`, unless --deb_dir holds them), unpack
them (`dpkg-deb -x`), build the En-De and man-page corpora, split them by page (refusing
overlapping splits), train the SentencePiece vocabulary on the training splits, count the
training targets' unigrams/bigrams, and write `<data_dir>/manifest.json` last. Outputs are
byte-identical across runs; a run whose manifest and outputs exist does nothing unless
--force. --export_assets then copies what is committed to <repo>/assets (`export_assets`):
the vocabulary, the statistics, and the prompts a fresh checkout measures on.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

from absl import app, flags, logging

from specdec_jax import atomic_io
from specdec_jax.data import (
    corpora,
    debian,
    layout,
    libreoffice,
    manpages,
    ngram_stats,
    prompts,
    vocab,
)

_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Output directory; default ${layout.DATA_DIR_ENV} or <repo>/data_cache.")
_DEB_DIR = flags.DEFINE_string(
    "deb_dir", None, "Directory with the four .deb files (fetched by hand); default "
    "<data_dir>/debs, filled by `apt-get download`.")
_FORCE = flags.DEFINE_bool("force", False, "Rebuild even if the manifest's outputs exist.")
_TRAIN_VOCAB = flags.DEFINE_bool(
    "train_vocab", True, "Train the vocabulary; if false, use the committed one in assets/.")
_EXPORT_ASSETS = flags.DEFINE_bool(
    "export_assets", False, "Copy the vocabulary, the n-gram statistics and the committed "
    "prompts (assets/prompts/) to <repo>/assets, from this preparation or an earlier one.")

SPLIT_SPECS = {
    "ende": corpora.SplitSpec(validation_percent=5, test_percent=5),
    "mansum": corpora.SplitSpec(validation_percent=10, test_percent=10),
}


def _rel(data_dir: str, path: str) -> str:
  return os.path.relpath(path, data_dir).replace(os.sep, "/")


def is_prepared(data_dir: str) -> bool:
  """True when the manifest exists and every file it lists is present."""
  path = os.path.join(data_dir, layout.MANIFEST)
  if not os.path.exists(path):
    return False
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  return all(os.path.exists(os.path.join(data_dir, rel)) for rel in manifest["files"])


def fetch_debs(data_dir: str, deb_dir: str | None) -> dict[str, debian.Deb]:
  """The four packages' .deb files: those in `deb_dir` if given, else downloaded (once)."""
  given = deb_dir is not None
  deb_dir = deb_dir or os.path.join(data_dir, "debs")
  debs = debian.find_debs(deb_dir) if os.path.isdir(deb_dir) else {}
  missing = tuple(p for p in debian.PACKAGES if p not in debs)
  if missing and given:
    raise debian.PackageError(
        f"deb_dir={deb_dir!r} lacks .deb files of {', '.join(missing)}: add them, or leave "
        "--deb_dir unset to fetch them with apt-get.")
  if missing:
    logging.info("apt-get download %s -> %s", " ".join(missing), deb_dir)
    debian.download(missing, deb_dir)
    debs = debian.find_debs(deb_dir)
  return debs


def build_corpora(
    data_dir: str, debs: dict[str, debian.Deb]) -> dict[str, dict[str, list[corpora.Example]]]:
  """Unpacks the packages and returns {corpus: {split: examples}}."""
  unpacked = {
      name: debian.unpack(deb, os.path.join(data_dir, "unpacked", f"{name}_{deb.version}"))
      for name, deb in debs.items()}
  examples = {
      "ende": libreoffice.build_examples(unpacked["libreoffice-help-en-us"],
                                         unpacked["libreoffice-help-de"]),
      "mansum": manpages.build_examples([unpacked["manpages"], unpacked["manpages-dev"]]),
  }
  return {name: corpora.make_splits(exs, SPLIT_SPECS[name]) for name, exs in examples.items()}


def prepare(data_dir: str, deb_dir: str | None, train_vocab: bool) -> dict:
  """Runs every step and writes the manifest; returns the manifest."""
  debs = fetch_debs(data_dir, deb_dir)
  splits = build_corpora(data_dir, debs)
  manifest: dict = {
      "debs": {name: {"version": d.version, "file": os.path.basename(d.path),
                      "sha256": corpora.sha256_file(d.path)} for name, d in sorted(debs.items())},
      "corpora": {}, "split_percent": {}, "stats": {}, "files": []}
  for name, by_split in splits.items():
    spec = SPLIT_SPECS[name]
    manifest["split_percent"][name] = {"validation": spec.validation_percent,
                                       "test": spec.test_percent}
    manifest["corpora"][name] = {}
    for split, examples in by_split.items():
      path = layout.corpus_file(data_dir, name, split)
      rows = corpora.write_jsonl(path, examples)
      manifest["corpora"][name][split] = {"file": _rel(data_dir, path), "rows": rows,
                                          "sha256": corpora.sha256_file(path)}
      manifest["files"].append(_rel(data_dir, path))

  if train_vocab:
    texts = [t for by_split in splits.values() for ex in by_split["train"]
             for t in (ex.inputs, ex.targets)]
    vocab_path = vocab.train_vocabulary(texts, os.path.join(data_dir, "vocab"))
    manifest["files"].append(_rel(data_dir, vocab_path))
  else:
    vocab_path = vocab.default_vocab_path()
  processor = vocab.load_processor(vocab_path)
  manifest["vocab"] = {"sha256": corpora.sha256_file(vocab_path),
                       "vocab_size": processor.get_piece_size(), "trained": train_vocab}

  for name, by_split in splits.items():
    ids = processor.encode([ex.targets for ex in by_split["train"]])
    stats = ngram_stats.count_ngrams(ids, processor.get_piece_size())
    path = layout.stats_file(os.path.join(data_dir, "stats"), name)
    ngram_stats.save_ngram_stats(path, stats)
    manifest["stats"][name] = {"file": _rel(data_dir, path), "sha256": corpora.sha256_file(path),
                               "bigrams": int(stats.bigram_count.size)}
    manifest["files"].append(_rel(data_dir, path))

  atomic_io.write_json(os.path.join(data_dir, layout.MANIFEST), manifest)
  return manifest


def export_assets(data_dir: str) -> list[str]:
  """Copies a preparation's committed parts to <repo>/assets; returns what it wrote.

  The vocabulary (if this preparation trained it), the n-gram statistics, and the
  prompts a fresh checkout measures on (`prompts.write_committed_prompts`: the first
  test examples of each task).
  """
  with open(os.path.join(data_dir, layout.MANIFEST), encoding="utf-8") as f:
    manifest = json.load(f)
  done = []
  if manifest["vocab"]["trained"]:
    target = os.path.join(layout.ASSETS_DIR, "vocab")
    vocab.export_vocabulary(os.path.join(data_dir, "vocab"), target)
    done.append(f"{target}: the vocabulary")
  for name in manifest["stats"]:
    target = layout.stats_file(os.path.join(layout.ASSETS_DIR, "stats"), name)
    with open(layout.stats_file(os.path.join(data_dir, "stats"), name), "rb") as f:
      atomic_io.atomic_write_bytes(target, f.read())
    done.append(f"{target}: {name}'s n-gram statistics")
  return done + prompts.write_committed_prompts(data_dir)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}: only flags are accepted.")
  data_dir = os.path.abspath(_DATA_DIR.value or layout.default_data_dir())
  if not _FORCE.value and is_prepared(data_dir):
    logging.info("%s is prepared (manifest present); pass --force to rebuild.", data_dir)
  else:
    start = time.time()
    try:
      manifest = prepare(data_dir, _DEB_DIR.value, _TRAIN_VOCAB.value)
    except debian.PackageError as e:
      raise app.UsageError(str(e)) from e
    for name, by_split in manifest["corpora"].items():
      logging.info("%s: %s", name, {s: v["rows"] for s, v in by_split.items()})
    logging.info("vocab_size=%d; manifest %s; %.1f s", manifest["vocab"]["vocab_size"],
                 os.path.join(data_dir, layout.MANIFEST), time.time() - start)
  if _EXPORT_ASSETS.value:
    for line in export_assets(data_dir):
      logging.info("%s", line)


if __name__ == "__main__":
  app.run(main)
