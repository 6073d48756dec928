"""What --mlflow_tracking_uri sends, before any server: the params and metrics made of a run's
settings and rows, the URI's checks, and where the command finds the URI
(tests/e2e/test_mlflow.py runs it against a real server)."""

import pytest
from absl import flags
from hypothesis import given
from hypothesis import strategies as st
from outcomes import expects, outcome
from requires import requires

from tfgpu.cli.flags import define_flags
from tfgpu.cli.train import make_config
from tfgpu.config import ConfigError, config_from, validate
from tfgpu.results import tracking

values = st.one_of(st.text(max_size=2000), st.integers(), st.floats(), st.booleans())


@given(st.dictionaries(st.text(min_size=1, max_size=40), values, max_size=20))
def test_params_are_text_within_mlflows_limit(settings):
    params = tracking.params_of(settings)
    assert params.keys() == settings.keys()
    for key, value in settings.items():
        text = str(value)
        if len(text) <= tracking.PARAM_VALUE_MAX:
            assert params[key] == text
        else:
            assert len(params[key]) == tracking.PARAM_VALUE_MAX
            assert params[key] == text[: tracking.PARAM_VALUE_MAX - 3] + "..."


def test_metrics_are_a_rows_numbers_under_its_split():
    row = {"step": 30, "split": "train", "loss": 0.5, "accuracy": None, "skipped_updates": 0}
    row.update(tta="none", stopped=True, learning_rate=1e-3)
    assert tracking.metrics_of(row, "train") == {
        "train/loss": 0.5,
        "train/skipped_updates": 0.0,
        "train/learning_rate": 1e-3,
    }
    summary = {"steps": 9, "final_eval": {"top1": 0.75, "tta": "none"}, "wall_time_s": 3.5}
    assert tracking.summary_metrics(dict(summary, strategy="default")) == {
        "final/top1": 0.75,
        "summary/wall_time_s": 3.5,
    }


URIS = st.builds(
    "{}://{}{}:{}/{}".format,
    st.sampled_from(["http", "https", "file", "databricks", "sqlite", ""]),
    st.sampled_from(["", "me@", "me:secret@"]),
    st.sampled_from(["mlflow.example.com", "127.0.0.1", "[::1]", ""]),
    st.integers(0, 70000),
    st.text(max_size=12),
)


@expects("taken", "refused")
@given(st.text(max_size=200) | URIS)
def test_any_uri_is_taken_or_refused_in_one_line(uri):
    try:
        validate(config_from(mlflow_tracking_uri=uri))
    except ConfigError as err:
        assert "--mlflow_tracking_uri" in str(err) and "\n" not in str(err)
        outcome("refused")
    else:
        outcome("taken")


def test_a_password_in_the_uri_is_refused():
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_PASSWORD"):
        validate(config_from(mlflow_tracking_uri="https://me:secret@mlflow.example.com"))
    validate(config_from(mlflow_tracking_uri="https://me@mlflow.example.com"))  # no password


@pytest.mark.parametrize("flag", [None, "http://flag:5000"])
def test_the_command_reads_mlflows_environment_when_the_flag_is_empty(flag, tmp_path, monkeypatch):
    requires("mlflow")  # found, not imported: seconds saved
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    parsed = flags.FlagValues()
    define_flags(parsed)
    argv = ["tfgpu", f"--data_dir={tmp_path}", f"--model_dir={tmp_path / 'run'}"]
    parsed(argv + ([f"--mlflow_tracking_uri={flag}"] if flag else []))
    config = make_config(parsed)
    assert config.train.mlflow_tracking_uri == (flag or "http://env:5000")
    assert config.train.mlflow_experiment == "from-env"
