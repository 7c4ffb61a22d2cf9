"""training.model_card: the one layout both drivers' exports write."""

from __future__ import annotations

from specdec_jax.training.model_card import ModelCard


def test_card_lays_out_title_intro_table_and_sections():
  card = ModelCard("`draft`", ["What it is.", "**Superseded.**"],
                   [("parameters", "1.00M"), ("steps", "10")],
                   ["Data: text.", "## Use\n\ncode"]).markdown()
  assert card == ("# `draft`\n\nWhat it is.\n\n**Superseded.**\n\n| | |\n|---|---|\n"
                  "| parameters | 1.00M |\n| steps | 10 |\n\nData: text.\n\n## Use\n\ncode\n")


def test_a_card_without_sections_ends_after_its_table():
  assert ModelCard("m", [], [("a", "b")]).markdown() == "# m\n\n| | |\n|---|---|\n| a | b |\n"
