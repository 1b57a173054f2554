"""Choosing the checkpoint on the dev set, and stopping when it stops improving.

`config.select` names the dev metric that picks the best checkpoint: 'bleu' (sacreBLEU),
'chrf' or 'comet' (with `config.comet_model`), scored at each dev-BLEU evaluation
(`config.bleu_every_steps`, on `config.bleu_num_sentences` dev sentences), or 'loss' (label
smoothed, as trained) or 'perplexity' (of the unsmoothed loss, as the paper's Table 3
reports it), at each dev-loss evaluation (`config.eval_every_steps`); '' chooses nothing.
Each evaluation that beats the best so far (strictly: a tie keeps the earlier step) makes a
parameter snapshot of that step (`transformer.run.best`). `config.patience` > 0 stops the run
after that many evaluations in a row without a better one: a checkpoint is saved there, and
the run is finished.

The selection's state (the best value, its step, the evaluations since) goes into every
checkpoint's metadata, so a resumed run makes the decisions an uninterrupted one makes, and
a run that stopped early stays stopped.
"""

from __future__ import annotations

import dataclasses

# config.select's metrics: (the key in the evaluation's scores, whether higher is better,
# which evaluation computes it).
METRICS = {"bleu": ("sacrebleu", True, "bleu"), "chrf": ("chrf", True, "bleu"),
           "comet": ("comet", True, "bleu"), "loss": ("loss", False, "loss"),
           "perplexity": ("perplexity", False, "loss")}


@dataclasses.dataclass
class Selection:
  """The best dev score so far and the evaluations since it (`update` after each)."""

  metric: str  # a key of METRICS, or '' for none
  patience: int  # evaluations without a better score before stopping; 0 = never stop
  best: float | None = None
  best_step: int | None = None
  since_best: int = 0

  @classmethod
  def from_config(cls, config, saved: dict | None = None) -> Selection:
    """The selection of `config`, continued from a checkpoint's `saved` state (`state()`)
    where it chose by the same metric."""
    selection = cls(config.select, config.patience)
    if saved and saved.get("metric") == config.select:
      selection.best, selection.best_step = saved["best"], saved["best_step"]
      selection.since_best = saved["since_best"]
    return selection

  def state(self) -> dict:
    """What a checkpoint keeps of the selection (JSON)."""
    return {"metric": self.metric, "best": self.best, "best_step": self.best_step,
            "since_best": self.since_best}

  def scored_by(self, evaluation: str) -> bool:
    """Whether `evaluation` ('bleu' or 'loss') computes the selected metric."""
    return bool(self.metric) and METRICS[self.metric][2] == evaluation

  def update(self, step: int, scores: dict[str, float]) -> bool:
    """Takes the scores of the evaluation at `step`; returns whether they are the best yet."""
    key, higher, _ = METRICS[self.metric]
    value = float(scores[key])
    if self.best is None or (value > self.best if higher else value < self.best):
      self.best, self.best_step, self.since_best = value, step, 0
      return True
    self.since_best += 1
    return False

  @property
  def exhausted(self) -> bool:
    """Whether patience has run out: the run stops."""
    return bool(self.patience) and self.since_best >= self.patience

  def describe(self) -> str:
    """`dev bleu 12.3 at step 400 (2 evaluations since)`."""
    if self.best is None:
      return f"no dev {self.metric} yet"
    return (f"dev {self.metric} {self.best:.4g} at step {self.best_step} ({self.since_best} "
            f"evaluation{'s' if self.since_best != 1 else ''} since)")
