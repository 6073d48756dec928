"""A run's folder and its results, read as a stranger's: a restart with --model_dir alone
resumes with the run's own settings, a flag that contradicts its checkpoints is one line, a
folder that is not a tfgpu run is never written, config.json is read back only as settings of
the right types, and evaluate and predict never lose or misplace a result (hostile --output,
names that are not UTF-8, spreadsheet formulas, paths another run's config.json names)."""

import csv
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outcomes import expects, outcome

from conftest import cli_flags
from tfgpu.config import SETTINGS, Config, config_from
from tfgpu.config.rundir import (
    MAY_CHANGE,
    may_change,
    read_run,
    restart_values,
    stored_settings,
)
from tfgpu.errors import ConfigError, DataError, TfgpuError, UsageError
from tfgpu.files import check_output, open_append, replacing, write_json
from tfgpu.inference.predict import csv_cell, csv_text

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = dict(
    model="tiny_cnn",
    image_size=32,
    global_batch_size=16,
    train_steps=4,
    optimizer="adam",
    learning_rate=0.003,
    weight_decay=0.0,
    steps_per_loop=2,
    log_every_steps=2,
    eval_every_steps=2,
    input_probe_s=0.0,
    export=False,
)


def _main(*flags):
    return subprocess.run(
        [sys.executable, "-m", "tfgpu.main", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _error_lines(err: str, prog: str = "tfgpu") -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]


def _trained(*flags) -> tuple:
    """What tfgpu-train does with ``flags``, in this process (the two tests below start the
    command itself): parsed into a fresh set of its flags, made the run's Config as the command
    makes it (``make_config``: a --model_dir that holds a run gives its settings), trained.
    Returns (the Config, the run's summary)."""
    from absl import flags as absl_flags

    from tfgpu import train
    from tfgpu.cli.flags import define_flags
    from tfgpu.cli.train import make_config

    values = absl_flags.FlagValues()
    define_flags(values)
    argv = ["tfgpu", *flags]
    values(argv)
    config = make_config(values, argv)
    return config, train.run(config)


@pytest.fixture(scope="module")
def tiny_run(small_dataset, tmp_path_factory):
    """One tiny_cnn run of 4 updates, made from flags as a user's, shared by the module."""
    model_dir = str(tmp_path_factory.mktemp("tiny") / "run")
    _trained(*cli_flags(RUN, data_dir=small_dataset, model_dir=model_dir))
    return model_dir


# --- restarting a run ------------------------------------------------------------------


def test_a_restart_with_model_dir_alone_resumes_with_the_runs_own_settings(tiny_run, capsys):
    before = json.load(open(os.path.join(tiny_run, "config.json")))
    capsys.readouterr()
    config, summary = _trained(f"--model_dir={tiny_run}")  # the demo's defaults differ
    out = capsys.readouterr()
    assert "resumed from" in out.out and "ckpt-4 at step 4" in out.out
    assert "damaged" not in out.err and "does not read back" not in out.err
    after = json.load(open(os.path.join(tiny_run, "config.json")))
    for name in ("model", "data_dir", "image_size", "global_batch_size", "train_steps"):
        assert after[name] == before[name], name
    assert config.flat()["model"] == "tiny_cnn" and summary["steps"] == 4


def test_a_flag_that_contradicts_the_checkpoints_is_one_line(tiny_run):
    before = open(os.path.join(tiny_run, "config.json")).read()
    out = _main(f"--model_dir={tiny_run}", "--model=resnet18", "--train_steps=9")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = _error_lines(out.stderr)
    assert "--model=resnet18" in line and "--model=tiny_cnn" in line and tiny_run in line
    assert open(os.path.join(tiny_run, "config.json")).read() == before


def test_a_folder_that_is_not_a_tfgpu_run_is_refused_untouched(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "config.json").write_text('{"name": "another tool"}')
    out = _main(f"--model_dir={tmp_path}", "--synthetic_data", "--num_classes=4")
    assert out.returncode == 2
    (line,) = _error_lines(out.stderr)
    assert "not a tfgpu run's" in line
    assert sorted(os.listdir(tmp_path)) == ["config.json", "notes.txt"]
    assert (tmp_path / "config.json").read_text() == '{"name": "another tool"}'


def test_checkpoints_of_another_model_are_not_called_damaged(tiny_run, small_dataset, tmp_path):
    # Without its config.json, a restart with other flags reaches the checkpoints: they read
    # back whole, and the line says they were made with other settings, not that they broke.
    from tfgpu import train
    from tfgpu.config import validate

    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy, ignore=shutil.ignore_patterns("config.json"))
    values = dict(RUN, optimizer="sgd", train_steps=6)  # sgd: other slots than adam's
    config = validate(config_from(data_dir=small_dataset, model_dir=str(copy), **values))
    with pytest.raises(TfgpuError) as caught:
        train.run(config)
    message = caught.value.message
    assert "reads back but does not fit" in message and "damaged" not in message


