"""The T5 target kind ("t5", the default): our trained family or any HF T5 checkpoint.

`Settings.target` and every checkpoint draft are HF-format directories
(config.json + safetensors) under `Settings.models_dir`; examples are tokenised
with the SentencePiece model at `Settings.vocab_path` (`prompts.tokenize`).
Drafts: a checkpoint directory (a `T5Draft`, or a `SharedEncoderDraft` for a
draft that reads the target's encoder), "unigram" / "bigram" (the task's
corpus statistics, `data.ngram_stats`) and "prompt_lookup". Missing trained
models can be measured as random-init stand-ins (`stand_ins`). A token tree
(`Experiment.tree`) is expanded by a checkpoint draft's top-k branches
(`interface.draft_branches`), scored in one pass by `T5Scorer.score_tree`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from absl import logging

from specdec_jax import partitioning
from specdec_jax.data import layout, prompts
from specdec_jax.data.ngram_stats import load_ngram_stats
from specdec_jax.decoding.drafts import Draft, NgramDraft
from specdec_jax.experiment.targets import stand_ins
from specdec_jax.experiment.targets.interface import (
  PROMPT_LOOKUP,
  DraftKind,
  LoadedTarget,
  TargetKind,
  draft_branches,
  require,
)
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import T5Config, T5Model, T5Scorer, check_t5_model, make_draft
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, load_model, load_model_config

if TYPE_CHECKING:
  from specdec_jax.experiment.settings import Experiment, Settings

NGRAM_ORDER = {"unigram": 1, "bigram": 2}


@dataclasses.dataclass(frozen=True)
class T5Target(LoadedTarget):
  """A loaded T5 target and its SentencePiece processor.

  Attributes:
    processor: the `sentencepiece.SentencePieceProcessor` of `Settings.vocab_path`.
  """

  processor: Any

  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    del task  # The task prefix is in the texts.
    return prompts.tokenize(self.processor, list(texts), width)

  def pieces(self, ids: list[int]) -> list[str]:
    return [self.processor.id_to_piece(i) for i in ids]

  def prompt_format(self, task: str) -> str:
    return (f"{layout.CORPORA[task].prefix!r} + the example's input, SentencePiece "
            f"({os.path.basename(self.settings.vocab_path)}), EOS-terminated")


def load(settings: Settings, placement: partitioning.Placement) -> T5Target:
  """The target checkpoint, sharded on `placement.mesh` by `placement.rules`, prepared
  once."""
  import sentencepiece as spm  # noqa: PLC0415  (no TensorFlow on this path)

  cfg, params = load_hf_checkpoint(settings.checkpoint_dir(settings.target),
                                   dtype=settings.dtype, param_dtype=settings.param_dtype)
  mesh = placement.mesh
  partitioning.check_model_fits(cfg, mesh, placement.rules)
  model = T5Model(cfg, axis_rules=placement.rules,
                  options=DecodeOptions.for_backend(devices=mesh.size))
  check_t5_model(model, "Settings.target")
  params = partitioning.shard_params(model, params, mesh)
  return T5Target(scorer=T5Scorer(model, model.prepare(params)), eos_id=cfg.eos_token_id,
                  encoder_width=cfg.d_model, settings=settings, placement=placement,
                  processor=spm.SentencePieceProcessor(model_file=settings.vocab_path))


def check_checkpoint(exp: Experiment, spec: str, field: str) -> int:
  """Checks that a checkpoint directory is complete; returns its vocabulary size."""
  path = exp.checkpoint_dir(spec)
  config_path = os.path.join(path, "config.json")
  if not os.path.isfile(config_path):
    raise FileNotFoundError(
        f"Experiment.{field}: no checkpoint at {path!r} (missing config.json). Ship the trained "
        "family there (`python -m experiments.export_family`), measure random-init stand-ins "
        "of its shapes instead (--gin.Experiment.stand_ins_when_missing=True), or fix the "
        "path.")
  has_weights = any(os.path.isfile(os.path.join(path, f))
                    for f in ("model.safetensors", "model.safetensors.index.json"))
  require(has_weights, f"Experiment.{field}: {path!r} has config.json but no "
                       "model.safetensors; re-export it with save_hf_checkpoint.")
  try:
    return load_model_config(path).vocab_size
  except ValueError as e:  # A CheckpointError naming the file and field, or another.
    raise type(e)(f"Experiment.{field}: {e}") from e


def _vocab_size(path: str) -> int:
  import sentencepiece as spm  # noqa: PLC0415  (no TensorFlow on this path)

  require(os.path.isfile(path), f"Experiment.vocab_path={path!r} does not exist; point it at "
                                "the SentencePiece model (assets/vocab/specdec_sp8k.model).")
  return spm.SentencePieceProcessor(model_file=path).vocab_size()


def check(exp: Experiment) -> int:
  """The tasks, the target checkpoint and the tokenizer (no weights); returns the target's
  vocabulary."""
  for task in exp.tasks:
    require(task in layout.CORPORA, f"Experiment.tasks has {task!r}, a chat model's task; a T5 "
                                    f"target runs the corpora {sorted(layout.CORPORA)}.")
  target_vocab = check_checkpoint(exp, exp.target, "target")
  tokenizer_vocab = _vocab_size(exp.vocab_path)
  require(tokenizer_vocab <= target_vocab,
          f"Experiment.vocab_path has {tokenizer_vocab} pieces but the target's vocabulary is "
          f"{target_vocab}; use the tokenizer the target was trained with.")
  return target_vocab


def _same_vocabulary(spec: str, vocab: int, target_vocab: int, where: str = "") -> None:
  require(vocab == target_vocab,
          f"Experiment.drafts: draft {spec!r}{' for ' + where if where else ''} has a "
          f"vocabulary of {vocab}, the target of {target_vocab}; speculative sampling "
          "needs one shared vocabulary: use a draft trained with the target's tokenizer.")


def _check_ngram(exp: Experiment, spec: str, target_vocab: int) -> None:
  for task in exp.tasks:
    _same_vocabulary(spec, load_ngram_stats(task).vocab_size, target_vocab, task)


def _build_ngram(target: LoadedTarget, spec: str, task: str) -> NgramDraft:
  stats = load_ngram_stats(task)
  return NgramDraft.from_counts(stats.unigram, stats.bigram_prev, stats.bigram_next,
                                stats.bigram_count, order=NGRAM_ORDER[spec])


def _check_draft_checkpoint(exp: Experiment, spec: str, target_vocab: int) -> None:
  _same_vocabulary(spec, check_checkpoint(exp, spec, f"drafts ({spec!r})"), target_vocab)


def _build_checkpoint_draft(target: LoadedTarget, spec: str, task: str) -> Draft:
  del task
  settings = target.settings
  model, params = load_model(settings.checkpoint_dir(spec), dtype=settings.dtype,
                             param_dtype=settings.param_dtype)
  # Sharded, and its caches constrained, by the draft rules; decoding as the target's.
  model = dataclasses.replace(model, axis_rules=target.placement.draft_rules,
                              options=target.scorer.decode_options)
  return make_draft(model, partitioning.shard_params(model, params, target.mesh))


NGRAM = DraftKind(name="unigram / bigram (the task's corpus statistics)",
                  matches=lambda spec: spec in NGRAM_ORDER, build=_build_ngram,
                  check=_check_ngram, per_task=True)
CHECKPOINT = DraftKind(name="a T5 draft's checkpoint directory (in Settings.models_dir)",
                       matches=lambda spec: True, build=_build_checkpoint_draft,
                       check=_check_draft_checkpoint)


def with_stand_ins(exp: Experiment, architectures: Mapping[str, T5Config]) -> Experiment:
  """`exp` on random-init stand-ins of the family's shapes if its target is missing.

  Args:
    exp: the run.
    architectures: each family member's `T5Config` (the command reads them from their
      training configs: `gin_flags.family_architectures`).
  """
  if os.path.isdir(exp.checkpoint_dir(exp.target)):
    return exp
  stand_ins_dir = os.path.join(layout.default_data_dir(), "random_models")
  logging.warning(
      "%s has no trained target yet: measuring RANDOM-INIT stand-ins of the family's shapes "
      "from %s instead. Timings are real, acceptance rates are meaningless.",
      exp.models_dir, stand_ins_dir)
  kind = KIND.draft_kind
  names = [exp.target] + [d for d in exp.drafts if kind(d) is CHECKPOINT]
  stand_ins.write_stand_ins(stand_ins_dir, names, architectures)
  # Its own results directory: stand-in rows must never stand for the family's.
  return dataclasses.replace(exp, models_dir=stand_ins_dir, name=f"{exp.name}_random_stand_ins")


KIND = TargetKind(name="t5", check=check, load=load, drafts=(NGRAM, PROMPT_LOOKUP, CHECKPOINT),
                  stand_ins=with_stand_ins, tree_proposer=draft_branches)
