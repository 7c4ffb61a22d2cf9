"""Tests of page-disjoint deterministic splits, dedup, the overlap guard and JSONL io."""

import pytest

from specdec_jax.data import corpora

_SPEC = corpora.SplitSpec(validation_percent=20, test_percent=20)


def _examples(n_pages: int = 60) -> list[corpora.Example]:
  return [corpora.Example(id=f"p{p}#{i}", inputs=f"text {p} {i}", targets=f"Text {p} {i}",
                          page=f"p{p}") for p in range(n_pages) for i in range(3)]


def test_make_splits_puts_each_page_in_one_split_and_is_order_independent():
  examples = _examples()
  splits = corpora.make_splits(examples, _SPEC)
  assert all(splits[s] for s in ("train", "validation", "test"))
  assert sum(len(v) for v in splits.values()) == len(examples)
  pages = {s: {ex.page for ex in v} for s, v in splits.items()}
  assert not (pages["train"] & pages["validation"] or pages["train"] & pages["test"]
              or pages["validation"] & pages["test"])
  assert corpora.make_splits(list(reversed(examples)), _SPEC) == splits


def test_make_splits_keeps_first_of_duplicate_inputs_across_pages():
  dup = [corpora.Example("a#0", "same", "gleich", "a"), corpora.Example("b#0", "same", "x", "b")]
  splits = corpora.make_splits(dup, _SPEC)
  assert [ex.id for v in splits.values() for ex in v] == ["a#0"]


def test_check_disjoint_refuses_shared_page():
  splits = {"train": [corpora.Example("1", "a", "b", "pg")],
            "validation": [], "test": [corpora.Example("2", "c", "d", "pg")]}
  with pytest.raises(ValueError, match="page='pg' is in both 'test' and 'train'"):
    corpora.check_disjoint(splits)


def test_check_disjoint_refuses_shared_inputs():
  splits = {"train": [corpora.Example("1", "a", "b", "p1")],
            "validation": [corpora.Example("2", "a", "d", "p2")], "test": []}
  with pytest.raises(ValueError, match="inputs='a'"):
    corpora.check_disjoint(splits)


def test_jsonl_round_trip_is_byte_identical(tmp_path):
  examples = [corpora.Example("x#1", "Größe ändern", "Resize \"quoted\"\n", "x")]
  first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  assert corpora.write_jsonl(str(first), examples) == 1
  corpora.write_jsonl(str(second), corpora.read_jsonl(str(first)))
  assert first.read_bytes() == second.read_bytes()
  assert '"Größe ändern"' in first.read_text(encoding="utf-8")
  assert corpora.sha256_file(str(first)) == corpora.sha256_file(str(second))


def test_read_text_pairs_adds_the_task_prefix(tmp_path):
  path = tmp_path / "corpora" / "mansum" / "test.jsonl"
  corpora.write_jsonl(str(path), [corpora.Example("m", "long text", "short", "m")])
  assert corpora.read_text_pairs("mansum", "test", data_dir=str(tmp_path)) == [
      ("summarize: long text", "short")]
