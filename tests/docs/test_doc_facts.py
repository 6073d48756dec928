"""What the README and docs state about the code stays what the code does: the console scripts,
the recipes, the progress line, the summary's final evaluation, the files a run leaves, and
the measured figures a flag's help quotes (taken from bench/README.md, the one place where
figures live)."""

import configparser
import re

import pytest
from doc_commands import PAGES, ROOT

from tfgpu.cli.flags import COMMAND_SETTINGS, settings_of
from tfgpu.config import SETTINGS
from tfgpu.config.rundir import CONFIG_FILE
from tfgpu.data.identity import IDENTITY_FILE
from tfgpu.checkpoint import best
from tfgpu.results import tracking
from tfgpu.results import writer as results
from tfgpu.train import micro_batch

pytestmark = pytest.mark.fast
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_names_every_console_script():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    scripts = {line.split("=")[0].strip() for line in lines}
    sentence = README[README.index("Console scripts:") :].split("\n\n")[0]
    assert scripts == set(re.findall(r"`(tfgpu-[a-z-]+)`", sentence))


def test_the_models_page_names_every_recipe():
    recipes = {p.name for p in (ROOT / "flags").glob("*.flags")}
    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert recipes - set(re.findall(r"`([\w.]+\.flags)`", text)) == set()


def _quoted_progress_lines() -> list:
    lines = []
    for page in PAGES:
        for line in page.read_text(encoding="utf-8").splitlines():
            if re.match(r"^step +\d+/\d+ ", line):
                lines.append((page.name, line))
    return lines


def test_every_quoted_progress_line_is_one_tfgpu_prints():
    """A page's progress line has every part a line has, in the order it has them."""
    record = dict(step=100, loss=0.43, accuracy=0.86, learning_rate=1.8e-3, images_per_sec=1767.0)
    record.update(grad_norm=3.72, weight_norm=22.9, input_wait_fraction=0.02)
    printed = results.format_progress(record, 350, 32)
    heads = re.findall(r"(?:^step|loss|acc|lr|img/s|ETA|\|g\||\|w\|)(?= )", printed)
    assert heads == ["step", "loss", "acc", "lr", "img/s", "ETA", "|g|", "|w|"], printed
    found = _quoted_progress_lines()
    assert len(found) >= 5
    for page, line in found:
        assert re.findall(r"(?:^step|loss|acc|lr|img/s|ETA|\|g\||\|w\|)(?= )", line) == heads, (
            page,
            line,
        )


def test_the_readmes_python_example_prints_the_summarys_final_evaluation():
    shown = re.search(r"`20 1 (\{[^`]*\})`", README).group(1)
    assert re.findall(r"'(\w+)': None", shown) == list(results.final_eval_of({}))


def test_the_run_folder_page_names_every_file_a_run_leaves():
    page = (ROOT / "docs" / "run-folder.md").read_text(encoding="utf-8")
    table = page[page.index("| file | content |") :].split("\n## ")[0]
    named = set(re.findall(r"^\| `([^`]+)`", table, re.M))
    named |= {
        n for cell in re.findall(r"^\| `[^|]*", table, re.M) for n in re.findall(r"`([^`]+)`", cell)
    }
    files = {CONFIG_FILE, IDENTITY_FILE, micro_batch.RECORD, tracking.RUN_FILE, "summary.json"}
    files |= {results.METRICS, results.SUMMARY, best.SIDECAR_FILE, f"best/{best.BEST_FILE}"}
    files |= {"final.weights.h5", "checkpoints/", "tensorboard/", "averaged.weights.h5"}
    assert files - named == set()


FIGURE = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:%|x(?!\w))")  # +12.3%, 0.74x


def _helps() -> list:
    helps = [(s.flag, s.help) for s in SETTINGS.values()]
    for command in COMMAND_SETTINGS:
        helps += [(s.flag, s.help) for s in settings_of(command).values()]
    return helps


def test_a_measured_figure_in_a_flags_help_is_bench_readmes():
    """bench/README.md is where a figure is measured, with its command: a help that quotes one
    points there, and quotes it as it stands there (so a new measurement shows it stale)."""
    bench = (ROOT / "bench" / "README.md").read_text(encoding="utf-8").replace("×", "x")
    quoting = [
        (flag, text, FIGURE.findall(text))
        for flag, text in _helps()
        if re.search(r"\bmeasured\b|bench/", text) and FIGURE.search(text)
    ]
    assert quoting
    for flag, text, figures in quoting:
        assert "bench/README.md" in text, flag
        assert [f for f in figures if f not in bench] == [], flag
