"""Plots rendered offline to inline SVG (matplotlib, Agg backend): no network, no JS."""

from __future__ import annotations

import io
from typing import Iterable, Sequence


def new_figure(figsize: tuple[float, float]):
    """(fig, ax) on the Agg backend; hand them to finish() for titled, gridded SVG."""
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def finish(fig, ax, *, title: str, xlabel: str, ylabel: str, legend: bool) -> str:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize="small")
    return _svg(fig)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog so it embeds in HTML


def line_plot(
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    markers: bool = True,
) -> str:
    """One line per series name -> (xs, ys). Returns an <svg> element as text."""
    fig, ax = new_figure((6.4, 3.6))
    for name, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o" if markers else None, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel=ylabel, legend=len(series) > 1)


def scatter_plot(
    points: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    diagonal: bool = False,
) -> str:
    """Scatter per group; `diagonal` draws y = x (predicted against measured)."""
    fig, ax = new_figure((5.0, 5.0))
    lo, hi = float("inf"), float("-inf")
    for name, (xs, ys) in points.items():
        xs, ys = list(xs), list(ys)
        ax.scatter(xs, ys, label=name, s=14)
        if xs:
            lo = min(lo, *xs, *ys)
            hi = max(hi, *xs, *ys)
    if diagonal and lo < hi:
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, linestyle="--")
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel=ylabel, legend=len(points) > 1)


def histogram(values: Iterable[float], *, title: str, xlabel: str, bins: int = 40) -> str:
    fig, ax = new_figure((6.4, 3.2))
    ax.hist(list(values), bins=bins)
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel="count", legend=False)
