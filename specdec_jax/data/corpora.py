"""Examples, deterministic page-disjoint splits, and their JSONL files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable

from specdec_jax import atomic_io
from specdec_jax.data import layout


@dataclasses.dataclass(frozen=True)
class Example:
  """One row of a corpus; `inputs` carries no task prefix."""
  id: str
  inputs: str
  targets: str
  page: str


@dataclasses.dataclass(frozen=True)
class SplitSpec:
  """Share of pages per held-out split, in percent (the rest is train)."""
  validation_percent: int
  test_percent: int

  def split_of(self, page: str) -> str:
    """The split of every example of `page`: a fixed function of the page name."""
    bucket = int.from_bytes(hashlib.sha256(page.encode("utf-8")).digest()[:8], "big") % 100
    if bucket < self.test_percent:
      return "test"
    if bucket < self.test_percent + self.validation_percent:
      return "validation"
    return "train"


def make_splits(examples: Iterable[Example], spec: SplitSpec) -> dict[str, list[Example]]:
  """Deduplicates `examples` and assigns each page to one split.

  Examples are ordered by (page, id); of several with the same `inputs` only the first is
  kept, so no source text is in two splits and no pair is repeated.

  Returns:
    {split: examples in (page, id) order} for every split in `layout.SPLITS`.

  Raises:
    ValueError: if the result is not disjoint (see `check_disjoint`).
  """
  splits: dict[str, list[Example]] = {s: [] for s in layout.SPLITS}
  seen: set[str] = set()
  for ex in sorted(examples, key=lambda e: (e.page, e.id)):
    if ex.inputs in seen:
      continue
    seen.add(ex.inputs)
    splits[spec.split_of(ex.page)].append(ex)
  check_disjoint(splits)
  return splits


def check_disjoint(splits: dict[str, list[Example]]) -> None:
  """Refuses splits that share a page, an `inputs` text or an id.

  Raises:
    ValueError: naming the first shared page/text/id and the two splits.
  """
  for field in ("page", "inputs", "id"):
    owner: dict[str, str] = {}
    for split in sorted(splits):
      for ex in splits[split]:
        value = getattr(ex, field)
        other = owner.setdefault(value, split)
        if other != split:
          raise ValueError(
              f"splits overlap: {field}={value[:80]!r} is in both '{other}' and '{split}'; "
              "assign splits by page (corpora.make_splits) so that each page is in one split.")


def write_jsonl(path: str, examples: Iterable[Example]) -> int:
  """Writes one JSON object per line (keys sorted, UTF-8); returns the row count."""
  lines = [json.dumps(dataclasses.asdict(ex), ensure_ascii=False, sort_keys=True)
           for ex in examples]
  atomic_io.atomic_write_text(path, "".join(line + "\n" for line in lines))
  return len(lines)


def read_jsonl(path: str) -> list[Example]:
  """Reads a file written by `write_jsonl`."""
  with open(path, encoding="utf-8") as f:
    return [Example(**json.loads(line)) for line in f if line.strip()]


def sha256_file(path: str) -> str:
  """Hex sha256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def read_text_pairs(corpus: str, split: str, *, data_dir: str | None = None,
                    max_examples: int | None = None) -> list[tuple[str, str]]:
  """(inputs with the task prefix, reference targets) of a split, in file order.

  Args:
    corpus: "ende" or "mansum".
    split: "train", "validation" or "test".
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    max_examples: keep only the first this many; None keeps all.
  """
  path = layout.corpus_file(data_dir or layout.default_data_dir(), corpus, split)
  prefix = layout.CORPORA[corpus].prefix
  return [(prefix + ex.inputs, ex.targets) for ex in read_jsonl(path)[:max_examples]]