@pytest.mark.fast
def test_restart_values_keep_the_run_and_take_only_what_may_change():
    stored = dict(Config().flat(), model="tiny_cnn", num_classes=4, train_steps=6)
    stored = stored_settings(stored, "config.json")
    given = dict(Config().flat(), model_dir="/runs/r", strategy="mirrored", train_steps=9)
    # --model_dir alone: the run's settings; the spreading section is this command's.
    values = restart_values(stored, given, {"model_dir"}, resuming=True)
    assert values["model"] == "tiny_cnn" and values["num_classes"] == 4
    assert values["train_steps"] == 6 and values["strategy"] == "mirrored"
    # The length of training may change; a setting of the same value may be given again.
    given = dict(given, num_classes=4)
    values = restart_values(stored, given, {"train_steps", "num_classes"}, resuming=True)
    assert values["train_steps"] == 9 and values["num_classes"] == 4
    given = dict(given, model="resnet50")
    with pytest.raises(ConfigError, match=r"--model=resnet50 .* --model=tiny_cnn"):
        restart_values(stored, given, {"model"}, resuming=True, where="/runs/r")
    # No checkpoint yet: nothing to contradict, the flags win.
    assert restart_values(stored, given, {"model"}, resuming=False)["model"] == "resnet50"
    # A setting the run predates takes this command's value.
    del stored["crop_padding"]
    given["crop_padding"] = 2
    assert restart_values(stored, given, set(), resuming=True)["crop_padding"] == 2


@pytest.mark.fast
@settings(max_examples=50, deadline=None)
@given(st.sets(st.sampled_from(sorted(SETTINGS)), max_size=12))
def test_the_same_command_again_resumes_whatever_it_sets(present):
    # The flags of the run's own command, given again: nothing contradicts, and the run's
    # settings come back (but this command's spreading section and --model_dir).
    stored = dict(Config().flat(), model="tiny_cnn", num_classes=4, image_size=32)
    given = dict(stored, model_dir="/elsewhere", strategy="mirrored")
    values = restart_values(stored, given, present, resuming=True)
    assert {k: v for k, v in values.items() if k not in ("model_dir", "strategy")} == {
        k: v for k, v in stored.items() if k not in ("model_dir", "strategy")
    }
    assert values["model_dir"] == "/elsewhere" and values["strategy"] == "mirrored"


@pytest.mark.fast
def test_what_a_restart_may_change_is_settings_and_documented():
    assert set(MAY_CHANGE) <= set(SETTINGS)
    assert not {"model", "num_classes", "image_size", "optimizer", "seed"} & set(MAY_CHANGE)
    page = (ROOT / "docs" / "faults.md").read_text(encoding="utf-8")
    section = page.split("## Starting a run again", 1)[1].split("\n## ", 1)[0]
    listed = {n for n, s in SETTINGS.items() if may_change(n) and s.section != "dist"}
    missing = [n for n in sorted(listed - {"model_dir"}) if f"`--{n}`" not in section]
    assert not missing, f"docs/faults.md, Starting a run again, does not name {missing}"


@pytest.mark.fast
def test_read_run_tells_a_run_from_other_folders(tmp_path):
    assert read_run(str(tmp_path / "new")) is None
    assert read_run(str(tmp_path)) is None  # empty
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / ".tfgpu.lock").write_text("")
    assert read_run(str(tmp_path)) is None  # only tfgpu's own files
    (tmp_path / "photo.jpg").write_bytes(b"")
    with pytest.raises(ConfigError, match="photo.jpg"):
        read_run(str(tmp_path))
    write_json(str(tmp_path / "config.json"), dict(Config().flat(), model="tiny_cnn"))
    assert read_run(str(tmp_path))["model"] == "tiny_cnn"
    with pytest.raises(ConfigError, match="not a folder"):
        read_run(str(tmp_path / "photo.jpg"))


# Every JSON value: what a config.json from elsewhere may hold.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
SOME_KEYS = st.sampled_from([*list(SETTINGS)[:40], "num_replicas", "no_such_setting"])


# What a run of this version wrote: some settings, each with its own type's value.
WRITTEN = st.lists(st.sampled_from(list(SETTINGS)[:40]), max_size=6).map(
    lambda names: {n: SETTINGS[n].default for n in names}
)


