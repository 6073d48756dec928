"""tfgpu-report end to end: real runs (tiny_cnn, a few updates, on a dataset whose class names
are HTML), one finished, one with another learning rate, one still "running" with its last
metrics line cut, one whose data went away; the page made by ``python -m tfgpu.report`` and
opened in a real headless Chromium (tests/browser.py): no error, a screenshot that is not
blank, and its figures equal to what metrics.jsonl and summary.json hold."""

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_RUN, make_image_arrays
from tfgpu import train
from tfgpu.cli.head import open_run
from tfgpu.config import config_from, validate
from tfgpu.convert import plan
from tfgpu.convert.manifest import items_from_arrays
from tfgpu.report.runs import read_runs

import browser
from requires import requires

requires("matplotlib")  # the [report] extra (make test installs it)

HOSTILE = ['<script>alert("x")</script>', "a & b <i>i</i>", "\"q\" 'r' $x$", "</td></tr><p>"]


def _rows(model_dir):
    """(train rows, evaluation rows) of metrics.jsonl, whole lines only (read here, plainly)."""
    with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n")[:-1]]
    rows = [json.loads(line) for line in lines]
    return [r for r in rows if r["split"] == "train"], [r for r in rows if r["split"] != "train"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """{"runs": {name: folder}, "html": the page, "out": the lines the command prints}."""
    root = tmp_path_factory.mktemp("report")
    data = str(root / "data")
    images, labels = make_image_arrays(120)
    items = items_from_arrays(images, labels, prefix="img")
    plan.write_dataset(
        {"train": items[:96], "validation": items[96:]},
        class_names=HOSTILE,
        output_dir=data,
        source="tests",
        num_shards={"train": 2, "validation": 1},
    )
    runs = {}
    for name, lr in (("fast", 0.05), ("slow", 0.01)):
        runs[name] = str(root / name)
        settings = dict(TINY_RUN, learning_rate=lr, eval_every_steps=3, checkpoint_every_steps=3)
        settings["image_size"] = 16  # not the claim: ~25 ms of CPU an update, not ~65
        config = config_from(strategy="default", data_dir=data, model_dir=runs[name], **settings)
        train.run(validate(config))
    # Still running: no summary.json yet, its newest line half written.
    runs["running"] = str(root / "running")
    shutil.copytree(runs["slow"], runs["running"])
    os.remove(os.path.join(runs["running"], "summary.json"))
    with open(os.path.join(runs["running"], "metrics.jsonl"), "a", encoding="utf-8") as f:
        f.write('{"step": 9, "split": "train", "loss": 0.5, "accur')
    # Its data moved away since it trained.
    runs["moved"] = str(root / "moved")
    shutil.copytree(runs["fast"], runs["moved"])
    config_file = os.path.join(runs["moved"], "config.json")
    with open(config_file, encoding="utf-8") as f:
        values = json.load(f)
    values["data_dir"] = str(root / "gone")
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(values, f)
    # The command's work in this process (its defaults, --gallery=4): the page is the claim,
    # not the process; test_bad_run_folders_are_one_line starts `python -m tfgpu.report`.
    from tfgpu.report.write import write_report  # noqa: PLC0415 (matplotlib: required above)

    output, lines = str(root / "report.html"), []
    write_report(
        read_runs(list(runs.values())), output, gallery=4, log=lines.append, open_run=open_run
    )
    with open(output, encoding="utf-8") as f:
        html = f.read()
    return {"runs": runs, "html": html, "path": output, "out": "\n".join(lines)}


JS = {
    "runs": """[...document.querySelectorAll('tr.run')].map(r => ({...r.dataset}))""",
    "charts": """Object.fromEntries([...document.querySelectorAll('figure[data-chart]')]
                 .map(f => [f.dataset.chart, +f.dataset.points]))""",
    # Vertices of each drawn line: matplotlib's path, one M/L per point (no simplification).
    "lines": """Object.fromEntries([...document.querySelectorAll('g[id^="loss-"], g[id^="top1-"]')]
                 .map(g => [g.id, (g.querySelector('path').getAttribute('d')
                                   .match(/[ML]/g) || []).length]))""",
    "classes": """[...document.querySelectorAll('#evaluation-0 tr.class')]
                  .map(r => [r.dataset.class, r.cells[0].textContent])""",
    "eval_top1": """[...document.querySelectorAll('[data-eval-top1]')]
                    .map(b => +b.dataset.evalTop1)""",
    "mistakes": """[...document.querySelectorAll('#evaluation-0 figure.mistake img')]
                   .map(i => i.naturalWidth)""",
    "scripts": "document.scripts.length + document.querySelectorAll('i').length",
    "text": "document.body.innerText",
    "time_total": """Object.fromEntries([...document.querySelectorAll('#time tr[data-run]')]
                     .map(r => [r.dataset.run, +r.dataset.totalS]))""",
}


@pytest.fixture(scope="module")
def page(report):
    requires("chromium")
    return browser.open_page(report["path"], JS)


def test_the_page_renders_in_chromium_with_no_error_and_is_not_blank(page):
    assert page["errors"] == []
    shot = np.asarray(Image.open(io.BytesIO(page["png"])).convert("L"))
    assert shot.shape == (900, 1280)
    # Text, tables and charts: many pixels far from the white background, in many shades.
    assert (shot < 128).mean() > 0.01 and len(np.unique(shot)) > 50


def test_the_pages_figures_are_those_of_metrics_jsonl_and_summary_json(report, page):
    shown = {r["run"]: r for r in page["runs"]}
    assert sorted(shown) == sorted(report["runs"])
    points = 0
    for i, (name, folder) in enumerate(report["runs"].items()):
        trains, evals = _rows(folder)
        row = shown[name]
        assert int(row["trainRows"]) == len(trains) == 2 and int(row["evalRows"]) == len(evals)
        assert int(row["lastStep"]) == 6
        best = max(evals, key=lambda r: r["top1"])
        assert int(row["bestStep"]) == best["step"]
        summary_file = os.path.join(folder, "summary.json")
        if os.path.exists(summary_file):
            with open(summary_file, encoding="utf-8") as f:
                final = json.load(f)["final_eval"]
        else:  # the run still going: its newest evaluation
            final = evals[-1]
        assert float(row["finalTop1"]) == final["top1"] and float(row["finalTop5"]) == final["top5"]
        # Every logged row is a vertex of its line.
        assert page["lines"][f"loss-{i}-train"] == len(trains)
        assert page["lines"][f"loss-{i}-eval"] == len(evals)
        assert page["lines"][f"top1-{i}-eval"] == len(evals)
        points += len(trains)
    assert page["charts"]["lr"] == page["charts"]["ips"] == points


def test_the_reports_evaluation_reproduces_the_runs_own(report, page):
    """Through the evaluation pipeline, the final checkpoint's top-1 on the page is the
    run's final evaluation (no TTA either way); the moved run has none, and says why."""
    finals = []
    for name in ("fast", "slow", "running"):
        _, evals = _rows(report["runs"][name])
        finals.append(evals[-1]["top1"])
    assert page["eval_top1"] == pytest.approx(finals, abs=1e-6)
    moved = page["text"].split("Evaluation: moved", 1)[1].lstrip().split("\n")[0]
    assert moved.startswith("No evaluation: --data_dir=") and "gone is not a directory" in moved
    assert page["mistakes"] and all(w > 0 for w in page["mistakes"])


def test_hostile_class_names_are_shown_as_text(page, report):
    assert page["scripts"] == 0  # no <script>, no <i>, nothing the names would have made
    assert [c for c, _ in page["classes"]] and all(c in HOSTILE for c, _ in page["classes"])
    assert all(attribute == text for attribute, text in page["classes"])
    assert sorted(c for c, _ in page["classes"]) == sorted(HOSTILE)
    assert '<script>alert("x")' not in report["html"]


def test_what_is_missing_is_said(page):
    text = page["text"]
    assert "running: metrics.jsonl: its last line (line 5) is cut short, left out" in text
    assert "no summary.json: the run is still going" in text
    assert "in progress or stopped" in text


def test_bad_run_folders_are_one_line(tmp_path):
    for argv, message in (
        ([], "name one or more run folders"),
        ([str(tmp_path / "nope")], "no such run folder"),
        ([str(tmp_path)], "not a tfgpu run"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "tfgpu.report", *argv, f"--output={tmp_path}/r.html"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and not (tmp_path / "r.html").exists()


def test_each_window_says_where_its_time_went(report, page):
    """The loop's rows: a window's images/s is of its training time, its wall time less the
    evaluation and checkpoint its actions did inside it; each evaluation row has its seconds.
    The page's time table adds up to summary.json's wall time."""
    folder = report["runs"]["fast"]
    trains, evals = _rows(folder)
    batch, previous = TINY_RUN["global_batch_size"], 0
    for row in trains:
        busy = row["seconds"] - row.get("evaluation_seconds", 0) - row.get("checkpoint_seconds", 0)
        images = (row["step"] - previous) * batch
        assert row["images_per_sec"] * busy == pytest.approx(images, rel=1e-6)
        previous = row["step"]
    # Step 3's evaluation and checkpoint ran inside the window that ends at step 6.
    assert trains[1]["evaluation_seconds"] > 0 and trains[1]["checkpoint_seconds"] > 0
    assert "evaluation_seconds" not in trains[0] and all(e["seconds"] > 0 for e in evals)
    assert trains[1]["evaluation_seconds"] == pytest.approx(evals[0]["seconds"], abs=0.05)
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
        wall = json.load(f)["wall_time_s"]
    assert page["time_total"]["fast"] == pytest.approx(wall, abs=1e-3)
