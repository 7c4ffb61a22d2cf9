"""No silent garbage: bad arguments to the decoders and drafts are clear errors before any work.

Every case of issue 17, and the cases that were already good, is pinned here,
then a property test throws random malformed arguments at both decoders. Valid
calls reuse one set of shapes and settings, so each decoder compiles once.
"""

from __future__ import annotations

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specdec_jax import partitioning, validation
from specdec_jax.decoding.drafts import NgramDraft, PromptLookupDraft
from specdec_jax.models.t5 import (
    T5Draft,
    T5Model,
    get_config,
    speculative_sample,
    temperature_sample,
)

VOCAB, BATCH, INPUT_LEN, MAX_LEN, GAMMA = 97, 2, 5, 4, 2
INPUTS = np.array([[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]], np.int32)


@pytest.fixture(scope="module")
def models():
  """(target, its params, a draft): the target drafting for itself."""
  target, params = make_model("test-v1_1")
  return target, params, T5Draft(target, params)


def _baseline(models, **overrides):
  target, params, _ = models
  kwargs = dict(inputs=INPUTS, max_decode_len=MAX_LEN) | overrides
  return temperature_sample(target, kwargs.pop("params", params), kwargs.pop("inputs"), **kwargs)


def _speculative(models, **overrides):
  target, params, draft = models
  kwargs = dict(inputs=INPUTS, gamma=GAMMA, max_decode_len=MAX_LEN) | overrides
  return speculative_sample(target, kwargs.pop("params", params), kwargs.pop("draft", draft),
                            kwargs.pop("inputs"), **kwargs)


DECODERS = {"baseline": _baseline, "speculative": _speculative}


def _with_id(row: int, col: int, token: int, dtype=np.int32) -> np.ndarray:
  inputs = INPUTS.astype(dtype)
  inputs[row, col] = token
  return inputs


# Arguments both decoders take: (overrides, what the message must say).
COMMON_CASES = [
    # Token ids outside the vocabulary: named, with the id, where, and the likely cause.
    (dict(inputs=_with_id(0, 2, VOCAB)),
     r"inputs holds token id 97 at \[0, 2\].*the model has 97 tokens.*another vocabulary"),
    (dict(inputs=_with_id(1, 0, -3)), r"inputs holds token id -3 at \[1, 0\]"),
    (dict(inputs=_with_id(1, 4, 2**40, np.int64)), r"inputs holds token id 1099511627776"),
    # Float (or bool) token ids are not truncated.
    (dict(inputs=INPUTS.astype(np.float32)), r"inputs must hold integer token ids.*float32"),
    (dict(inputs=INPUTS + 0.5), r"inputs must hold integer token ids"),
    (dict(inputs=INPUTS > 3), r"inputs must hold integer token ids.*bool"),
    (dict(inputs=INPUTS[0]), r"inputs must be \[batch, input_len\]"),
    (dict(inputs=np.zeros((2, 0), np.int32)), r"input_len >= 1"),
    (dict(inputs=[[5, 6], [7]]), r"inputs must be a \[batch, input_len\] array"),
    # Non-integral settings are rejected, not truncated.
    (dict(top_k=2.5), r"top_k must be an int >= 0.*2\.5"),
    (dict(top_k=True), r"top_k must be an int"),
    (dict(top_k=-1), r"top_k"),
    (dict(max_decode_len=2.5), r"max_decode_len must be an int >= 1.*2\.5"),
    (dict(max_decode_len=np.float64(4.0)), r"max_decode_len must be an int"),
    (dict(max_decode_len="4"), r"max_decode_len must be an int"),
    (dict(max_decode_len=0), r"max_decode_len"),
    (dict(eos_id=1.0), r"eos_id must be an int"),
    (dict(eos_id=VOCAB), r"eos_id=97 is outside the vocabulary"),
    (dict(eos_id=-1), r"eos_id"),
    (dict(temperature=-0.5), r"temperature"),
    (dict(temperature=float("nan")), r"temperature"),
    (dict(temperature=float("inf")), r"temperature"),
    (dict(temperature=True), r"temperature"),
    (dict(temperature="1.0"), r"temperature"),
    (dict(temperature=jnp.float32(1.0)), r"temperature"),
    (dict(top_p=0.0), r"top_p"),
    (dict(top_p=1.5), r"top_p"),
    (dict(rng=3), r"rng must be one PRNG key.*jax\.random\.PRNGKey\(s\)"),
    (dict(rng=jax.random.split(jax.random.PRNGKey(0), 2)), r"rng must be one PRNG key"),
    (dict(rng=np.zeros(2, np.float32)), r"rng must be one PRNG key"),
]

