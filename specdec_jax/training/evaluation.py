"""Validation loss and test-set quality: BLEU (En-De, sacrebleu) and ROUGE-L (man-page
summaries, rouge-score), from greedy decoding with the baseline decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import sacrebleu
from rouge_score import rouge_scorer

from specdec_jax.models.t5 import T5Model, temperature_sample


def validation_loss(eval_step: Callable[[dict, dict], dict], params: dict,
                    batches: Iterable[dict]) -> tuple[float, int]:
  """Token-weighted mean cross-entropy over `batches` and the number of tokens."""
  loss_sum, tokens = 0.0, 0.0
  for batch in batches:
    out = eval_step(params, batch)
    loss_sum += float(out["loss_sum"])
    tokens += float(out["tokens"])
  if tokens == 0:
    raise ValueError("validation_loss got no target tokens; are the batches empty?")
  return loss_sum / tokens, int(tokens)


def encode_inputs(texts: Sequence[str], processor, length: int) -> np.ndarray:
  """Tokenises `texts` (SentencePiece `processor`) with EOS, cut/padded to `[n, length]`."""
  eos = processor.eos_id()
  out = np.zeros((len(texts), length), np.int32)
  for i, ids in enumerate(processor.encode(list(texts))):
    ids = ids[:length - 1] + [eos]
    out[i, :len(ids)] = ids
  return out


def greedy_decode_texts(model: T5Model, params: dict, texts: Sequence[str], processor, *,
                        inputs_length: int, max_decode_len: int, batch_size: int = 64
                        ) -> list[str]:
  """Greedy outputs for `texts`, detokenised; batches are padded to one shape (one compile)."""
  inputs = encode_inputs(texts, processor, inputs_length)
  prepared = model.prepare(params)  # Once, not once per batch.
  outputs: list[str] = []
  for start in range(0, len(texts), batch_size):
    chunk = inputs[start:start + batch_size]
    rows = len(chunk)
    chunk = np.pad(chunk, ((0, batch_size - rows), (0, 0)))
    out = temperature_sample(model, prepared, chunk, max_decode_len=max_decode_len)
    seqs, lengths = np.asarray(out.sequences), np.asarray(out.lengths)
    for i in range(rows):
      ids = [int(t) for t in seqs[i, :lengths[i]] if t != processor.eos_id()]
      outputs.append(processor.decode(ids))
  return outputs


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """sacrebleu corpus BLEU (13a tokenisation), 0-100."""
  return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def mean_rouge_l(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Mean ROUGE-L F1 (rouge-score, with stemming), 0-100."""
  scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
  scores = [scorer.score(ref, hyp)["rougeL"].fmeasure
            for hyp, ref in zip(hypotheses, references, strict=True)]
  return 100.0 * float(np.mean(scores))
