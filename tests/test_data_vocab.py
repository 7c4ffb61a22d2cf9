"""Tests of the committed SentencePiece vocabulary through seqio."""

import pytest

from specdec_jax.data import vocab


@pytest.fixture(scope="module")
def vocabulary():
  return vocab.get_vocabulary()


@pytest.mark.parametrize("text", [
    "Choose Tools - Options - LibreOffice Calc - General.",
    "Wählen Sie Extras – Optionen, um die Größe der Übersicht zu ändern.",
    "print shared object dependencies",
])
def test_round_trip(vocabulary, text):
  ids = vocabulary.encode(text)
  assert 2 not in ids  # No unknown pieces: umlauts and ß are covered.
  assert vocabulary.decode(ids) == text


def test_t5_special_ids(vocabulary):
  assert vocabulary.vocab_size == vocab.VOCAB_SIZE == 8192
  assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
  processor = vocab.load_processor(vocab.default_vocab_path())
  assert processor.bos_id() == -1
  assert [processor.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]


def test_missing_model_names_the_parameter(tmp_path):
  with pytest.raises(FileNotFoundError, match="path="):
    vocab.get_vocabulary(str(tmp_path / "nope.model"))
