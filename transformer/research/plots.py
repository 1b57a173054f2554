"""Figures as PNG files (matplotlib, no display needed): training curves for reports,
attention heatmaps and the positional-encoding matrix for inspection.

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
    ("dev_bleu.png", "dev/sacrebleu", "dev sacreBLEU (training-time subset)", False),
)


def _time_unit(seconds: float) -> tuple[float, str]:
  if seconds >= 2 * 3600:
    return 3600.0, "h"
  return (60.0, "min") if seconds >= 120 else (1.0, "s")


def training_curves(runs: Sequence, out: pathlib.Path) -> dict[str, pathlib.Path]:
  """One figure per curve in `CURVES`: the metric against step (left) and against wall time
  (right), one line per run.

  Args:
    runs: objects with `name` and `series(key) -> [(step, seconds or None, value)]`.
    out: the folder to write into.

  Returns:
    file name -> path of each figure written.
  """
  written = {}
  longest = max((t for run in runs for _, t, _ in run.series("train/loss") if t is not None),
                default=0.0)
  scale, unit = _time_unit(longest)
  for filename, key, label, log in CURVES:
    fig = Figure(figsize=CURVE_SIZE_INCHES, dpi=DPI, layout="constrained")
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    plotted = False
    for run in runs:
      series = run.series(key)
      if not series:
        continue
      plotted = True
      steps, seconds, values = zip(*series)
      (line,) = by_step.plot(steps, values, marker="." if len(steps) < 30 else None,
                             label=run.name)
      timed = [(t / scale, v) for t, v in zip(seconds, values) if t is not None]
      if timed:
        by_time.plot(*zip(*timed), color=line.get_color(),
                     marker="." if len(timed) < 30 else None, label=run.name)
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
      by_step.legend(fontsize="small", ncol=1 + len(runs) // 12)
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
