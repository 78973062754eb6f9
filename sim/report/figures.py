"""Matplotlib building blocks shared by the PNG plots: figures, a legend that fits, saving.

Figures are ``matplotlib.figure.Figure`` objects on the Agg canvas (no pyplot, no global
state). Sizes are in inches: a figure is as tall as its panels plus its title and legend, so
a long legend (a dozen series) makes the figure taller instead of squeezing the panels to
nothing. User text (titles, legend labels) goes through ``literal``, so a label such as
``$\\frac{$`` is shown as typed instead of failing to parse as mathtext.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from sim.experiments.results import atomic_write
from sim.report.context import wide_range

DPI = 110
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
#: Margins in inches: title (two lines) above, tick labels and axis title below, left, right.
TOP_IN, BOTTOM_IN, LEFT_IN, RIGHT_IN = 0.75, 0.55, 0.75, 0.2
LEGEND_ROW_IN = 0.2
LEGEND_FONT = 8


def literal(text: str) -> str:
    """``text`` drawn as typed: its ``$`` escaped so matplotlib never reads it as mathtext
    (axis tick labels keep their own mathtext, so it is not switched off globally)."""
    return text.replace("$", r"\$")


#: Marker shapes (matplotlib, plotly) that tell apart series sharing a colour: the 11th series
#: has the first colour again, with squares.
MARKERS = (("o", "circle"), ("s", "square"), ("^", "triangle-up"), ("D", "diamond"))


def color(index: int) -> str:
    """The colour of the ``index``-th series (cycling)."""
    return COLORS[index % len(COLORS)]


def marker(index: int, plotly: bool = False) -> str:
    """The marker of the ``index``-th series: one shape per round of ``COLORS``."""
    return MARKERS[index // len(COLORS) % len(MARKERS)][1 if plotly else 0]


def new_figure(ncols: int, nrows: int = 1, width: float = 4.2,
               height: float = 2.6) -> tuple[Figure, np.ndarray]:
    """A figure of ``nrows`` × ``ncols`` panels, each ``width`` × ``height`` inches."""
    fig = Figure(figsize=(width * ncols, height * nrows), dpi=DPI)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax in axes:
        ax.grid(True, alpha=0.3, linewidth=0.6)
        ax.tick_params(labelsize=8)
    return fig, axes


def legend_columns(labels: list[str], width_in: float) -> int:
    """How many legend entries of these lengths fit side by side in ``width_in`` inches."""
    longest = max((len(s) for s in labels), default=1)
    per_entry_in = (longest * 0.55 * LEGEND_FONT + 40) / 72  # text + handle, in inches
    return max(1, min(len(labels), int(width_in / per_entry_in)))


def save(fig: Figure, path: Path, what: str, context: str, legend: bool = True,
         extra: list[Any] | None = None) -> Path:
    """Title (``what`` over ``context``), a shared legend below, margins in inches, save.

    The figure grows by the title and legend heights, so the panels keep their size however
    many series the legend lists.
    """
    fig.suptitle(literal(f"{what}\n{context}"), fontsize=9.5)
    w = fig.get_size_inches()[0]
    panels_in = float(fig.get_size_inches()[1])  # new_figure's size: the panels alone
    handles, labels = fig.axes[0].get_legend_handles_labels()
    for artist in extra or []:
        handles.append(artist)
        labels.append(artist.get_label())
    labels = [literal(s) for s in labels]
    rows, ncol = 0, 1
    if legend and handles:
        ncol = legend_columns(labels, w - 0.4)
        rows = -(-len(labels) // ncol)
    bottom_in = BOTTOM_IN + LEGEND_ROW_IN * rows + (0.1 if rows else 0)
    h = panels_in + TOP_IN + bottom_in
    fig.set_size_inches(w, h)
    if rows:
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=LEGEND_FONT,
                   frameon=False)
    fig.subplots_adjust(left=LEFT_IN / w, right=1 - RIGHT_IN / w, top=1 - TOP_IN / h,
                        bottom=bottom_in / h, wspace=0.3, hspace=0.45)
    write_png(fig, path)
    return path


def write_png(fig: Figure, path: Path) -> None:
    """Save ``fig`` as a PNG at ``path`` atomically."""
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=DPI))


def bars(ax: Any, names: list[str], colors: list[str], means: np.ndarray,
         errors: np.ndarray | None, groups: list[str]) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series (``names``);
    ``means`` are series × groups, ``errors`` series × groups (symmetric half-widths) or
    series × 2 × groups (below, above); NaN for none."""
    n = len(names)
    width = 0.8 / max(n, 1)
    for i, name in enumerate(names):
        pos = np.arange(len(groups)) + (i - (n - 1) / 2) * width
        err = None
        if errors is not None and np.isfinite(errors[i]).any():
            err = np.nan_to_num(errors[i], nan=0.0)
        ax.bar(pos, means[i], width, color=colors[i], label=name, yerr=err,
               error_kw={"elinewidth": 0.8, "capsize": 2})
    ax.set_xticks(np.arange(len(groups)), groups, fontsize=8)


def auto_log(ax: Any, values: np.ndarray, ratio: float = 50.0) -> None:
    """Use a log y axis when positive ``values`` span more than ``ratio``."""
    if wide_range(values, ratio):
        ax.set_yscale("log")
