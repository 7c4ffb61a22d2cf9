"""The decoder-only draft that reads its target's embedding (`models.llama.student`).

Its teacher-forced logits (training) equal its generation path's (prefill, chunks) on
the shortlist and are -inf elsewhere; as a draft it keeps speculative sampling exact:
greedy tokens equal the baseline's, the output distribution equals the enumerated
one, and the wrong acceptance rule fails the same test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_llama import EOS, PROMPT, PROMPTS, SAMPLES, _exact_distribution, _random_model
from test_speculative import LENGTH, VOCAB, _chi_square_p_value, accept_all

from specdec_jax import checksums
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.llama import LlamaScorer, pad_prompts, student_io
from specdec_jax.models.llama.student import (
    Student,
    StudentConfig,
    StudentDraft,
    student_config,
)


def _student(target_config, head_tokens, seed: int = 1, scale: float = 1.0,
             tied_io: bool = False) -> tuple:
  """A random student of `target_config`'s vocabulary scoring `head_tokens` (with
  `tied_io`, at the target's width on its own embedding and head rows)."""
  config = student_config(target_config, d_model=target_config.d_model if tied_io else 16,
                          num_layers=2, head_size=len(head_tokens), head_dim=8, kv_groups=2,
                          tied_io=tied_io)
  student = Student(config)
  params = student.init_params(jax.random.PRNGKey(seed))
  params = jax.tree.map(lambda x: x * scale, params)
  return student, params


@pytest.mark.parametrize("tied_io", [False, True])
def test_teacher_forcing_equals_generation_on_the_shortlist(tied_io):
  model, params = _random_model()
  embedding = params["token_embedder"]["embedding"]
  head = jnp.asarray([1, 5, 9, 40, 41, 96], jnp.int32)
  student, sparams = _student(model.config, head, tied_io=tied_io)
  assert ("input_projection" in sparams) is not tied_io
  prompts = jnp.asarray(pad_prompts(PROMPTS))                         # [3, 5]
  lengths = jnp.asarray([len(p) for p in PROMPTS], jnp.int32)
  outputs = np.random.RandomState(0).randint(1, 97, size=(3, 6)).astype(np.int32)
  decoder_inputs = jnp.asarray(np.pad(outputs[:, :-1], ((0, 0), (1, 0))))
  forced = np.asarray(student.logits(sparams, embedding, head, prompts, lengths,
                                     decoder_inputs))               # [3, 6, head]
  scorer = LlamaScorer(student.llama, student.prepare(sparams, embedding, head))
  state = scorer.init_state(scorer.encode(prompts), 8)
  first, state = scorer.score(state, decoder_inputs[:, :2])
  rest, _ = scorer.score(state, decoder_inputs[:, 2:])
  generated = np.concatenate([first, rest], axis=1)                   # [3, 6, vocab]
  np.testing.assert_allclose(generated[..., np.asarray(head)], forced, atol=1e-4, rtol=0)
  outside = np.setdiff1d(np.arange(97), np.asarray(head))
  assert np.all(np.isneginf(generated[..., outside]))


def test_greedy_speculative_equals_the_baseline():
  model, params = _random_model()
  embedding = params["token_embedder"]["embedding"]
  target = LlamaScorer(model, model.prepare(params))
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  base = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=12,
                         warp=Warp(), eos_id=96)
  # The shortlist holds some of the target's tokens: others are reached by rejection.
  head = jnp.asarray(np.unique(np.asarray(base.sequences))[::2], jnp.int32)
  student, sparams = _student(model.config, head, scale=3.0)
  draft = StudentDraft(student.llama, student.prepare(sparams, embedding, head))
  for gamma in (1, 3, 5):
    out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0),
                                         gamma=gamma, max_decode_len=12, warp=Warp(), eos_id=96,
                                         draft_inputs=prompts)
    np.testing.assert_array_equal(out.sequences, base.sequences, err_msg=f"gamma={gamma}")
    np.testing.assert_array_equal(out.lengths, base.lengths)


@pytest.fixture(scope="module")
def tiny_student():
  """The tiny target of test_llama's distribution tests and a student of 3 of its 5 tokens."""
  model, params = _random_model(seed=3, embedding_scale=0.2, vocab_size=VOCAB)
  embedding = params["token_embedder"]["embedding"]
  head = jnp.asarray([0, 1, 3], jnp.int32)
  student, sparams = _student(model.config, head, seed=2, scale=2.0)
  draft = StudentDraft(student.llama, student.prepare(sparams, embedding, head))
  prompts = jnp.asarray(np.tile(PROMPT, (SAMPLES, 1)), jnp.int32)
  return model, params, LlamaScorer(model, model.prepare(params)), draft, prompts


@pytest.mark.parametrize("warp", [Warp(1.0), Warp(0.8, top_k=4, top_p=0.9)])
def test_output_distribution_is_the_targets(tiny_student, warp):
  model, params, target, draft, prompts = tiny_student
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=warp, eos_id=EOS,
                                       draft_inputs=prompts)
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both accept and reject paths are exercised.
  assert _chi_square_p_value(out.sequences, out.lengths,
                             _exact_distribution(model, params, warp)) > 1e-3


