"""--dtype=auto: bfloat16 where the devices compute it fast (distribute/devices.py), float32
elsewhere; resolved once per run (config.resolve), kept in config.json, and kept by a resume on
any machine (the CLI's restart settings and train.run alike)."""

import json
from types import SimpleNamespace

import keras
import pytest
from conftest import TINY_RUN

from tfgpu import train
from tfgpu.config import config_from, resolve, rundir, validate
from tfgpu.distribute import devices


def _fake_tf_config(capabilities):
    """A stand-in for tf.config with one GPU per compute capability given."""
    gpus = [f"gpu{i}" for i in range(len(capabilities))]
    details = dict(zip(gpus, capabilities))
    return SimpleNamespace(
        list_physical_devices=lambda kind: gpus if kind == "GPU" else [],
        experimental=SimpleNamespace(
            get_device_details=lambda g: {"compute_capability": details[g]} if details[g] else {}
        ),
    )


@pytest.mark.fast
@pytest.mark.parametrize(
    "capabilities, flags, expected",
    [
        ([], {"avx512f", "avx512_bf16"}, "CPU with AVX512_BF16"),
        ([], {"avx512_bf16", "amx_bf16", "amx_tile"}, "CPU with AVX512_BF16 and AMX"),
        ([], {"avx512f", "avx2"}, ""),
        ([(8, 0), (9, 0)], set(), "GPU of compute capability 8.0"),
        ([(8, 6), (7, 5)], {"avx512_bf16"}, ""),  # one older GPU: float32; the CPU not asked
        ([None], {"avx512_bf16"}, ""),  # a GPU that does not say
    ],
)
def test_fast_bfloat16_names_the_unit(capabilities, flags, expected):
    assert devices.fast_bfloat16(_fake_tf_config(capabilities), flags) == expected


@pytest.mark.fast
def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx512f avx512_bf16\n\n")
    assert devices.cpu_flags(str(info)) == {"fpu", "avx512f", "avx512_bf16"}
    assert devices.cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.fast
@pytest.mark.parametrize(
    "bfloat16, stored, expected",
    [
        ("CPU with AVX512_BF16", None, "mixed_bfloat16"),
        ("", None, "float32"),
        ("", {"dtype": "mixed_bfloat16"}, "mixed_bfloat16"),  # resumed elsewhere: the run's
        ("GPU of compute capability 8.0", {"dtype": "float32"}, "float32"),
    ],
)
def test_resolve_auto(bfloat16, stored, expected):
    config = validate(config_from(dtype="auto"))
    assert resolve(config, False, bfloat16, stored).model.dtype == expected
    fixed = config.with_settings(dtype="float64")  # a dtype given is never changed
    assert resolve(fixed, False, bfloat16, stored).model.dtype == "float64"


@pytest.mark.fast
def test_a_restart_given_auto_keeps_the_runs_choice():
    given = config_from(dtype="auto").flat()
    stored = dict(given, dtype="mixed_bfloat16")
    values = rundir.restart_values(stored, given, {"dtype"}, resuming=True, where="run")
    assert values["dtype"] == "mixed_bfloat16"
    with pytest.raises(Exception, match="--dtype=float32 contradicts"):
        rundir.restart_values(stored, dict(given, dtype="float32"), {"dtype"}, True, "run")


SMALL = {"image_size": 16, "steps_per_loop": 2, "log_every_steps": 2}


def _run(data_dir, model_dir, **settings):
    lines = []
    config = config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(TINY_RUN, **settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tfgpu.results.writer.RunWriter.info", lambda self, line: lines.append(line))
        try:
            train.run(validate(config))
        finally:  # the run sets Keras' global policy: later tests build in float32
            keras.mixed_precision.set_global_policy("float32")
    with open(model_dir / "config.json", encoding="utf-8") as f:
        return lines, json.load(f)["dtype"]


# Two runs of tiny_cnn on 16x16 crops, 2 updates then 2 more: the choice and its resume are
# the claim, not what the model learns.
@pytest.mark.slow
def test_a_run_says_and_stores_its_choice_and_a_resume_elsewhere_keeps_it(
    small_dataset, tmp_path, monkeypatch
):
    monkeypatch.setattr(devices, "fast_bfloat16", lambda: "CPU with AVX512_BF16")
    lines, stored = _run(small_dataset, tmp_path, dtype="auto", train_steps=2, **SMALL)
    assert stored == "mixed_bfloat16"
    assert (
        "--dtype=auto: mixed_bfloat16 (this CPU with AVX512_BF16 computes bfloat16 fast)" in lines
    )
    monkeypatch.setattr(devices, "fast_bfloat16", lambda: "")  # another machine
    lines, stored = _run(small_dataset, tmp_path, dtype="auto", train_steps=4, **SMALL)
    assert stored == "mixed_bfloat16"
    assert "--dtype=auto: mixed_bfloat16, the run's own choice (config.json)" in lines
    assert any(line.startswith("resumed from") for line in lines)