@pytest.mark.fast
@expects("read", "refused")
@settings(max_examples=100, deadline=None)
@given(st.dictionaries(SOME_KEYS, JSON, max_size=6) | WRITTEN)
def test_a_config_json_reads_back_as_typed_settings_or_one_line(values):
    try:
        out = stored_settings(values, "run/config.json")
    except ConfigError as err:
        assert "\n" not in err.message and err.message.startswith("run/config.json: ")
        outcome("refused")
        return
    outcome("read")
    for key, value in out.items():
        assert type(value) is type(SETTINGS[key].default) or key == "dct_scaled_decode"
    config_from(**out)  # every value a Config takes


@pytest.mark.fast
@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(["tiny_cnn", "resnet18"]),
    st.integers(1, 4096),
    st.floats(1e-6, 10.0),
    st.text(max_size=12).filter(lambda s: "\0" not in s),
)
def test_config_json_round_trips(model, batch, rate, path):
    config = config_from(
        model=model, global_batch_size=batch, learning_rate=rate, eval_snapshot_dir=path
    )
    text = json.dumps(config.flat(), ensure_ascii=False)
    assert config_from(**stored_settings(json.loads(text), "config.json")) == config


# --- results: --output, names, formulas --------------------------------------------------


@pytest.mark.fast
def test_hostile_outputs_are_one_line_before_any_work(tmp_path):
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        check_output(str(tmp_path / "a-folder"))
    with pytest.raises(UsageError, match="no folder"):
        check_output(str(tmp_path / "missing" / "out.csv"))
    # A folder that takes no new file: read-only for a user; root writes anywhere but /sys.
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    folder = "/sys" if os.geteuid() == 0 else str(read_only)
    with pytest.raises(UsageError, match="takes no new file"):
        check_output(os.path.join(folder, "out.csv"))
    assert check_output(str(tmp_path / "out.csv")) == str(tmp_path / "out.csv")
    assert sorted(os.listdir(tmp_path)) == ["a-folder", "ro"]  # the probe left nothing
    (tmp_path / "link").symlink_to(tmp_path / "a-folder")  # a symlink is replaced, not entered
    assert check_output(str(tmp_path / "link")) == str(tmp_path / "link")


@pytest.mark.fast
@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_a_bad_output_stops_the_command_before_anything_is_loaded(
    command, tmp_path, monkeypatch, capsys
):
    from tfgpu.cli import evaluate, head, predict
    from tfgpu.cli.app import run_command

    def load(*args, **kwargs):
        raise AssertionError("loaded before --output was checked")

    monkeypatch.setattr(head, "open_run", load)
    output = str(tmp_path / "missing" / "out")
    if command == "predict":
        code = run_command(lambda: predict.predict([str(tmp_path)], "run", output=output))
    else:
        code = run_command(lambda: evaluate.evaluate("run", output=output))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--output=" in line and "no folder" in line


@pytest.mark.fast
def test_a_result_replaces_a_symlink_and_never_writes_its_target(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "out.csv"
    link.symlink_to(target)
    with replacing(str(link)) as f:
        f.write(b"result")
    assert not link.is_symlink() and link.read_bytes() == b"result"
    assert target.read_text() == "keep me"
    with pytest.raises(RuntimeError), replacing(str(link)) as f:  # a failure: nothing lost
        f.write(b"half")
        raise RuntimeError
    assert link.read_bytes() == b"result" and sorted(os.listdir(tmp_path)) == [
        "out.csv",
        "precious.txt",
    ]
    # Appends (metrics.jsonl, summary.csv) never follow a symlink either.
    metrics = tmp_path / "metrics.jsonl"
    metrics.symlink_to(target)
    warnings = []
    with open_append(str(metrics), warnings.append) as f:
        f.write("{}\n")
    assert metrics.read_text() == "{}\n" and target.read_text() == "keep me"
    assert "was a symlink" in warnings[0]
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):
        open_append(str(tmp_path / "fifo"))  # and never hangs on a FIFO
    with pytest.raises(OSError, match="not a regular file"):
        open_append(os.devnull)


def _writer_rows(model_dir) -> tuple[list, list]:
    """((step, split) of every metrics.jsonl record, step of every summary.csv row)."""
    with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
        metrics = [(r["step"], r["split"]) for r in map(json.loads, f)]
    with open(os.path.join(model_dir, "summary.csv"), encoding="utf-8", newline="") as f:
        summary = [int(row["step"]) for row in csv.DictReader(f)]
    return metrics, summary


