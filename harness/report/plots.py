"""Plots rendered offline to inline SVG (matplotlib, Agg backend): no network, no JS.

Every series gets a colour from the Okabe-Ito palette (readable with the common colour-vision
deficiencies) and its own marker, so a plot still reads in grey or for a colour-blind reader.
"""

from __future__ import annotations

import io
import math
from typing import Iterable, Sequence

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
GOOD, BAD, WARN, GREY = "#0072B2", "#D55E00", "#E69F00", "#8c959f"


def style(i: int) -> dict:
    """Colour and marker of the i-th series (8 distinct pairs, then the markers shift)."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[(i + i // len(PALETTE)) % len(MARKERS)]}


def new_figure(figsize: tuple[float, float], ncols: int = 1, nrows: int = 1, **kwargs):
    """(fig, ax) on the Agg backend; hand them to finish() for titled, gridded SVG."""
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10,
                         "axes.prop_cycle": matplotlib.cycler(color=PALETTE)})
    return plt.subplots(nrows, ncols, figsize=figsize, **kwargs)


def finish(fig, ax, *, title: str, xlabel: str, ylabel: str, legend: bool) -> str:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize="small")
    return svg(fig)


def svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog so it embeds in HTML


_svg = svg  # earlier name


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
    for i, (name, (xs, ys)) in enumerate(series.items()):
        st = style(i)
        ax.plot(list(xs), list(ys), marker=st["marker"] if markers else None, color=st["color"], label=name)
    if logx:
        ax.set_xscale("log", base=2)
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel=ylabel, legend=len(series) > 1)


def histogram(values: Iterable[float], *, title: str, xlabel: str, bins: int = 40) -> str:
    fig, ax = new_figure((6.4, 3.2))
    ax.hist(list(values), bins=bins, color=PALETTE[0])
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel="count", legend=False)


# ---------------------------------------------------------------------------------------------
# Memory: estimate error, fit map


def estimate_error(points: list[dict], tolerance: float | None = None) -> str:
    """Left: signed error per precision (one marker per mode), symmetric-log axis so 0.1 % and
    10 % both read. Right: predicted against measured on log-log axes (sizes span decades)."""
    import numpy as np

    fig, (left, right) = new_figure((11.0, 4.4), ncols=2, gridspec_kw={"width_ratios": [1.35, 1]})
    precisions = sorted({p["precision"] for p in points}, key=_precision_order)
    modes = sorted({p["mode"] for p in points}, key=_mode_order)
    rng = np.random.default_rng(0)
    width = 0.8 / max(1, len(modes))
    for m_i, mode in enumerate(modes):
        st = style(m_i)
        xs, ys = [], []
        for p_i, precision in enumerate(precisions):
            errs = [100 * p["error"] for p in points if p["precision"] == precision and p["mode"] == mode]
            centre = p_i - 0.4 + width * (m_i + 0.5)
            xs += list(centre + rng.uniform(-width / 3, width / 3, len(errs)))
            ys += errs
        left.scatter(xs, ys, s=14, color=st["color"], marker=st["marker"], label=mode, alpha=0.8, linewidths=0)
    if tolerance:
        for sign in (-1, 1):
            left.axhline(sign * 100 * tolerance, color=GREY, linestyle="--", linewidth=0.8)
    left.axhline(0, color="#444", linewidth=0.6)
    left.set_yscale("symlog", linthresh=0.1)
    top = max([abs(100 * p["error"]) for p in points] + [100 * (tolerance or 0), 1.0]) * 1.6
    left.set_ylim(-top, top)
    ticks = [t for t in (-100, -10, -1, -0.1, 0, 0.1, 1, 10, 100) if abs(t) <= top]
    left.set_yticks(ticks, [f"{t:+g} %" if t else "0" for t in ticks])
    left.set_xticks(range(len(precisions)), precisions)
    left.set_ylabel("prediction error, % of measured (symlog)")
    left.set_title("Estimate error by precision and mode (one point per measured case)")
    left.grid(True, axis="y", alpha=0.3)
    left.legend(fontsize="small", title="mode", title_fontsize="small", ncol=len(modes), loc="upper center",
                bbox_to_anchor=(0.5, -0.08), frameon=False)
    for p_i, precision in enumerate(precisions):
        st = style(p_i)
        sel = [p for p in points if p["precision"] == precision]
        right.scatter([p["measured_bytes"] / 2**30 for p in sel], [p["predicted_bytes"] / 2**30 for p in sel],
                      s=14, color=st["color"], marker=st["marker"], label=precision, alpha=0.85, linewidths=0)
    sizes = [p["measured_bytes"] / 2**30 for p in points] + [p["predicted_bytes"] / 2**30 for p in points]
    if sizes:
        lo, hi = min(sizes) * 0.8, max(sizes) * 1.25
        right.plot([lo, hi], [lo, hi], color=GREY, linewidth=0.8, linestyle="--")
        right.set_xlim(lo, hi)
        right.set_ylim(lo, hi)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("measured peak, GiB (log)")
    right.set_ylabel("predicted peak, GiB (log)")
    right.set_title("Predicted against measured")
    right.grid(True, which="both", alpha=0.25)
    right.legend(fontsize="small", title="precision", title_fontsize="small")
    fig.tight_layout()
    return svg(fig)


def fit_map(panels: list[dict], budget_bytes: int, xlabel: str = "context, tokens (prefill, batch 1)") -> str:
    """Per model: precision (rows) x context (columns), cell = fits / does not fit at the budget
    with the predicted peak in GiB; measured cases drawn on top (● ran, ✗ out of memory)."""
    n = len(panels)
    cols = min(n, 3) or 1
    rows = math.ceil(n / cols) or 1
    fig, axes = new_figure((3.9 * cols, 2.5 * rows + 0.5), ncols=cols, nrows=rows, squeeze=False)
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#F5C6A5", "#BFDDF2"])  # light vermillion: no, light blue: fits
    for idx, ax in enumerate(axes.flat):
        if idx >= n:
            ax.axis("off")
            continue
        panel = panels[idx]
        precisions, contexts = panel["precisions"], panel["contexts"]
        grid = [[1 if c["fits"] else 0 for c in row] for row in panel["cells"]]
        ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for r_i, row in enumerate(panel["cells"]):
            for c_i, cell in enumerate(row):
                ax.text(c_i, r_i, f"{cell['predicted_bytes'] / 2**30:.1f}", ha="center", va="center", fontsize=7,
                        color="#1f2328" if cell["fits"] else "#7a2e00")
        for point in panel.get("measured", []):
            if point["precision"] in precisions and point["context"] in contexts:
                x, y = contexts.index(point["context"]), precisions.index(point["precision"])
                if point["fits"]:
                    ax.scatter([x + 0.3], [y - 0.22], marker="o", s=22, color=GOOD, edgecolors="white", linewidths=0.6)
                else:
                    ax.scatter([x + 0.3], [y - 0.22], marker="X", s=30, color=BAD, edgecolors="white", linewidths=0.6)
        ax.set_xticks(range(len(contexts)), [_tokens(c) for c in contexts], fontsize=7)
        ax.set_yticks(range(len(precisions)), precisions, fontsize=7)
        ax.set_title(panel["model"], fontsize=9)
        ax.set_xlabel(xlabel, fontsize=7)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color="#BFDDF2", label="predicted to fit"), Patch(color="#F5C6A5", label="predicted not to fit"),
               Line2D([], [], marker="o", color=GOOD, linestyle="", label="measured: ran within the budget"),
               Line2D([], [], marker="X", color=BAD, linestyle="", label="measured: out of memory")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Fit map at {budget_bytes / 2**30:g} GiB (cell text: predicted peak, GiB)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    return svg(fig)


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _precision_order(p: str) -> tuple:
    order = ["fp32", "fp16", "bf16", "int8", "w4a16", "nf4", "nf4-dq", "fp4", "fp4-dq"]
    return (order.index(p) if p in order else len(order), p)


def _mode_order(m: str) -> tuple:
    order = ["weights", "prefill", "generate", "train"]
    return (order.index(m) if m in order else len(order), m)


# ---------------------------------------------------------------------------------------------
# Serving: figures with intervals, comparison, timeline, server time series


def ci_plot(series: dict[str, list[dict]], *, title: str, xlabel: str, ylabel: str, logx: bool = True) -> str:
    """series name -> points {x, y, lo, hi} (lo/hi may be None); error bars are the 95 % interval.
    Series are dodged a little along x so old and new stand side by side."""
    fig, ax = new_figure((5.6, 3.5))
    names = list(series)
    # "<file> p50" and "<file> p99" share the file's colour and marker; p99 is dashed and hollow.
    groups = list(dict.fromkeys(n[:-4] if n.endswith((" p50", " p99")) else n for n in names))
    for i, name in enumerate(names):
        pts = sorted(series[name], key=lambda p: p["x"])
        if not pts:
            continue
        shift = 2 ** (0.06 * (i - (len(names) - 1) / 2)) if logx else 1
        xs = [p["x"] * shift for p in pts]
        ys = [p["y"] for p in pts]
        lo = [p["y"] - p["lo"] if p.get("lo") is not None else 0 for p in pts]
        hi = [p["hi"] - p["y"] if p.get("hi") is not None else 0 for p in pts]
        group = name[:-4] if name.endswith((" p50", " p99")) else name
        st = style(groups.index(group))
        p99 = name.endswith(" p99")
        ax.errorbar(xs, ys, yerr=[lo, hi], color=st["color"], marker=st["marker"], linestyle="--" if p99 else "-",
                    capsize=3, markersize=5, label=name, markerfacecolor="white" if p99 else st["color"])
    if logx:
        ax.set_xscale("log", base=2)
        xs_all = sorted({p["x"] for pts in series.values() for p in pts})
        if xs_all:
            ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
    ax.set_ylim(bottom=0)
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel=ylabel, legend=len(series) > 1)


def change_forest(changes: list[dict]) -> str:
    """Each metric's change (candidate / baseline - 1) with its 95 % interval and its threshold
    on the worse side: a regression is an interval wholly beyond the dashed line."""
    changes = [c for c in changes if c.get("change") is not None]  # "not measured" metrics have no point
    fig, ax = new_figure((6.4, 0.42 * len(changes) + 1.2))
    for i, c in enumerate(changes):
        worse_sign = 1 if c["higher_is_worse"] else -1
        unsure = c["verdict"].startswith("inconclusive")
        colour = BAD if c["verdict"] == "regressed" else WARN if unsure else GOOD
        marker = "X" if c["verdict"] == "regressed" else "D" if unsure else "o"
        y = len(changes) - 1 - i
        if c.get("ci_low") is not None:  # no interval: one run a side, or the vllm-ci policy
            ax.plot([100 * c["ci_low"], 100 * c["ci_high"]], [y, y], color=colour, linewidth=2.5)
        ax.scatter([100 * c["change"]], [y], color=colour, marker=marker, s=36, zorder=3)
        ax.plot([100 * worse_sign * c["threshold"]] * 2, [y - 0.35, y + 0.35], color="#444", linestyle="--",
                linewidth=1)
    ax.axvline(0, color=GREY, linewidth=0.8)
    ax.set_yticks(range(len(changes)), [f"{c['metric']} ({c['level']})" for c in reversed(changes)])
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=BAD, marker="X", label="regressed"),
               Line2D([], [], color=WARN, marker="D", label="inconclusive"),
               Line2D([], [], color=GOOD, marker="o", label="within threshold / better"),
               Line2D([], [], color="#444", linestyle="--", label="threshold (worse side)")]
    ax.legend(handles=handles, fontsize="x-small", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4,
              frameon=False)
    ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:+g} %" if v else "0")
    ax.set_xlabel("change from baseline, % (bar: 95 % interval)")
    ax.grid(True, axis="x", alpha=0.3)
    return svg(fig)


def timeline(requests: list[dict], *, title: str, limit: int = 200) -> str:
    """One row per request: schedule lag, waiting for the first token, streaming; failures apart."""
    keys = ("scheduled_s", "dispatched_s", "sent_s", "end_s")
    reqs = sorted([r for r in requests if all(r.get(k) is not None for k in keys)], key=lambda r: r["sent_s"])[:limit]
    if not reqs:
        return ""
    fig, ax = new_figure((6.4, max(2.0, min(6.5, 0.035 * len(reqs) + 1.6))))
    lag, wait, stream, failed = [], [], [], []
    for i, r in enumerate(reqs):
        first = r["sent_s"] + r["ttft_ms"] / 1000 if r.get("ttft_ms") is not None else r["end_s"]
        if r["sent_s"] > r["scheduled_s"]:
            lag.append((i, r["scheduled_s"], r["sent_s"]))
        if r.get("error"):
            failed.append((i, r["sent_s"], r["end_s"]))
        else:
            wait.append((i, r["sent_s"], first))
            stream.append((i, first, r["end_s"]))
    for items, colour, label, hatch in ((lag, WARN, "schedule lag (client)", None),
                                        (wait, PALETTE[4], "waiting for first token", None),
                                        (stream, GOOD, "streaming", None),
                                        (failed, BAD, "failed", "///")):
        for j, (i, a, b) in enumerate(items):
            ax.barh(i, max(b - a, 1e-4), left=a, height=0.8, color=colour, hatch=hatch, linewidth=0,
                    label=label if j == 0 else None)
    ax.invert_yaxis()
    return finish(fig, ax, title=title, xlabel="seconds since run start", ylabel="request (by send time)",
                  legend=True)


def server_series(samples: list[dict], *, title: str) -> str:
    """Running and waiting requests (left axis) and KV-cache usage in % (right axis)."""
    ts = [s["t_s"] for s in samples]
    fig, ax = new_figure((6.4, 3.0))
    ax.step(ts, [s.get("running") or 0 for s in samples], where="post", color=PALETTE[0], marker="o", markersize=3,
            label="running requests")
    ax.step(ts, [s.get("waiting") or 0 for s in samples], where="post", color=PALETTE[1], marker="s", markersize=3,
            linestyle="--", label="waiting requests")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(ts, [100 * (s.get("kv_cache_usage") or 0) for s in samples], color=PALETTE[2], marker="^",
               markersize=3, linestyle=":", label="KV-cache usage, %")
    right.set_ylabel("KV-cache usage, %")
    right.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize="x-small", loc="upper right")
    return finish(fig, ax, title=title, xlabel="seconds since run start", ylabel="requests", legend=False)


# ---------------------------------------------------------------------------------------------
# Index: trends across runs


def trend(series: dict[str, list[tuple[float, float]]], *, title: str, ylabel: str, dates: bool = True,
          step: bool = False, yticks: dict[float, str] | None = None) -> str:
    """series name -> [(epoch or x, y)], one marker per run."""
    import datetime as dt

    fig, ax = new_figure((6.4, 3.0))
    for i, (name, pts) in enumerate(series.items()):
        pts = sorted(pts)
        xs = [dt.datetime.fromtimestamp(x) for x, _ in pts] if dates else [x for x, _ in pts]
        st = style(i)
        if step:
            ax.step(xs, [y for _, y in pts], where="post", color=st["color"], marker=st["marker"], label=name)
        else:
            ax.plot(xs, [y for _, y in pts], color=st["color"], marker=st["marker"], label=name)
    if dates:
        fig.autofmt_xdate()
    if yticks:
        ax.set_yticks(list(yticks), list(yticks.values()))
        ax.set_ylim(min(yticks) - 0.4, max(yticks) + 0.4)
    return finish(fig, ax, title=title, xlabel="run time" if dates else "", ylabel=ylabel, legend=len(series) > 1)


def categories(groups: dict[str, list[float]], *, title: str, ylabel: str, xlabel: str) -> str:
    """One column per category (e.g. vLLM version), one point per run, the median marked."""
    import statistics

    fig, ax = new_figure((5.6, 3.0))
    for i, (name, ys) in enumerate(groups.items()):
        st = style(i)
        ax.scatter([i] * len(ys), ys, color=st["color"], marker=st["marker"], s=24, alpha=0.85)
        if ys:
            ax.plot([i - 0.25, i + 0.25], [statistics.median(ys)] * 2, color="#444", linewidth=1.5)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(bottom=0)
    return finish(fig, ax, title=title, xlabel=xlabel, ylabel=ylabel, legend=False)


def memory_picture(components: list[dict], *, title: str) -> str:
    """Where the memory goes: one row per component, the predicted bytes beside the measured ones
    (from torch's allocator snapshot) when there are any."""
    fig, ax = new_figure((6.4, 0.32 * len(components) + 1.2))
    names = [c["component"] for c in components]
    ys = list(range(len(names)))[::-1]
    measured = [c.get("measured") for c in components]
    both = any(m is not None for m in measured)
    h = 0.38 if both else 0.7
    ax.barh([y + (h / 2 if both else 0) for y in ys], [c["predicted"] / 2**30 for c in components], height=h,
            color=PALETTE[0], label="predicted")
    if both:
        ax.barh([y - h / 2 for y in ys], [(m or 0) / 2**30 for m in measured], height=h, color=PALETTE[1],
                hatch="//", label="measured (allocator snapshot)")
    ax.set_yticks(ys, names)
    return finish(fig, ax, title=title, xlabel="GiB at the peak", ylabel="", legend=both)
