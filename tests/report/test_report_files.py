"""tfgpu-report's reading and writing without TensorFlow: metrics.jsonl cut anywhere, and
names with HTML in them (class names, run folders) on the page as text. The page itself, in
a real browser, is tests/report/test_report.py's."""

import html.parser
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tfgpu.report.runs import Run, read_metrics, read_run

ROWS = [
    {"step": 10, "split": "train", "loss": 2.3, "accuracy": 0.1, "learning_rate": 1e-3,
     "images_per_sec": 90.5, "input_wait_fraction": 0.01, "seconds": 3.5},
    {"step": 20, "split": "train", "loss": 2.1, "accuracy": 0.2, "learning_rate": 2e-3,
     "images_per_sec": 380.0, "input_wait_fraction": 0.02, "seconds": 0.8,
     "evaluation_seconds": 0.0, "checkpoint_seconds": 0.1},
    {"top1": 0.36, "top5": 0.83, "loss": 1.9, "num_examples": 359, "seconds": 1.2,
     "step": 20, "split": "validation"},
]  # fmt: skip
WHOLE = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(0, len(WHOLE)))
def test_metrics_cut_anywhere_give_the_whole_rows_and_say_the_cut(tmp_path, cut):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(WHOLE[:cut])
    notes = []
    rows = read_metrics(str(path), notes)
    ends = [i + 1 for i, b in enumerate(WHOLE) if b == ord("\n")]
    whole = sum(1 for e in ends if e <= cut)
    tail = WHOLE[(ends[whole - 1] if whole else 0) : cut]
    complete_tail = tail and tail.strip() and _parses(tail)  # a line whole but for its newline
    assert rows == ROWS[: whole + (1 if complete_tail else 0)]
    assert bool(notes) == bool(tail.strip() and not complete_tail)


def _parses(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


@pytest.mark.fast
def test_lines_that_are_not_rows_are_left_out_and_named(tmp_path):
    lines = [json.dumps(ROWS[0]), "[1, 2]", '{"step": "x"}', "\xff not json", json.dumps(ROWS[2])]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="latin-1")
    (tmp_path / "config.json").write_text("{not json")
    run = read_run(str(tmp_path))
    assert run.train == [ROWS[0]] and run.evals == [ROWS[2]] and run.config == {}
    said = " | ".join(run.notes)
    assert "line(s) 2, 3, 4 are not rows" in said and "config.json is not readable JSON" in said
    assert "no summary.json" in said


class _Collect(html.parser.HTMLParser):
    """Tags, the text of <td> cells and the data-class attributes of a page."""

    def __init__(self):
        super().__init__()
        self.tags, self.classes, self.cells, self._in_td = set(), [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self._in_td = tag == "td"
        self.cells.append("") if tag == "td" else None
        found = dict(attrs).get("data-class")
        if found is not None:
            self.classes.append(found)

    def handle_endtag(self, tag):
        self._in_td = False if tag == "td" else self._in_td

    def handle_data(self, data):
        if self._in_td:
            self.cells[-1] += data


HTML_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b",
             "section", "table", "tr", "th", "td", "ul", "li", "code", "div", "figure",
             "figcaption", "img", "br", "span", "footer"}  # fmt: skip
names = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)


@pytest.mark.slow  # each page draws its six charts: ~1 CPU-s an example
@pytest.mark.requires("matplotlib")  # the [report] extra (make test installs it)
@settings(max_examples=3, deadline=None)
@example(classes=['<script>alert("x")</script>', "a & b <i>i</i>", "</td></tr>"], run_name="<b")
@given(classes=st.lists(names, min_size=2, max_size=3, unique=True), run_name=names)
def test_names_with_html_in_them_are_text_on_the_page(classes, run_name):
    """Whatever the class and run names hold, the page parses back to the same names as text
    and attributes, with no element they would have made (SVG's own aside)."""
    run = Run(path="/r", name=run_name, config={"model": run_name}, train=ROWS[:2], evals=[ROWS[2]])
    k = len(classes)
    evaluation = {
        "checkpoint": f"/r/{run_name}",
        "step": 20,
        "split": "validation",
        "class_names": classes,
        "confusion_matrix": [[3 if r == c else 1 for c in range(k)] for r in range(k)],
        "per_class_accuracy": [3 / (k + 2)] * k,
        "num_examples": k * (k + 2),
        "top1": 3 / (k + 2),
        "unreadable": 0,
        "gallery": [{"name": run_name, "true": 0, "pred": 1, "prob": 0.9, "true_prob": 0.05,
                     "png": b"\x89PNG"}],
    }  # fmt: skip
    from tfgpu.report import page  # matplotlib: after the requires mark

    text = page.render([run], [evaluation], {"gallery": 1})
    parsed = _Collect()
    parsed.feed(
        text.split("<svg", 1)[0] + "".join(p.split("</svg>", 1)[1] for p in text.split("<svg")[1:])
    )
    assert parsed.tags <= HTML_TAGS, parsed.tags - HTML_TAGS
    assert sorted(parsed.classes) == sorted(classes)
    for name in classes:
        assert name in parsed.cells