SPECULATIVE_CASES = [
    (dict(gamma=True), r"gamma must be an int >= 1.*True"),
    (dict(gamma=2.5), r"gamma must be an int"),
    (dict(gamma="3"), r"gamma must be an int"),
    (dict(gamma=0), r"gamma"),
    (dict(draft_inputs=np.ones((3, INPUT_LEN), np.int32)),
     r"draft_inputs has 3 rows but inputs has 2"),
    (dict(draft_inputs=_with_id(1, 1, VOCAB + 4)), r"draft_inputs holds token id 101 at \[1, 1\]"),
    (dict(draft_inputs=INPUTS.astype(np.float64)), r"draft_inputs must hold integer token ids"),
    (dict(draft=PromptLookupDraft(50)), r"vocabulary \(50\) differs from the target's \(97\)"),
]


def _check_raises_before_work(call, match: str) -> None:
  """`call` raises ValueError matching `match` from the checks, with params never touched."""
  with pytest.raises(ValueError, match=match) as info:
    call()
  assert info.traceback[-1].path.name == "validation.py"


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize("overrides, match", COMMON_CASES)
def test_bad_arguments_are_named_before_any_work(models, decoder, overrides, match):
  _check_raises_before_work(lambda: DECODERS[decoder](models, params=None, **overrides), match)


@pytest.mark.parametrize("overrides, match", SPECULATIVE_CASES)
def test_bad_speculative_arguments_are_named_before_any_work(models, overrides, match):
  _check_raises_before_work(lambda: _speculative(models, params=None, **overrides), match)


def test_a_model_or_draft_of_the_wrong_kind_is_named(models):
  target, params, _ = models
  _check_raises_before_work(lambda: temperature_sample(params, params, INPUTS, max_decode_len=2),
                            r"model must be a model whose config is a T5Config.*got dict")
  _check_raises_before_work(lambda: _speculative(models, draft=target),
                            r"draft must be a specdec_jax\.decoding\.drafts\.Draft.*T5Model")
  bad_start = T5Model(get_config("test-v1_1", decoder_start_token_id=VOCAB))
  _check_raises_before_work(lambda: temperature_sample(bad_start, params, INPUTS,
                                                       max_decode_len=2),
                            r"decoder_start_token_id=97, outside its vocabulary")


@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_data_parallel_decoders_check_before_work(models, decoder):
  target, params, draft = models
  mesh = partitioning.make_mesh(1, 1)

  def call(gamma=GAMMA, **kwargs):
    if decoder == "baseline":
      return temperature_sample(target, None, mesh=mesh, **kwargs)
    return speculative_sample(target, None, draft, mesh=mesh, gamma=gamma, **kwargs)

  _check_raises_before_work(lambda: call(inputs=_with_id(0, 0, VOCAB), max_decode_len=2),
                            r"inputs holds token id 97")
  _check_raises_before_work(lambda: call(inputs=INPUTS, max_decode_len=2, top_k=2.5), "top_k")
  if decoder == "speculative":
    _check_raises_before_work(lambda: call(inputs=INPUTS, max_decode_len=2, gamma=True), "gamma")


@pytest.fixture(scope="module")
def reference(models):
  """The greedy output of each decoder on `INPUTS` with plain Python arguments."""
  return {name: np.asarray(decode(models).sequences) for name, decode in DECODERS.items()}


def test_integer_like_arguments_are_accepted(models, reference):
  """NumPy integers and reals, int64 ids and nested lists: the same program, the same tokens."""
  like = dict(inputs=INPUTS.astype(np.int64), max_decode_len=np.int64(MAX_LEN),
              top_k=np.int32(0), eos_id=np.int64(1), temperature=np.float32(0.0),
              top_p=np.float64(1.0))
  out = _baseline(models, **like)
  np.testing.assert_array_equal(out.sequences, reference["baseline"])
  out = _speculative(models, gamma=np.int64(GAMMA), draft_inputs=INPUTS.tolist(), **like)
  np.testing.assert_array_equal(out.sequences, reference["speculative"])


def test_traced_ids_outside_the_vocabulary_fail_at_run_time():
  """Under a trace (as on each shard of the data-parallel decoders) the program checks the ids
  itself: an error, never output."""
  embed = jax.jit(lambda x: jnp.sum(validation.check_token_ids("inputs", x, VOCAB), axis=1))
  np.testing.assert_array_equal(embed(INPUTS), INPUTS.sum(1))
  with pytest.raises((ValueError, jax.errors.JaxRuntimeError),
                     match=r"inputs holds token id 102 at \[1, 3\]"):
    jax.block_until_ready(embed(_with_id(1, 3, VOCAB + 5)))
  with pytest.raises(ValueError, match="integer token ids"):  # Shapes and dtypes: at trace time.
    embed(INPUTS.astype(np.float32))