EVALUATION = {"top1": 0.5, "top5": 1.0, "loss": 1.0, "num_examples": 4}


def _log(writer, step: int, evaluate: bool) -> None:
    """A train window closed at ``step``, and an evaluation of it when ``evaluate``."""
    record = {"step": step, "split": "train", "loss": 1.0, "accuracy": 0.5, "learning_rate": 0.1}
    writer.log_train(dict(record, images_per_sec=10.0), 100, 8)
    if evaluate:
        writer.log_eval(step, EVALUATION, {"epoch": 1.0})


@pytest.mark.fast
@settings(deadline=None, max_examples=12)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=12, unique=True).map(sorted),
    st.integers(0, 45),
    st.sampled_from(["", '{"step": 1', "1,0.5,"]),
)
def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint_and_no_torn_line(steps, restored, torn):
    """What a run killed after its checkpoint of ``restored`` had logged ``steps`` (every
    third evaluated), a write torn by the kill at the end of either file: the resumed run
    finds each row of a step up to ``restored`` once, whole, in order, and nothing after."""
    import tempfile

    from tfgpu.results.writer import RunWriter

    with tempfile.TemporaryDirectory() as model_dir:
        writer = RunWriter(model_dir, is_chief=True)
        for i, step in enumerate(steps):
            _log(writer, step, evaluate=i % 3 == 0)
        name = "summary.csv" if torn.startswith("1,") else "metrics.jsonl"
        with open(os.path.join(model_dir, name), "a", encoding="utf-8") as f:
            f.write(torn)
        RunWriter(model_dir, is_chief=True).resume(restored)
        metrics, summary = _writer_rows(model_dir)
        expected = [(s, "train") for s in steps if s <= restored]
        evaluated = [s for i, s in enumerate(steps) if i % 3 == 0 and s <= restored]
        assert [m for m in metrics if m[1] == "train"] == expected
        assert [m[0] for m in metrics if m[1] == "validation"] == evaluated == summary


@pytest.mark.fast
def test_the_final_evaluation_done_again_replaces_its_row(tmp_path):
    """A finished run started again (or one that stopped early at an evaluation) evaluates its
    last step again: one row of it, the newest."""
    from tfgpu.results.writer import RunWriter

    writer = RunWriter(str(tmp_path), is_chief=True)
    _log(writer, 4, evaluate=True)
    _log(writer, 8, evaluate=True)
    writer.resume(8)
    writer.log_eval(8, dict(EVALUATION, top1=0.75), {"epoch": 1.0}, again=True)
    metrics, summary = _writer_rows(tmp_path)
    assert metrics == [(4, "train"), (4, "validation"), (8, "train"), (8, "validation")]
    assert summary == [4, 8]
    with open(tmp_path / "summary.csv", encoding="utf-8", newline="") as f:
        assert [row["top1"] for row in csv.DictReader(f)] == ["0.5", "0.75"]


@pytest.mark.fast
def test_the_test_only_pause_tears_a_row_at_the_nth_write_and_is_off_by_default(
    tmp_path, monkeypatch, capfd
):
    from tfgpu import files

    path = str(tmp_path / "metrics.jsonl")
    monkeypatch.setattr(files, "_pauses_seen", {})
    for line in ("one\n", "two\n"):
        with open_append(path) as f:
            files.append_text(f, line, "metrics.jsonl")  # unset: a plain write
    monkeypatch.setenv(files.TEST_PAUSE_ENV, "metrics.jsonl@2")
    monkeypatch.setenv("TFGPU_TEST_PAUSE_S", "0")
    halves = []
    monkeypatch.setattr(files, "_pause", lambda point: halves.append(open(path).read()))
    for line in ("three\n", "four\n"):
        with open_append(path) as f:
            files.append_text(f, line, "metrics.jsonl")
    assert halves == ["one\ntwo\nthree\nfo"]  # the second write, torn where the kill lands
    assert open(path).read() == "one\ntwo\nthree\nfour\n"
    files.pause_for_tests("checkpoint")  # another point: nothing
    assert halves == ["one\ntwo\nthree\nfo"]


@pytest.mark.fast
def test_json_results_keep_file_names_that_are_not_utf8(tmp_path):
    name = os.fsdecode(b"/runs/caf\xe9/ckpt-4")  # a latin-1 folder name
    write_json(str(tmp_path / "eval.json"), {"checkpoint": name})
    data = (tmp_path / "eval.json").read_bytes()
    data.decode("utf-8")  # the file is UTF-8 (the byte as its \\udcXX escape)
    assert os.fsencode(json.loads(data)["checkpoint"]) == b"/runs/caf\xe9/ckpt-4"


