"""The report's charts, drawn by matplotlib as SVG text to put inline in the page.

No pyplot (no global figure state, no GUI backend): each chart is a ``Figure`` saved to SVG.
Text stays text (``svg.fonttype: none``: small, selectable), ``$`` in a class or run name is
a dollar (no mathtext), and paths are not simplified, so that a line has one vertex per
logged row (the tests count them). Each line carries an id, ``<chart>-<run>-<kind>``.
"""

import functools
import io
import re
import warnings

import matplotlib
from matplotlib.figure import Figure

from tfgpu.report.runs import Run, number

STYLE = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "path.simplify": False,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

# (id, title, y label, [(split, key, kind, scale)]): the curves, all runs over each other.
CURVES = (
    ("loss", "Loss", "loss", [("train", "loss", "train", 1), ("eval", "loss", "eval", 1)]),
    (
        "top1",
        "Top-1 accuracy",
        "top-1",
        [("train", "accuracy", "train", 1), ("eval", "top1", "eval", 1)],
    ),
    ("lr", "Learning rate", "learning rate", [("train", "learning_rate", "train", 1)]),
    ("ips", "Training images/s", "images/s", [("train", "images_per_sec", "train", 1)]),
    (
        "wait",
        "Input wait",
        "% of the window",
        [("train", "input_wait_fraction", "train", 100)],
    ),
)


UNITS = (("seconds", 1.0, 300.0), ("minutes", 60.0, 3 * 3600.0), ("hours", 3600.0, float("inf")))


def color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def series(run: Run, split: str, key: str, scale: float = 1) -> tuple[list, list]:
    """(steps, values x ``scale``) of ``run``'s ``split`` rows ("train" or "eval") that hold
    a finite ``key``."""
    rows = run.train if split == "train" else run.evals
    points = [(r["step"], number(r.get(key))) for r in rows]
    kept = [(s, v * scale) for s, v in points if v is not None]
    return [s for s, _ in kept], [v for _, v in kept]


def styled(draw):
    """``draw`` with the report's matplotlib settings in force (texts read them when made)."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper


@styled
def curve_chart(runs: list, chart: tuple) -> tuple[str, int]:
    """(the SVG of one CURVES ``chart`` for all ``runs``, the number of points drawn)."""
    ident, title, ylabel, lines = chart
    fig, ax = _figure(6.4, 3.2)
    drawn = 0
    for i, run in enumerate(runs):
        for split, key, kind, scale in lines:
            x, y = series(run, split, key, scale)
            if not x:
                continue
            style = {"linestyle": "-", "linewidth": 1.4}
            if kind == "eval":
                style = {"linestyle": "--", "linewidth": 1.4, "marker": "o", "markersize": 3}
            label = f"{run.name} ({kind})" if len(lines) > 1 else run.name
            (line,) = ax.plot(x, y, color=color(i), label=label, **style)
            line.set_gid(f"{ident}-{i}-{kind}")
            drawn += len(x)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if ident == "lr" and drawn:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)
    return to_svg(fig), drawn


@styled
def time_chart(runs: list, spent: list, parts: tuple) -> str:
    """Horizontal stacked bars: each run's time in ``parts`` ((key, label) pairs), in
    seconds, minutes or hours as the longest asks; ``spent``: each run's
    ``timing.time_spent``."""
    fig, ax = _figure(6.4, 1.4 + 0.4 * len(runs))
    names = [r.name for r in runs]
    longest = max((s["total"] for s in spent), default=0.0)
    unit, scale = next((u, d) for u, d, top in UNITS if longest <= top)
    for j, (key, label) in enumerate(parts):
        widths = [s["parts"].get(key, 0.0) / scale for s in spent]
        lefts = [sum(s["parts"].get(k, 0.0) for k, _ in parts[:j]) / scale for s in spent]
        ax.barh(names, widths, left=lefts, color=COLORS[j % len(COLORS)], label=label)
    ax.set_xlabel(unit)
    ax.invert_yaxis()
    fig.legend(fontsize=7, loc="outside lower center", ncol=3)
    return to_svg(fig)


@styled
def confusion_chart(matrix, names: list) -> str:
    """The confusion matrix as a heat map of row shares (rows: true class), class names on the
    axes up to 40 classes, counts in the cells up to 12."""
    counts = [[float(v) for v in row] for row in matrix]
    shares = [[v / max(sum(row), 1.0) for v in row] for row in counts]
    k = len(counts)
    side = min(max(3.0, 0.32 * k + 1.5), 9.0)
    fig, ax = _figure(side + 1.0, side)
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.grid(False)
    if k <= 40:
        ax.set_xticks(range(k), [_short(n) for n in names], rotation=90, fontsize=7)
        ax.set_yticks(range(k), [_short(n) for n in names], fontsize=7)
    if k <= 12:
        for r in range(k):
            for c in range(k):
                dark = shares[r][c] > 0.5
                ax.text(c, r, f"{int(counts[r][c])}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")  # fmt: skip
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    return to_svg(fig)


def _short(name: str, limit: int = 24) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _figure(width: float, height: float):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


_SVG_START = re.compile(r"^.*?(?=<svg)", re.S)


def to_svg(fig) -> str:
    """``fig`` as an <svg> element (the XML prolog and doctype cut off)."""
    buffer = io.StringIO()
    with warnings.catch_warnings():
        # Text stays text: the browser draws it with its own fonts, whatever matplotlib's lack.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(buffer, format="svg")
    return _SVG_START.sub("", buffer.getvalue(), count=1).strip()
