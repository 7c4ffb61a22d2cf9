"""In-domain English text from Debian packages, tokenized for SmolLM2, as distillation shards.

  python -m experiments.text_corpus [--data_dir=data_cache] [--shard_size=256]
  python -m experiments.teacher_signals --teacher=smollm2 --tasks=docs --batch_size=8

Fetches every package of `specdec_jax.data.text_corpus.packages()` with `apt-get download`
(never installed) into `<data_dir>/text_corpus/debs`, unpacks them, reads their
documentation (`doc_text`), drops the held-out pages and paragraphs (`text_corpus.HeldOut`:
the man pages of coreutils, findutils, grep, sed, tar, util-linux, procps, gzip and
diffutils, and the two tasks' validation and test splits), writes the chat-shaped examples
to `<data_dir>/text_corpus/examples.jsonl` with a manifest of what each source gave, and
tokenizes them in SmolLM2's chat template into the distillation format
(`specdec_jax.data.distill`, corpus "docs", one "decoding": the assistant turn's text, not
decoded by the target) under `<data_dir>/distill_smollm2/docs/`, where
`experiments.teacher_signals` computes the target's features and top-k log-probabilities
along them by teacher forcing. Needs the prepared corpora (`python -m
specdec_jax.data.prepare`). Outputs are a function of the packages' versions; a rerun
whose manifest exists does nothing unless --force.
"""

from __future__ import annotations

import collections
import os
import sys
import time

import numpy as np
from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.data import chat_prompts, debian, distill, layout, text_corpus
from specdec_jax.distillation import teacher as teachers

_FLAGS = flags.FlagValues()
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, f"Prepared data directory; default ${layout.DATA_DIR_ENV} or "
    "<repo>/data_cache.", flag_values=_FLAGS)
_SHARD_SIZE = flags.DEFINE_integer("shard_size", 256, "Examples per distillation shard.",
                                   flag_values=_FLAGS)
_PROMPT_WIDTH = flags.DEFINE_integer("prompt_width", 256, "Most tokens of a chat prompt.",
                                     flag_values=_FLAGS)
_ANSWER_WIDTH = flags.DEFINE_integer(
    "answer_width", 256, "Most tokens of an assistant turn (EOS included when it fits).",
    flag_values=_FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "Rebuild even if the manifest exists.",
                           flag_values=_FLAGS)

CORPUS = layout.TEXT_CORPUS
MANIFEST = "manifest.json"


def fetch(packages: tuple[str, ...], deb_dir: str, unpack_dir: str) -> dict[str, str]:
  """Downloads the missing packages one by one (so a missing one is named) and unpacks them.

  Returns:
    {package: unpacked directory}.

  Raises:
    text_corpus.CorpusError: a package cannot be fetched, naming it and the fix.
  """
  found = debian.find_debs(deb_dir, packages) if os.path.isdir(deb_dir) else {}
  for package in packages:
    if package in found:
      continue
    try:
      debian.download((package,), deb_dir)
    except debian.PackageError as e:
      raise text_corpus.CorpusError(
          f"package {package!r} of the text corpus cannot be fetched ({e}); put its .deb in "
          f"{deb_dir}, or remove it from text_corpus.SOURCES.") from e
  found = debian.find_debs(deb_dir, packages)
  missing = sorted(set(packages) - set(found))
  if missing:
    raise text_corpus.CorpusError(f"no .deb of {missing} in {deb_dir} after apt-get download: "
                                  "check the package names (apt-cache policy NAME).")
  return {p: debian.unpack(found[p], os.path.join(unpack_dir, p)) for p in packages}


def build_examples(dirs: dict[str, str], data_dir: str
                   ) -> tuple[list[text_corpus.TextExample], dict]:
  """The corpus's examples and a report of what each source gave and what was dropped."""
  holdout = text_corpus.held_out({p: dirs[p] for p in text_corpus.HELD_OUT_PACKAGES}, data_dir)
  documents = [(0, d) for d in text_corpus.libreoffice_documents(data_dir)]
  for source in text_corpus.SOURCES:
    documents += [(source.group, d) for d in text_corpus.source_documents(source,
                                                                          dirs[source.package])]
  kept, dropped = text_corpus.filter_documents((d for _, d in documents), holdout)
  groups = {(d.package, d.name): g for g, d in documents}
  examples = [ex for d in kept
              for ex in text_corpus.document_examples(d, groups[(d.package, d.name)])]
  checked = text_corpus.check_held_out(examples, holdout)
  words = collections.Counter()
  for ex in examples:
    words[ex.package] += len(ex.passage.split()) + len(ex.answer.split())
  report = {"documents": len(kept), "examples": len(examples), "checked_held_out": checked,
            "dropped": dropped, "held_out_pages": len(holdout.pages),
            "held_out_sentences": len(holdout.sentences), "words_by_package": dict(words)}
  return examples, report


