"""The regime map's records: the predictions it writes.

predictions.json holds a `Prediction` per pair and alpha, and a `FamilyError` per measured
point of our family (`regime_predictions` makes them, `regime_figure` draws them). Times are
seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
  """The whole cost model's speedup for one pair at one alpha (`regime_predictions.predict`).

  Attributes:
    draft: the draft's name.
    target: the target's name.
    source: where alpha comes from: "paper" or "ours".
    task: the task alpha was measured on.
    temperature: the sampling temperature.
    alpha: the acceptance rate.
    tokens: output tokens per sequence the encoders are spread over.
    target_family: the target's `ModelRow.family`.
    target_decoder_bytes: the target's `ModelRow.decoder_bytes`.
    t_step_s: the target's T_step.
    c: T_draft / T_step.
    gamma: the best gamma.
    speedup: the predicted speedup at it, encoders included.
    speedup_by_gamma: {gamma: the predicted speedup} for gamma = 1..max_gamma.
    speedup_steps_only: the model calls alone at the best gamma.
    speedup_thm38: Theorem 3.8 at the best gamma.
    verify_ratio: T_verify(gamma + 1) / T_step, fitted non-decreasing.
    encoders_s: both encoders' seconds per sequence.
    loop_work_from: "own", or the reference pair's draft whose loop work priced it.
    reason: `gamma_choice.GammaChoice.reason`.
  """

  draft: str
  target: str
  source: str
  task: str
  temperature: float
  alpha: float
  tokens: float
  target_family: str
  target_decoder_bytes: int
  t_step_s: float
  c: float
  gamma: int
  speedup: float
  speedup_by_gamma: dict[int, float]
  speedup_steps_only: float
  speedup_thm38: float
  verify_ratio: float
  encoders_s: float
  loop_work_from: str
  reason: str

  def to_json(self) -> dict[str, Any]:
    """The prediction as predictions.json holds it."""
    record = dataclasses.asdict(self)
    record["speedup_by_gamma"] = {str(g): s for g, s in self.speedup_by_gamma.items()}
    return record


@dataclasses.dataclass(frozen=True, kw_only=True)
class FamilyError:
  """The cost model against one measured point of our family (`regime_predictions`).

  Attributes:
    source: the results file of the point.
    task: its task.
    draft: its draft.
    target: its target.
    temperature: its sampling temperature.
    gamma: its gamma.
    gamma_auto: whether gamma = 'auto' chose it.
    alpha: its alpha (mean beta).
    tokens: tokens per sequence its loops ran for.
    measured: its measured speedup.
    predicted: the speedup the cost model predicts from this run's costs.
    error: predicted / measured - 1.
    row_cpu: the CPU the point was measured on.
    row_commit: the code's commit it was measured with.
    row_date: when it was measured.
    same_cpu: whether that CPU is this run's.
  """

  source: str
  task: str
  draft: str
  target: str
  temperature: float
  gamma: int
  gamma_auto: bool
  alpha: float
  tokens: float
  measured: float
  predicted: float
  error: float
  row_cpu: str | None
  row_commit: str | None
  row_date: str
  same_cpu: bool
