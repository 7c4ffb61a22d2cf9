"""The Colab notebook runs end to end in local (CPU) mode, on a tiny gamma sweep."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks",
                        "speculative_decoding_colab.ipynb")


MODELS = os.path.join(os.path.dirname(NOTEBOOK), "..", "assets", "models")
# One draft of each format (HF T5, shared-encoder) when the family is shipped.
SHIPPED_DRAFTS = ("draft_small", "draft_shared_enc_long")


def test_notebook_runs_in_local_mode(monkeypatch):
  # The parameter cell reads these (papermill-style injection); "hub" is never tested.
  shipped = os.path.isdir(os.path.join(MODELS, "target"))
  monkeypatch.setenv("SPECDEC_NOTEBOOK_MODE", "local")
  monkeypatch.setenv("SPECDEC_NOTEBOOK_DRAFTS", ",".join(SHIPPED_DRAFTS) if shipped else "")
  monkeypatch.setenv("SPECDEC_NOTEBOOK_GAMMAS", "1,2")
  monkeypatch.setenv("SPECDEC_NOTEBOOK_MAX_DECODE_LEN", "8")
  monkeypatch.setenv("SPECDEC_NOTEBOOK_NUM_PROMPTS", "2")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  NotebookClient(nb, timeout=300, startup_timeout=300, kernel_name="python3",
                 resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()
  text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []))
  assert "MODE=local" in text
  if shipped:
    assert all(f"{name} gamma=2" in text for name in SHIPPED_DRAFTS)
  else:
    assert "RANDOM-INIT" in text
  assert "gamma=1" in text and "gamma=2" in text and "predicted" in text
  assert any(out.get("output_type") == "display_data" for out in nb.cells[-2].outputs)