@pytest.mark.fast
@given(st.text(max_size=12))
def test_a_guarded_cell_is_never_a_formula_and_gives_its_text_back(text):
    cell = csv_cell(text)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert (cell[1:] if cell.startswith("'") else cell) == text


@pytest.mark.fast
@settings(deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=10), min_size=1, max_size=4))
def test_file_names_that_are_not_utf8_survive_the_csv(names):
    paths = [os.fsdecode(b"/d/" + n.replace(b"/", b"_").replace(b"\0", b"_")) for n in names]
    rows = [{"path": p, "top": [("=SUM(A1)", 0.5)], "error": ""} for p in paths]
    data = csv_text(rows, 1).encode("utf-8", "surrogateescape")
    text = data.decode("utf-8", "surrogateescape")
    read = list(csv.reader(io.StringIO(text, newline="")))[1:]
    assert [os.fsencode(r[0]) for r in read] == [os.fsencode(p) for p in paths]
    assert all(r[1] == "'=SUM(A1)" for r in read)


def test_predict_writes_names_and_formulas_safely_through_a_symlink(tiny_run, tmp_path, capsys):
    from PIL import Image

    from conftest import make_image_arrays
    from tfgpu.cli.predict import predict

    folder = tmp_path / "images"
    folder.mkdir()
    image = make_image_arrays(1, size=40)[0][0]
    names = [b"caf\xe9.jpg", b"=HYPERLINK(1).jpg", b"plain.jpg"]  # latin-1, a formula, plain
    for name in names:
        Image.fromarray(image).save(os.path.join(os.fsencode(folder), name), format="JPEG")
    target = tmp_path / "someone-elses.csv"
    target.write_text("keep me")
    out = tmp_path / "predictions.csv"
    out.symlink_to(target)
    predict([str(folder)], model_dir=tiny_run, output=str(out), top_k=2)
    assert not out.is_symlink() and target.read_text() == "keep me"
    with open(out, encoding="utf-8", errors="surrogateescape", newline="") as f:
        rows = list(csv.reader(f))[1:]
    paths = [r[0][1:] if r[0].startswith("'") else r[0] for r in rows]
    assert sorted(os.path.basename(os.fsencode(p)) for p in paths) == sorted(names)
    assert all(not r[-1] and r[1] in "abcd" for r in rows)
    assert "predicted 3 image(s)" in capsys.readouterr().out


def test_evaluate_writes_nowhere_a_foreign_config_names(tiny_run, small_dataset, tmp_path):
    from tfgpu.cli.evaluate import evaluate

    # A run folder from elsewhere whose config.json names a snapshot folder: evaluate writes
    # only what it is told to (its --output, whole, through a temporary file).
    run = tmp_path / "their-run"
    shutil.copytree(tiny_run, run)
    elsewhere = tmp_path / "elsewhere"
    config = json.load(open(run / "config.json"))
    write_json(str(run / "config.json"), dict(config, eval_snapshot_dir=str(elsewhere)))
    out = tmp_path / "eval.json"
    result = evaluate(str(run), output=str(out), log=lambda _: None)
    assert not elsewhere.exists() and result["class_names"] == ["a", "b", "c", "d"]
    assert json.load(open(out))["num_examples"] == 24
    assert sorted(os.listdir(tmp_path)) == ["eval.json", "their-run"]
    # Class names that are no names: one line before anything is evaluated.
    data = tmp_path / "their-data"
    shutil.copytree(small_dataset, data)
    info = json.load(open(data / "dataset_info.json"))
    write_json(str(data / "dataset_info.json"), dict(info, class_names=[None, "b", "c", "d"]))
    lines = []
    with pytest.raises(UsageError, match="class_names"):
        evaluate(str(run), data_dir=str(data), log=lines.append)
    assert lines == []


@pytest.mark.fast
def test_class_names_that_are_numbers_stand_as_text(monkeypatch):
    from tfgpu.data import spec
    from tfgpu.inference import opened

    fake = type("Spec", (), {"data_dir": "/data"})()
    monkeypatch.setattr(spec, "class_names", lambda _: [7, 2.5, "cat"])
    assert opened.class_names(fake) == ["7", "2.5", "cat"]
    monkeypatch.setattr(spec, "class_names", lambda _: ["cat", ["x"]])
    with pytest.raises(DataError, match=r"class_names\[1\]=\['x'\] is not a name"):
        opened.class_names(fake)
