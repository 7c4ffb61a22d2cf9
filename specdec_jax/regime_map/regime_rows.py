"""The regime map's records: the rows it measures and the predictions it writes.

rows.jsonl holds a `ModelRow` per model and a `PairRow` per (draft, target, temperature)
(`regime_map` measures them; `read_row` reads one back, every committed row included: the
field names are the JSON keys, so the JSON is the same both ways). predictions.json holds a
`Prediction` per pair and alpha, and a `FamilyError` per measured point of our family
(`regime_predictions` makes them, `regime_figure` draws them). Times are seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from specdec_jax.theory import LoopCosts

_INT_KEYED = ("t_verify_s", "verify_ratio", "verify_spread")  # {k: ...}, k a string in JSON.


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRow:
  """A model's costs on this machine (`regime_map.measure_model`).

  Attributes:
    model: its name: a shape of `regime_map.SHAPES`, or our family's directory.
    family: "t5 public" (a shape) or "ours".
    public_params: the shape's published parameter count (None for ours).
    d_model: the architecture's width.
    d_ff: its feed-forward width.
    num_layers: its encoder layers.
    num_decoder_layers: its decoder layers.
    num_heads: its attention heads.
    d_kv: its width per head.
    vocab_size: its vocabulary.
    feed_forward_proj: "relu" (T5 v1.0) or "gated-gelu" (T5.1.1).
    tie_word_embeddings: whether the output layer is the embedding.
    checkpoint_dir: where it was loaded from.
    params: its parameter count.
    checkpoint_bytes: its safetensors' bytes on disk.
    decoder_bytes: weight bytes one decoder call reads (`regime_map.streamed_bytes`).
    write_s: seconds to write the shape's checkpoint (0 when it was there).
    load_s: seconds to load and prepare it.
    t_step_s: T_step, the one-token cached call.
    t_verify_s: {k: T_verify(k)}, k = 1..max_gamma + 1, k = 1 being T_step.
    verify_ratio: {k: T_verify(k) / T_step}.
    verify_spread: {k: (slowest - fastest round) / median of T_verify(k)}: the noise.
    verify_compile_s: compile time of the step timings.
    encoder_s: the work once per sequence: the encoder and the empty cache.
    encoder_compile_s: its compile time.
    prompt_len: tokens of the prompt encoded.
    idle_check_verify: the `contention.Guard` record of the step timings.
    idle_check: the same for the encoder's.
    settings: `regime_map.settings_record` of the run.
    environment: `benchmarking.environment()` with the CPU's "last_level_cache".
    date: when it was measured (UTC, ISO 8601).
    wall_s: seconds the row took, its models' loading included (`regime_map.run` sets it).
  """

  kind: ClassVar[str] = "model"
  model: str
  family: str
  public_params: int | None
  d_model: int
  d_ff: int
  num_layers: int
  num_decoder_layers: int
  num_heads: int
  d_kv: int
  vocab_size: int
  feed_forward_proj: str
  tie_word_embeddings: bool
  checkpoint_dir: str
  params: int
  checkpoint_bytes: int
  decoder_bytes: int
  write_s: float
  load_s: float
  t_step_s: float
  t_verify_s: dict[int, float]
  verify_ratio: dict[int, float]
  verify_spread: dict[int, float]
  verify_compile_s: float
  encoder_s: float
  encoder_compile_s: float
  prompt_len: int
  idle_check_verify: dict[str, Any]
  idle_check: dict[str, Any]
  settings: dict[str, Any]
  environment: dict[str, Any]
  date: str
  wall_s: float | None = None

  @property
  def key(self) -> tuple:
    """What `regime_map.Job.key` names it."""
    return (self.kind, self.model)

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> ModelRow:
    """The record of a model row read from rows.jsonl.

    Raises:
      TypeError: the row lacks a field or has one the record does not know.
    """
    values = {name: value for name, value in row.items() if name != "kind"}
    for name in _INT_KEYED:
      values[name] = {int(k): v for k, v in row[name].items()}
    return cls(**values)

  def to_json(self) -> dict[str, Any]:
    """The row as rows.jsonl holds it."""
    row = {"kind": self.kind, **dataclasses.asdict(self)}
    for name in _INT_KEYED:
      row[name] = {str(k): v for k, v in row[name].items()}
    return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class PairRow:
  """A draft's costs for a target at a temperature (`regime_map.measure_pair`).

  Attributes:
    draft: the draft's name (a shape, or our family's directory).
    target: the target's name.
    temperature: the sampling temperature.
    draft_gamma: the gamma the draft (and our family's loops) were timed at.
    draft_params: the draft's parameter count.
    draft_decoder_bytes: weight bytes one draft decoder call reads.
    draft_reads_target_encoder: whether the draft reads the target's encoder outputs.
    t_draft_s: T_draft, the draft's seconds per proposed token.
    c: T_draft / the target's T_step.
    draft_compile_s: compile time of the draft's timing.
    loop_costs: both loops' own work and both encoders (our family's pairs), None for a
      shape's pair (`regime_predictions.loop_costs` borrows them).
    alpha_of_these_weights: alpha of the loops' timing run (None for a shape's pair).
    measure_s: seconds the measurement took.
    idle_check: the `contention.Guard` record of the timings.
    settings: `regime_map.settings_record` of the run.
    environment: `benchmarking.environment()` with the CPU's "last_level_cache".
    date: when it was measured (UTC, ISO 8601).
    wall_s: seconds the row took, its models' loading included (`regime_map.run` sets it).
  """

  kind: ClassVar[str] = "pair"
  draft: str
  target: str
  temperature: float
  draft_gamma: int
  draft_params: int
  draft_decoder_bytes: int
  draft_reads_target_encoder: bool
  t_draft_s: float
  c: float
  draft_compile_s: float
  loop_costs: LoopCosts | None
  alpha_of_these_weights: float | None
  measure_s: float
  idle_check: dict[str, Any]
  settings: dict[str, Any]
  environment: dict[str, Any]
  date: str
  wall_s: float | None = None

  @property
  def key(self) -> tuple:
    """What `regime_map.Job.key` names it."""
    return (self.kind, self.draft, self.target, float(self.temperature))

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> PairRow:
    """The record of a pair row read from rows.jsonl.

    Raises:
      TypeError: the row lacks a field or has one the record does not know.
    """
    values = {name: value for name, value in row.items() if name != "kind"}
    if row["loop_costs"] is not None:
      values["loop_costs"] = LoopCosts(**row["loop_costs"])
    return cls(**values)

  def to_json(self) -> dict[str, Any]:
    """The row as rows.jsonl holds it."""
    row = dataclasses.asdict(self)
    if self.loop_costs is not None:
      row["loop_costs"] = self.loop_costs.to_json()
    return {"kind": self.kind, **row}


Row = ModelRow | PairRow


def read_row(row: Mapping[str, Any]) -> Row:
  """The record of a row of rows.jsonl, by its "kind".

  Raises:
    ValueError: the kind is neither "model" nor "pair".
    TypeError: the row does not fit its kind's record.
  """
  kinds = {ModelRow.kind: ModelRow, PairRow.kind: PairRow}
  if row.get("kind") not in kinds:
    raise ValueError(f"A regime map row has kind={row.get('kind')!r}; use one of {list(kinds)}.")
  return kinds[row["kind"]].from_json(row)


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