def tokenize(examples: list[text_corpus.TextExample], prompt_width: int, answer_width: int
             ) -> tuple[list[list[int]], list[list[int]], list[bool], str]:
  """Chat prompts and assistant turns in SmolLM2's tokenizer; returns (prompts, answers,
  truncated, the GGUF file's sha256)."""
  import gguf  # noqa: PLC0415 (the llama extra)

  from specdec_jax.models.llama import gguf_loader  # noqa: PLC0415 (the llama extra)
  path = gguf_loader.smollm2_path()
  vocabulary = gguf_loader.read_vocabulary(gguf.GGUFReader(path))
  tokenizer = vocabulary.tokenizer()
  prompts, answers, truncated = [], [], []
  for ex in examples:
    prompts.append(chat_prompts.chat_prompt(vocabulary, tokenizer, ex.task, ex.passage,
                                            prompt_width))
    ids = [*tokenizer.encode(ex.answer).ids, vocabulary.eos_id]
    truncated.append(len(ids) > answer_width)
    answers.append(ids[:answer_width])
  return prompts, answers, truncated, teachers.teacher_sha256(teachers.SMOLLM2)


def write_shards(directory: str, examples: list[text_corpus.TextExample],
                 prompts: list[list[int]], answers: list[list[int]], truncated: list[bool],
                 settings: dict, shard_size: int) -> int:
  """Writes the distillation shards (group, then length order) and their manifest last."""
  keep = [i for i in range(len(examples)) if 0 not in prompts[i] and 0 not in answers[i]]
  order = sorted(keep, key=lambda i: (examples[i].group, len(prompts[i]) + len(answers[i]), i))
  os.makedirs(directory, exist_ok=True)
  entries = []
  for shard, start in enumerate(range(0, len(order), shard_size)):
    rows = order[start:start + shard_size]
    width_in = max(len(prompts[i]) for i in rows)
    width_out = max(len(answers[i]) for i in rows)
    arrays = {
        "ids": np.array([examples[i].id for i in rows]),
        "index": np.array(rows, np.int64),
        "inputs": np.zeros((len(rows), width_in), np.int32),
        "input_lengths": np.array([len(prompts[i]) for i in rows], np.int32),
        "outputs": np.zeros((len(rows), 1, width_out), np.int32),
        "output_lengths": np.array([[len(answers[i])] for i in rows], np.int32),
        "truncated": np.array([[truncated[i]] for i in rows], bool)}
    for r, i in enumerate(rows):
      arrays["inputs"][r, :len(prompts[i])] = prompts[i]
      arrays["outputs"][r, 0, :len(answers[i])] = answers[i]
    data = distill.shard_bytes(arrays)
    name = distill.shard_name(shard)
    atomic_io.atomic_write_bytes(os.path.join(directory, name), data)
    entries.append({"shard": shard, "file": name, "start": start, "stop": start + len(rows),
                    "count": len(rows), "decodings": 1, "sha256": distill.sha256_bytes(data),
                    "tokens": int(arrays["input_lengths"].sum() + arrays["output_lengths"].sum())})
  distill.write_manifest(directory, {
      "format": distill.FORMAT, "corpus": CORPUS, "task": "specdec_text_corpus",
      "settings": settings, "num_shards": len(entries), "shards": entries, "complete": True})
  return len(order)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  data_dir = _DATA_DIR.value or layout.default_data_dir()
  home = os.path.join(data_dir, "text_corpus")
  manifest_path = os.path.join(home, MANIFEST)
  if os.path.exists(manifest_path) and not _FORCE.value:
    print(f"{manifest_path} exists: nothing to do (--force rebuilds).")
    return
  t0 = time.time()
  try:
    dirs = fetch(text_corpus.packages(), os.path.join(home, "debs"),
                 os.path.join(home, "unpacked"))
    examples, report = build_examples(dirs, data_dir)
  except (text_corpus.CorpusError, FileNotFoundError) as e:
    sys.exit(f"text_corpus: error: {e}")
  examples_sha = text_corpus.write_examples(os.path.join(home, "examples.jsonl"), examples)
  prompts, answers, truncated, teacher_sha = tokenize(examples, _PROMPT_WIDTH.value,
                                                      _ANSWER_WIDTH.value)
  settings = {"teacher_sha256": teacher_sha, "origin": "text (teacher-forced, not decoded)",
              "temperatures": [], "examples_sha256": examples_sha,
              "prompt_width": _PROMPT_WIDTH.value, "answer_width": _ANSWER_WIDTH.value,
              "shard_size": _SHARD_SIZE.value}
  directory = distill.task_dir(teachers.default_root(data_dir, teachers.SMOLLM2), CORPUS)
  rows = write_shards(directory, examples, prompts, answers, truncated, settings,
                      _SHARD_SIZE.value)
  tokens = sum(map(len, prompts)) + sum(map(len, answers))
  report.update(tokens=tokens, prompt_tokens=sum(map(len, prompts)),
                answer_tokens=sum(map(len, answers)), rows=rows, examples_sha256=examples_sha,
                distill_dir=directory, seconds=round(time.time() - t0, 1))
  atomic_io.write_json(manifest_path, report)
  print(f"{report['examples']} examples, {tokens:,} tokens ({report['answer_tokens']:,} in "
        f"assistant turns) from {len(report['words_by_package'])} packages; dropped "
        f"{report['dropped']}; shards in {directory}; {report['seconds']} s")


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: flags.FLAGS(_FLAGS(argv, known_only=True)))
