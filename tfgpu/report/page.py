"""The report as one HTML file: inline CSS, inline SVG charts, images as data: URIs, no
JavaScript, and a Content-Security-Policy that lets the page fetch nothing.

Every text that comes from a run (names, class names, settings, file names, notes) goes
through ``esc`` (``html.escape``, quotes included) on its way in; the charts' SVG is
matplotlib's, which escapes its own texts. The elements that hold the figures carry them as
``data-*`` attributes too, so that a program (the tests, a script) reads what the page shows.
"""

import base64
import datetime
import html

import matplotlib

from tfgpu import __version__
from tfgpu.report import charts, timing
from tfgpu.report.runs import Run, number

# Settings not worth a column when they differ: where things are, not what was trained.
NOT_COMPARED = frozenset({"model_dir"})
# What the table shows of a single run (nothing differs).
KEY_SETTINGS = (
    "model",
    "data_dir",
    "global_batch_size",
    "optimizer",
    "learning_rate",
    "train_steps",
    "epochs",
    "dtype",
)
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; }
.charts figure, figure.chart { margin: 0; border: 1px solid #eee; }
.charts svg { width: 560px; height: auto; } figure.chart svg { max-width: 100%; height: auto; }
.side { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.confusion svg { width: 520px; } .side h3 { margin-top: 0; }
.notes { color: #8a4b00; } .missing { color: #a00; font-weight: 600; }
.gallery { display: flex; flex-wrap: wrap; gap: 10px; }
.gallery figure { margin: 0; width: 150px; font-size: 12px; }
.gallery img { width: 96px; height: 96px; image-rendering: pixelated; border: 1px solid #999; }
.bar { display: inline-block; height: 9px; background: #4a7fbf; }
code { font-size: 12px; } footer { margin-top: 2em; color: #666; font-size: 12px; }
"""


def esc(value) -> str:
    """``value`` as HTML text (quotes too: safe in attributes)."""
    return html.escape(str(value), quote=True)


def render(runs: list, evaluations: list, options: dict) -> str:
    """The whole page for ``runs`` (``runs.Run``); ``evaluations``: per run, an
    ``mistakes.confusion_and_mistakes`` result, or {"missing": why} when there is none; ``options``:
    what the command was asked ({"evaluate", "gallery"})."""
    spent = [timing.time_spent(r) for r in runs]
    title = "tfgpu report: " + ", ".join(r.name for r in runs)
    body = [
        f"<h1>{esc(title)}</h1>",
        f"<p>{len(runs)} run(s); made {esc(_now())} by tfgpu {esc(__version__)}.</p>",
        _runs_section(runs),
        _curves_section(runs),
        _time_section(runs, spent),
        *(_evaluation_section(i, r, e, options) for i, (r, e) in enumerate(zip(runs, evaluations))),
        _footer(),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# --- the runs' table ---------------------------------------------------------------------


def differing(runs: list) -> list[str]:
    """The settings (config.json keys) whose values are not the same in every run; for one
    run, KEY_SETTINGS."""
    if len(runs) == 1:
        return [k for k in KEY_SETTINGS if k in runs[0].config]
    keys = sorted({k for r in runs for k in r.config} - NOT_COMPARED)
    return [k for k in keys if len({repr(r.config.get(k)) for r in runs}) > 1]


def _runs_section(runs: list) -> str:
    keys = differing(runs)
    head = "settings" if len(runs) == 1 else "settings that differ"
    rows = [
        '<table id="runs"><tr><th>run</th><th>status</th>'
        f"<th>{head}</th><th>final top-1</th><th>top-5</th><th>best top-1 (step)</th>"
        "<th>steps</th><th>wall time</th><th>images/s</th><th>strategy</th>"
        "<th>replicas</th></tr>"
    ]
    rows += [_run_row(i, r, keys) for i, r in enumerate(runs)]
    notes = [f"<li><b>{esc(r.name)}</b>: {esc(n)}</li>" for r in runs for n in r.notes]
    listed = f'<ul class="notes">{"".join(notes)}</ul>' if notes else ""
    return "<section><h2>Runs</h2>" + "".join(rows) + "</table>" + listed + "</section>"


def _run_row(i: int, run: Run, keys: list) -> str:
    final, best = run.final_eval(), run.best_eval()
    top1, top5 = number(final.get("top1")), number(final.get("top5"))
    ips = number(run.summary.get("train_images_per_sec")) or _median_ips(run)
    settings = "<br>".join(f"<code>{esc(k)}={esc(_shown(run.config.get(k)))}</code>" for k in keys)
    status = "finished" if run.finished else "in progress or stopped"
    if run.summary.get("stopped"):
        status = f"stopped early ({run.summary['stopped']})"
    wall = number(run.summary.get("wall_time_s"))
    attrs = {
        "data-run": run.name,
        "data-final-top1": _attr(top1),
        "data-final-top5": _attr(top5),
        "data-best-step": _attr(best.get("step")),
        "data-train-rows": len(run.train),
        "data-eval-rows": len(run.evals),
        "data-last-step": _attr(run.last_step),
    }
    cells = [
        f'<th style="color:{charts.color(i)}">{esc(run.name)}</th>',
        f"<td>{esc(status)}</td>",
        f"<td>{settings}</td>",
        _num(_pct(top1) + ("" if run.finished or top1 is None else " (so far)")),
        _num(_pct(top5)),
        _num(f"{_pct(number(best.get('top1')))} ({best['step']})" if best else "-"),
        _num(_shown(run.summary.get("steps", run.last_step)) or "-"),
        _num(_duration(wall) if wall is not None else "-"),
        _num(f"{ips:,.0f}" if ips else "-"),
        f"<td>{esc(run.config.get('strategy', run.summary.get('strategy', '-')))}</td>",
        _num(run.config.get("num_replicas", run.summary.get("num_replicas", "-"))),
    ]
    shown = " ".join(f'{k}="{esc(v)}"' for k, v in attrs.items())
    return f'<tr class="run" {shown}>' + "".join(cells) + "</tr>"


def _median_ips(run: Run) -> float | None:
    """The median images/s of the windows after the first (tracing) one."""
    values = sorted(v for r in run.train[1:] if (v := number(r.get("images_per_sec"))))
    return values[len(values) // 2] if values else None


# --- curves and time ---------------------------------------------------------------------


def _curves_section(runs: list) -> str:
    figures = []
    for chart in charts.CURVES:
        svg, points = charts.curve_chart(runs, chart)
        figures.append(f'<figure data-chart="{chart[0]}" data-points="{points}">{svg}</figure>')
    about = (
        "<p>Train rows (solid) are logging windows: the mean over the window's updates; "
        "evaluation rows (dashed, dots) are the validation split at that step.</p>"
    )
    return (
        "<section><h2>Curves</h2>"
        + about
        + '<div class="charts">'
        + "".join(figures)
        + ("</div></section>")
    )


def _time_section(runs: list, spent: list) -> str:
    head = "".join(f"<th>{esc(label)}</th>" for _, label in timing.PARTS)
    rows = []
    for run, s in zip(runs, spent):
        cells = []
        for key, _ in timing.PARTS:
            value = s["parts"].get(key)
            share = f" ({value / s['total']:.0%})" if value is not None and s["total"] else ""
            cells.append(_num("-" if value is None else _duration(value) + share))
        notes = "; ".join(s["notes"])
        rows.append(
            f'<tr data-run="{esc(run.name)}" data-total-s="{s["total"]:.3f}"><th>{esc(run.name)}'
            f'</th>{_num(_duration(s["total"]))}{"".join(cells)}<td class="notes">'
            f"{esc(notes)}</td></tr>"
        )
    chart = charts.time_chart(runs, spent, timing.PARTS)
    return (
        "<section><h2>Where the time went</h2><p>From metrics.jsonl's windows and "
        "evaluations and summary.json's wall time.</p>"
        f'<table id="time"><tr><th>run</th><th>total</th>{head}<th>notes</th></tr>'
        + "".join(rows)
        + f'</table><figure class="chart">{chart}</figure></section>'
    )


# --- evaluation ----------------------------------------------------------------------------


def _evaluation_section(i: int, run: Run, result: dict, options: dict) -> str:
    head = f'<section id="evaluation-{i}"><h2>Evaluation: {esc(run.name)}</h2>'
    if "missing" in result:
        return head + f'<p class="missing">{esc(result["missing"])}</p></section>'
    names = result["class_names"]
    step = "" if result["step"] is None else f" (step {result['step']})"
    parts = [
        f"<p>Checkpoint <code>{esc(result['checkpoint'])}</code>{esc(step)} on the "
        f"{esc(result['split'])} split: {result['num_examples']} images, top-1 "
        f'<b data-eval-top1="{result["top1"]:.6f}">{_pct(result["top1"])}</b> (no '
        "test-time augmentation).</p>"
    ]
    if result["unreadable"]:
        parts.append(
            f'<p class="missing">{result["unreadable"]} image(s) of the split did not decode '
            "(broken or missing): left out.</p>"
        )
    matrix = charts.confusion_chart(result["confusion_matrix"], names)
    parts.append(
        f'<div class="side"><figure class="chart confusion">{matrix}</figure><div>'
        f"{_confused_pairs(result)}{_per_class(result)}</div></div>"
    )
    parts.append(_gallery(result, options.get("gallery", 0)))
    return head + "".join(parts) + "</section>"


def _confused_pairs(result: dict, top: int = 10) -> str:
    names, matrix = result["class_names"], result["confusion_matrix"]
    pairs = sorted(
        ((matrix[t][p], t, p) for t in range(len(names)) for p in range(len(names)) if t != p),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    rows = [
        f"<tr><td>{esc(names[t])}</td><td>{esc(names[p])}</td>{_num(count)}</tr>"
        for count, t, p in pairs[:top]
        if count
    ]
    if not rows:
        return "<h3>Most confused</h3><p>No image of this split is misclassified.</p>"
    return (
        "<h3>Most confused</h3><table><tr><th>true class</th><th>predicted as</th>"
        "<th>images</th></tr>" + "".join(rows) + "</table>"
    )


def _per_class(result: dict) -> str:
    names, matrix = result["class_names"], result["confusion_matrix"]
    order = sorted(
        range(len(names)),
        key=lambda c: (
            result["per_class_accuracy"][c] is None,
            result["per_class_accuracy"][c] or 0,
            c,
        ),
    )
    rows = []
    for c in order:
        acc = result["per_class_accuracy"][c]
        bar = (
            f'<span class="bar" style="width:{round(100 * acc)}px"></span>'
            if acc is not None
            else ""
        )
        rows.append(
            f'<tr class="class" data-class="{esc(names[c])}" data-accuracy="{_attr(acc)}">'
            f"<td>{esc(names[c])}</td>{_num(_pct(acc))}<td>{bar}</td>{_num(sum(matrix[c]))}</tr>"
        )
    return (
        '<h3>Accuracy per class</h3><p>Worst first.</p><table id="per-class"><tr><th>class'
        "</th><th>accuracy</th><th></th><th>images</th></tr>" + "".join(rows) + "</table>"
    )


def _gallery(result: dict, wanted: int) -> str:
    title = "<h3>Most confident mistakes</h3>"
    if not wanted:
        return title + "<p>Not asked for (--gallery=0).</p>"
    if not result["gallery"]:
        return title + "<p>No misclassified image.</p>"
    names = result["class_names"]
    cards = []
    for m in result["gallery"]:
        uri = "data:image/png;base64," + base64.b64encode(m["png"]).decode("ascii")
        true, pred = names[m["true"]], names[m["pred"]]
        cards.append(
            f'<figure class="mistake" data-prob="{m["prob"]:.6f}"><img src="{uri}" '
            f'alt="{esc(m["name"])}"><figcaption>true: <b>{esc(true)}</b> '
            f"({_pct(m['true_prob'])})<br>predicted: <b>{esc(pred)}</b> ({_pct(m['prob'])})"
            f"<br><code>{esc(m['name'])}</code></figcaption></figure>"
        )
    about = (
        f"<p>The {len(cards)} misclassified images the model gave the highest probability to "
        "a wrong class, as evaluation sees them (cropped and resized).</p>"
    )
    return title + about + '<div class="gallery">' + "".join(cards) + "</div>"


def _footer() -> str:
    return (
        f"<footer>Charts drawn by matplotlib {esc(matplotlib.__version__)} as inline SVG; "
        "images inline as data: URIs; no JavaScript, nothing fetched: this file is the whole "
        "report.</footer>"
    )


# --- cells -------------------------------------------------------------------------------


def _num(text) -> str:
    """A right-aligned cell of ``text`` (escaped: a hand-edited summary.json holds anything)."""
    return f'<td class="n">{esc(text)}</td>'


def _pct(value) -> str:
    value = number(value)
    return "-" if value is None else f"{100 * value:.2f}%"


def _attr(value) -> str:
    """A figure for a data-* attribute: its repr, "" when missing."""
    return "" if value is None else repr(value)


def _shown(value) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    return str(datetime.timedelta(seconds=seconds))