def test_accept_everything_fails_the_same_test(tiny_student):
  """Negative control: with this draft, a wrong acceptance rule is detected."""
  model, params, target, draft, prompts = tiny_student
  out = speculative.speculative_decode(target, draft, prompts, jax.random.PRNGKey(0), gamma=2,
                                       max_decode_len=LENGTH, warp=Warp(1.0), eos_id=EOS,
                                       draft_inputs=prompts, verify=accept_all)
  assert _chi_square_p_value(out.sequences, out.lengths,
                             _exact_distribution(model, params, Warp(1.0))) < 1e-6


def test_config_round_trips_and_bad_shapes_are_named():
  model, _ = _random_model()
  config = student_config(model.config, d_model=16, num_layers=1, head_size=8, head_dim=8)
  assert StudentConfig.from_dict(config.to_dict()) == config
  assert config.blocks.vocab_size == 97 and config.embed_dim == model.config.d_model
  with pytest.raises(ValueError, match="multiple of head_dim"):
    student_config(model.config, d_model=20, num_layers=1, head_size=8, head_dim=8)
  with pytest.raises(ValueError, match="head_size=200 exceeds"):
    student_config(model.config, d_model=16, num_layers=1, head_size=200, head_dim=8)
  tied = student_config(model.config, d_model=model.config.d_model, num_layers=1, head_size=8,
                        head_dim=8, tied_io=True)
  assert StudentConfig.from_dict(tied.to_dict()) == tied and tied.tied_io
  with pytest.raises(ValueError, match="tied_io needs the blocks at the target's width"):
    student_config(model.config, d_model=16, num_layers=1, head_size=8, head_dim=8,
                   tied_io=True)


@pytest.mark.parametrize("tied_io", [False, True])
def test_the_transformers_export_scores_as_the_draft_does(tied_io):
  """The peer's copy of the draft (`student_hf`): the same logits on the shortlist, -inf
  elsewhere, teacher-forced over a prompt and an output."""
  import torch  # noqa: PLC0415  (the test extra; the draft's own tests need none)

  from specdec_jax.models.llama.student_hf import to_transformers  # noqa: PLC0415

  model, params = _random_model()
  embedding = np.asarray(params["token_embedder"]["embedding"])
  head = np.asarray([1, 5, 9, 40, 41, 96], np.int32)
  student, sparams = _student(model.config, jnp.asarray(head), tied_io=tied_io)
  sparams = jax.tree.map(np.asarray, sparams)
  prompt, outputs = [5, 6, 7, 8, 9], [11, 12, 13, 14]
  forced = np.asarray(student.logits(
      sparams, embedding, jnp.asarray(head), jnp.asarray([prompt], jnp.int32),
      jnp.asarray([len(prompt)], jnp.int32), jnp.asarray([[0] + outputs[:-1]], jnp.int32)))[0]
  hf = to_transformers(student.config, sparams, embedding, head)
  with torch.inference_mode():
    logits = hf(torch.tensor([prompt + outputs[:-1]])).logits.numpy()[0, len(prompt) - 1:]
  np.testing.assert_allclose(logits[:, head], forced, atol=1e-4, rtol=0)
  assert np.all(np.isneginf(np.delete(logits, head, axis=1)))


def test_the_transformers_export_refuses_a_feature_reading_draft():
  """transformers' assistant sees only tokens: a draft that reads the target's features
  cannot be exported as one, and says so rather than dropping its feature weights."""
  from specdec_jax.models.llama.student_hf import to_transformers  # noqa: PLC0415

  model, params = _random_model()
  config = student_config(model.config, d_model=16, num_layers=1, head_size=8, head_dim=8,
                          reads_features=True)
  assert config.feature_size == model.config.d_model
  with pytest.raises(ValueError, match="reads its target's features"):
    to_transformers(config, {}, np.asarray(params["token_embedder"]["embedding"]),
                    np.arange(8, dtype=np.int32))


def test_load_draft_checks_the_target_file_and_builds_it_on_the_targets_weights(tmp_path):
  model, params = _random_model()
  target = LlamaScorer(model, model.prepare(params))
  head = np.asarray([1, 5, 9, 40, 41, 96], np.int32)
  student, sparams = _student(model.config, head)
  target_file, other_file = tmp_path / "tiny.gguf", tmp_path / "other.gguf"
  target_file.write_bytes(b"the target's weights")
  other_file.write_bytes(b"another model's weights")
  sha = checksums.sha256_files([str(target_file)])
  assert sha != checksums.sha256_files([str(other_file)])
  directory = str(tmp_path / "draft")
  student_io.save_student(directory, student.config, sparams, head, student_io.TargetId(
      sha, model.config.vocab_size, model.config.d_model, "tiny.gguf"))
  draft = student_io.load_draft(directory, target, str(target_file))
  assert isinstance(draft, StudentDraft) and draft.model.options == model.options
  # It reads the target's embedding through its own (float16-stored) projection.
  saved = student_io.load_student(directory)
  want = student.prepare(saved.params, target.weights.embedding, head)
  np.testing.assert_array_equal(draft.weights.embedding, want.embedding)
  np.testing.assert_array_equal(draft.weights.head_tokens, head)
  with pytest.raises(ValueError, match=r"trained for tiny.gguf .* but the target is other.gguf"):
    student_io.load_draft(directory, target, str(other_file))
  with pytest.raises(ValueError, match=r"weights must be prepared"):
    student_io.load_draft(directory, LlamaScorer(model, params), str(target_file))
