"""Figures as PNG files (matplotlib, no display needed): training curves for reports (over
seeds: the mean and a band), attention heatmaps and the positional-encoding matrix for
inspection.

Figures are `matplotlib.figure.Figure` objects saved directly, never pyplot's global figures,
so nothing depends on a display or on figures left open by a caller.
"""

from __future__ import annotations

import math
import pathlib
from typing import Sequence

import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

# Training curves: one size for every report, so figures line up side by side.
CURVE_SIZE_INCHES = (12.0, 4.5)
DPI = 100
# (file name, metrics key, axis label, log scale)
CURVES = (
    ("train_loss.png", "train/loss", "training loss (label-smoothed, per token)", False),
    ("dev_perplexity.png", "dev/perplexity", "dev perplexity (per word-piece)", True),
    ("dev_bleu.png", "dev/sacrebleu", "dev sacreBLEU (during training)", False),
)


def _time_unit(seconds: float) -> tuple[float, str]:
  if seconds >= 2 * 3600:
    return 3600.0, "h"
  return (60.0, "min") if seconds >= 120 else (1.0, "s")


def _over_seeds(runs: Sequence, key: str) -> list[tuple[int, float | None, float, float]]:
  """`(step, mean seconds or None, mean, standard deviation)` of `key` at each logged step
  over `runs` (the standard deviation 0 where one run logged that step)."""
  at = {}
  for run in runs:
    for step, seconds, value in run.series(key):
      at.setdefault(step, []).append((seconds, value))
  out = []
  for step in sorted(at):
    values = [v for _, v in at[step]]
    seconds = [t for t, _ in at[step] if t is not None]
    out.append((step, float(np.mean(seconds)) if seconds else None, float(np.mean(values)),
                float(np.std(values, ddof=1)) if len(values) > 1 else 0.0))
  return out


def training_curves(rows: Sequence, out: pathlib.Path) -> dict[str, pathlib.Path]:
  """One figure per curve in `CURVES`: the metric against step (left) and against wall time
  (right), one line per row: a run's values, or over several runs (seeds) their mean with a
  band of ± one standard deviation.

  Args:
    rows: objects with `name` and `runs`, each run with
      `series(key) -> [(step, seconds or None, value)]`.
    out: the folder to write into.

  Returns:
    file name -> path of each figure written.
  """
  written = {}
  longest = max((t for row in rows for run in row.runs for _, t, _ in run.series("train/loss")
                 if t is not None), default=0.0)
  scale, unit = _time_unit(longest)
  for filename, key, label, log in CURVES:
    fig = Figure(figsize=CURVE_SIZE_INCHES, dpi=DPI, layout="constrained")
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    plotted = False
    for row in rows:
      series = _over_seeds(row.runs, key)
      if not series:
        continue
      plotted = True
      name = row.name + (f" ({len(row.runs)} seeds)" if len(row.runs) > 1 else "")
      steps, seconds, means, stds = (np.array(v, dtype=float) for v in zip(*series))
      marker = "." if len(steps) < 30 else None
      (line,) = by_step.plot(steps, means, marker=marker, label=name)
      timed = ~np.isnan(seconds)
      if timed.any():
        by_time.plot(seconds[timed] / scale, means[timed], color=line.get_color(),
                     marker=marker, label=name)
      if len(row.runs) > 1:
        low, high = means - stds, means + stds
        if log:
          low = np.maximum(low, means * 0.5)  # a log axis cannot show <= 0
        by_step.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, lw=0)
        if timed.any():
          by_time.fill_between(seconds[timed] / scale, low[timed], high[timed],
                               color=line.get_color(), alpha=0.2, lw=0)
    by_step.set(xlabel="step", ylabel=label)
    by_time.set(xlabel=f"wall time ({unit})")
    for axes in (by_step, by_time):
      axes.grid(alpha=0.3)
      if log and plotted:
        axes.set_yscale("log")
        # Plain numbers (15, 20, 30) rather than 1.5 × 10^1 on the few ticks a log axis gets.
        axes.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
        axes.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
    if plotted:
      by_step.legend(fontsize="small", ncol=1 + len(rows) // 12)
    else:
      by_step.text(0.5, 0.5, f"no run logged {key}", ha="center", va="center",
                   transform=by_step.transAxes)
    fig.savefig(out / filename, dpi=DPI)
    written[filename] = out / filename
  return written


def attention_heatmaps(weights: np.ndarray, query_labels: Sequence[str],
                       key_labels: Sequence[str], title: str, path: pathlib.Path) -> None:
  """One heatmap per head of one attention layer.

  Args:
    weights: `[H, T, S]` attention weights (rows sum to 1).
    query_labels: T tokens (rows: the positions that attend).
    key_labels: S tokens (columns: the positions attended to).
    title: the figure's title.
    path: the PNG to write.
  """
  heads, t, s = weights.shape
  cols = min(heads, 4)
  rows = math.ceil(heads / cols)
  cell = 0.28  # inches per token, so that labels stay readable
  width = cols * max(2.5, 1.0 + cell * s)
  height = rows * max(2.5, 1.0 + cell * t) + 0.6
  fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
  fig.suptitle(title)
  grid = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).reshape(-1)
  for h, axes in enumerate(grid):
    if h >= heads:
      axes.set_axis_off()
      continue
    image = axes.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                        interpolation="nearest")
    axes.set_title(f"head {h}", fontsize="small")
    axes.set_xticks(range(s), key_labels, rotation=90, fontsize="x-small")
    axes.set_yticks(range(t), query_labels, fontsize="x-small")
  fig.colorbar(image, ax=list(grid[:heads]), shrink=0.6, label="attention weight")
  fig.savefig(path, dpi=DPI)


def matrix(values: np.ndarray, title: str, xlabel: str, ylabel: str,
           path: pathlib.Path) -> None:
  """A `[rows, cols]` matrix as an image with a colour bar (e.g. positional encodings)."""
  fig = Figure(figsize=(10.0, 6.0), dpi=DPI, layout="constrained")
  axes = fig.subplots()
  limit = float(np.abs(values).max()) or 1.0  # symmetric, so that white is zero
  image = axes.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto",
                      interpolation="nearest")
  axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
  fig.colorbar(image, ax=axes)
  fig.savefig(path, dpi=DPI)
