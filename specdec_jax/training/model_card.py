"""A trained model's README.md: one layout for every family's export.

    # <title>

    <intro paragraphs>

    | | |
    |---|---|
    | <fact> | <value> |

    <sections>

Both drivers' exports write it: the T5 family's (`experiments.export_family`) and
the decoder-only drafts' (`training.train_student`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ModelCard:
  """What a model card says, in the order it says it.

  Attributes:
    title: the heading, without the leading "# ".
    intro: paragraphs before the table: what the model is, and any warning.
    facts: the table's rows, (name, value) pairs in Markdown.
    sections: Markdown blocks after the table (a paragraph, or a "## heading" with its
      lines), separated by blank lines.
  """

  title: str
  intro: Sequence[str]
  facts: Sequence[tuple[str, str]]
  sections: Sequence[str] = ()

  def markdown(self) -> str:
    """The card's text, ending in a newline."""
    lines = [f"# {self.title}", ""]
    for paragraph in self.intro:
      lines += [paragraph, ""]
    lines += ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in self.facts), ""]
    for section in self.sections:
      lines += [section, ""]
    return "\n".join(lines)