# --- Drafts' constructors ---------------------------------------------------------------


def _counts(vocab: int = 5) -> dict:
  return dict(unigram_counts=np.arange(vocab, dtype=np.int64),
              bigram_prev=np.array([1, 1, 2], np.int32), bigram_next=np.array([2, 3, 4], np.int32),
              bigram_count=np.array([4, 1, 2], np.int64))


@pytest.mark.parametrize("changes, match", [
    (dict(order=3), r"order must be 1 \(unigram\) or 2 \(bigram\), got 3"),
    (dict(order=True), r"order must be an int"),
    (dict(order=2.0), r"order must be an int"),
    (dict(top_next=0), r"top_next must be an int >= 1"),
    (dict(unigram_counts=np.ones((5, 1))), r"unigram_counts must be a 1-D array"),
    (dict(unigram_counts=np.array([1.0, np.nan, 1.0])), r"unigram_counts must hold"),
    (dict(unigram_counts=np.array([1, -1, 1, 1, 1])), r"unigram_counts must hold"),
    (dict(bigram_prev=np.array([1.0, 1.0, 2.0])), r"bigram_prev must be a 1-D array of integer"),
    (dict(bigram_next=np.array([2, 3, 5])), r"bigram_next holds token id 5, outside.*\[0, 5\)"),
    (dict(bigram_count=np.array([4, 1])), r"must have one length"),
    (dict(bigram_count=np.array([4, -1, 2])), r"bigram_count must hold finite counts >= 0"),
    (dict(bigram_count=np.array([4, 1, 0])), r"bigram_count is 0 for every bigram after token 2"),
])
def test_ngram_draft_rejects_malformed_counts(changes, match):
  kwargs = _counts() | dict(order=2) | changes
  with pytest.raises(ValueError, match=match):
    NgramDraft.from_counts(**kwargs)


def test_draft_constructors_check_and_normalise():
  draft = NgramDraft.from_counts(**_counts(), order=np.int64(2), top_next=np.int32(2))
  assert type(draft.order) is int and draft.vocab_size == 5
  with pytest.raises(ValueError, match="order must be"):
    NgramDraft(3, draft.unigram, draft.next_ids, draft.next_probs, draft.weight)
  lookup = PromptLookupDraft(np.int64(VOCAB), max_ngram=np.int32(2))
  assert (type(lookup.vocab), type(lookup.max_ngram)) == (int, int)
  assert lookup == PromptLookupDraft(VOCAB, 2)  # Equal statics: one compiled program.
  for kwargs, match in [(dict(vocab=97.0), "vocab must be an int"),
                        (dict(vocab=0), "vocab must be an int >= 1"),
                        (dict(vocab=VOCAB, max_ngram=True), "max_ngram must be an int")]:
    with pytest.raises(ValueError, match=match):
      PromptLookupDraft(**kwargs)
  with pytest.raises(ValueError, match=r"T5Draft's model must be a model whose config is a "
                                       r"T5Config \(e\.g\. specdec_jax\.models\.t5\.T5Model"):
    T5Draft("draft_small", {})
  with pytest.raises(ValueError, match=r"eos_token_id=200, outside its vocabulary \[0, 97\)"):
    T5Draft(T5Model(get_config("test-v1_0", eos_token_id=200)), {})


# --- Random malformed arguments -----------------------------------------------------------


def _int_like(value: int) -> st.SearchStrategy:
  """`value` as each integer type a caller may pass: all valid, all one compiled program."""
  return st.sampled_from([value, np.int32(value), np.int64(value), np.uint8(value)])


def _not_ints(none: bool = True) -> st.SearchStrategy:
  """Values no integer argument accepts (floats such as 4.0 included: never truncated)."""
  bad = [st.floats(), st.booleans(), st.text(max_size=3),
         st.sampled_from([np.float32(2.5), np.float64(4.0), np.bool_(True), np.array(2),
                          np.array([2]), jnp.int32(2)])]
  return st.one_of(*bad, st.none()) if none else st.one_of(*bad)


def _not_reals() -> st.SearchStrategy:
  return st.one_of(st.booleans(), st.text(max_size=3), st.none(), st.just(float("nan")),
                   st.sampled_from([float("inf"), -float("inf"), np.array(1.0), jnp.float32(0)]))


