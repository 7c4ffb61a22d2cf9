"""The Colab notebook runs end to end in local (CPU) mode, on a tiny gamma sweep."""

from __future__ import annotations

import os

import nbformat
from nbclient import NotebookClient

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks",
                        "speculative_decoding_colab.ipynb")


def test_notebook_runs_in_local_mode(monkeypatch):
  # The parameter cell reads these (papermill-style injection); "hub" is never tested.
  monkeypatch.setenv("SPECDEC_NOTEBOOK_MODE", "local")
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
  if not os.path.isdir(os.path.join(os.path.dirname(NOTEBOOK), "..", "assets", "models",
                                    "target")):
    assert "RANDOM-INIT" in text
  assert "gamma=1" in text and "gamma=2" in text and "predicted" in text
  assert any(out.get("output_type") == "display_data" for out in nb.cells[-2].outputs)