def _token_ids() -> st.SearchStrategy:
  """(ids, valid): `[BATCH, INPUT_LEN]` integer arrays, ids near the vocabulary's ends (valid
  iff all inside), and malformed arrays (float, bool, other ranks, empty, ragged)."""
  signed = hnp.arrays(st.sampled_from([np.int32, np.int64]), (BATCH, INPUT_LEN),
                      elements=st.integers(-3, VOCAB + 3))
  unsigned = hnp.arrays(np.uint8, (BATCH, INPUT_LEN), elements=st.integers(0, 255))
  ints = (signed | unsigned).map(lambda a: (a, bool(np.all((a >= 0) & (a < VOCAB)))))
  malformed = st.one_of(
      hnp.arrays(st.sampled_from([np.float32, np.float64, np.bool_]), (BATCH, INPUT_LEN)),
      st.sampled_from([INPUTS[0], INPUTS[None], INPUTS[:, :0], [[5, 6], [7]], "5 6 7"]))
  return ints | malformed.map(lambda a: (a, False))


def _valid(strategy: st.SearchStrategy) -> st.SearchStrategy:
  return strategy.map(lambda v: (v, True))


def _invalid(strategy: st.SearchStrategy) -> st.SearchStrategy:
  return strategy.map(lambda v: (v, False))


# name -> strategy of (value, valid). Valid values keep the settings of `reference`.
ARGUMENTS = {
    "inputs": _token_ids(),
    "max_decode_len": _valid(_int_like(MAX_LEN)) | _invalid(
        _not_ints() | st.integers(max_value=0)),
    "top_k": _valid(_int_like(0)) | _invalid(_not_ints() | st.integers(max_value=-1)),
    "eos_id": _valid(_int_like(1) | st.none()) | _invalid(
        _not_ints(none=False) | st.integers(max_value=-1) | st.integers(min_value=VOCAB)),
    "temperature": _valid(st.sampled_from([0, 0.0, -0.0, np.float32(0), np.float64(0)]))
    | _invalid(_not_reals() | st.floats(max_value=-1e-300)),
    "top_p": _valid(st.sampled_from([1, 1.0, np.float32(1), np.float64(1)])) | _invalid(
        _not_reals() | st.floats(max_value=0) | st.floats(min_value=1, exclude_min=True)),
    "rng": _valid(st.none() | st.integers(0, 2**31 - 1).map(jax.random.PRNGKey)) | _invalid(
        st.integers() | st.floats() | st.sampled_from([
            jax.random.split(jax.random.PRNGKey(0), 2), np.zeros(2, np.float32),
            np.zeros(3, np.uint32), np.zeros((), np.uint32), "0"])),
}
SPECULATIVE_ARGUMENTS = {
    "gamma": _valid(_int_like(GAMMA)) | _invalid(_not_ints() | st.integers(max_value=0)),
    "draft_inputs": _valid(st.none()) | _token_ids() | _invalid(
        hnp.arrays(np.int32, (BATCH + 1, INPUT_LEN), elements=st.integers(0, VOCAB - 1))),
}


@st.composite
def _calls(draw) -> tuple[str, str, object, bool]:
  decoder = draw(st.sampled_from(sorted(DECODERS)))
  arguments = ARGUMENTS | (SPECULATIVE_ARGUMENTS if decoder == "speculative" else {})
  name = draw(st.sampled_from(sorted(arguments)))
  value, valid = draw(arguments[name])
  return decoder, name, value, valid


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
@hypothesis.given(call=_calls())
def test_malformed_arguments_raise_or_decode_well(models, reference, call):
  """Each call either raises ValueError naming the argument or returns well-formed output.

  Valid calls are exactly those the strategies mark valid (no silent coercion);
  those with the reference's inputs return its tokens exactly.
  """
  decoder, name, value, valid = call
  hypothesis.event(f"{decoder} {name} {'valid' if valid else 'invalid'}")
  try:
    out = DECODERS[decoder](models, **{name: value})
  except ValueError as e:
    assert not valid, f"{decoder}: valid {name}={value!r} raised {e}"
    assert name in str(e), f"{decoder}: the message does not name {name}: {e}"
    return
  assert valid, f"{decoder}: {name}={value!r} was accepted"
  sequences, lengths = np.asarray(out.sequences), np.asarray(out.lengths)
  assert sequences.shape == (BATCH, MAX_LEN) and sequences.dtype == np.int32
  assert np.all((sequences >= 0) & (sequences < VOCAB))
  assert np.all((lengths >= 1) & (lengths <= MAX_LEN))
  assert np.all(sequences[np.arange(MAX_LEN)[None] >= lengths[:, None]] == 0)
  if decoder == "speculative":
    assert np.all(np.isfinite(np.asarray(out.stats.beta_sum)))
  if name != "inputs":  # Greedy: any rng, draft inputs or spelling of a setting, same tokens.
    np.testing.assert_array_equal(sequences, reference[decoder])
