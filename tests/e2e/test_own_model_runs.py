"""A model of one's own trained with tfgpu's guarantees (docs/own-model.md, "What holds"): a
module written into the test's folder (a functional model with BatchNorm, a subclassed one),
a .keras file and a KerasHub ViT from a preset directory, each trained a few updates on the
small dataset: strategies and workers equal one device, accumulation the large batch, a resume
the uninterrupted run to the bit, the frozen backbone frozen, the exports served and checked,
evaluate, predict and the report read the run, and what needs tfgpu's own structure refused
in one line before training."""

import contextlib
import io
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import TINY_RUN, cli_flags, final_weights, run_summary
from own_nets import env_with, write_module
from requires import requires
from weights import assert_same_weights, changed

from tfgpu import models, train
from tfgpu.config import config_from, validate
from tfgpu.errors import ConfigError
from tfgpu.report.runs import read_runs
from tfgpu.cli import head
from tfgpu.cli.evaluate import evaluate
from tfgpu.cli.export import export_run as export
from tfgpu.inference.export import ExportOptions
from tfgpu.cli.predict import predict

SETTINGS = dict(TINY_RUN, image_size=16, sync_batchnorm=True)
ATOL = 1e-5  # the contract's bound: float rounding (docs/training-loop.md)


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def nets(tmp_path_factory):
    """(the folder on the path, the module's name) of the user's model module."""
    folder = tmp_path_factory.mktemp("own")
    return folder, write_module(folder)


def _run(data_dir, model_dir, **values) -> dict:
    """The run's summary; what it printed (its start lines) beside it, in model_dir.out.txt."""
    config = config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(SETTINGS, **values))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return train.run(validate(config))
    finally:
        with open(f"{model_dir}.out.txt", "a", encoding="utf-8") as f:
            f.write(printed.getvalue())


def _lines(model_dir) -> str:
    """What the run printed (its start lines included)."""
    with open(f"{model_dir}.out.txt", encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def functional_default(small_dataset, nets, tmp_path_factory):
    """The functional BatchNorm model's run on one device: (its folder, its final weights)."""
    model_dir = tmp_path_factory.mktemp("functional-default")
    summary = _run(small_dataset, model_dir, model=f"{nets[1]}:functional_bn", strategy="default")
    assert summary["steps"] == 6 and np.isfinite(summary["final_eval"]["loss"])
    return model_dir, final_weights(model_dir)


def _two_processes(prefix, strategy, data_dir, nets, model_dir, reference) -> None:
    """Runs the functional model under ``prefix`` (a launcher's command) as 2 processes that
    import the module from PYTHONPATH, as every worker must; they end with ``reference``'s
    weights (one device), one gradient all-reduce per update."""
    values = dict(SETTINGS, model=f"{nets[1]}:functional_bn", strategy=strategy)
    cmd = [*prefix, *cli_flags(values, data_dir=data_dir, model_dir=model_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env_with(nets[0]))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert_same_weights(model_dir, reference[1], atol=ATOL)
    summary = run_summary(model_dir)
    assert summary["num_replicas"] == 2 and summary["gradient_all_reduces"] == 6


def test_two_workers_equal_one_device_with_sync_batchnorm(
    small_dataset, nets, functional_default, tmp_path
):
    launch = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    strategy = "multi_worker_mirrored"
    _two_processes(launch, strategy, small_dataset, nets, tmp_path, functional_default)


def test_a_resume_equals_the_uninterrupted_run_bit_for_bit(
    small_dataset, nets, functional_default, tmp_path
):
    name = f"{nets[1]}:functional_bn"
    _run(small_dataset, tmp_path, model=name, strategy="default", train_steps=3)
    summary = _run(small_dataset, tmp_path, model=name, strategy="default")
    assert summary["steps"] == 6
    assert_same_weights(tmp_path, functional_default[1])  # exact
    with open(tmp_path / "config.json", encoding="utf-8") as f:
        assert json.load(f)["model"] == name  # what a resume and every worker build


def test_subclassed_mirrored_equals_default_with_ema_and_micro_batch_auto(
    small_dataset, nets, tmp_path
):
    """Its BatchNorm layers, inside plain Layers, are found: synchronized over the replicas,
    their statistics the same everywhere; the EMA too. It has no get_config: the export is
    the SavedModel alone, and says so."""
    values = dict(model=f"{nets[1]}:subclassed", ema_decay=0.9)
    default = _run(small_dataset, tmp_path / "default", strategy="default", export=True, **values)
    # The export is the default run's alone (checked below): the weights are the claim here.
    mirrored = _run(
        small_dataset, tmp_path / "mirrored", strategy="mirrored", micro_batch_size="auto", **values
    )
    assert mirrored["num_replicas"] == 2 and mirrored["grad_accum_steps"] == 1
    assert os.path.exists(tmp_path / "mirrored" / "micro_batch.json")
    assert_same_weights(tmp_path / "mirrored", tmp_path / "default", atol=ATOL)
    assert default["final_eval"]["top1"] == pytest.approx(mirrored["final_eval"]["top1"])
    export_dir = tmp_path / "default" / "export"
    assert (export_dir / "saved_model").is_dir() and not (export_dir / "model.keras").exists()
    assert "no model.keras: Net does not implement get_config" in _lines(tmp_path / "default")


@pytest.fixture(scope="module")
def keras_run(small_dataset, nets, tmp_path_factory):
    """A .keras file of 5 classes fine-tuned on the 4 of the data, its backbone frozen, the
    best evaluation kept: (the file, the run's folder)."""
    import importlib  # noqa: PLC0415  (the user's module: on the path once written)

    root = tmp_path_factory.mktemp("keras-file")
    path = str(root / "fbn.keras")
    keras.utils.set_random_seed(5)
    importlib.import_module(nets[1]).functional_bn(5, 16).save(path)
    values = dict(model=path, freeze="backbone", keep_best=1, eval_every_steps=3)
    _run(small_dataset, root / "run", strategy="default", **values)
    return path, root / "run"


def test_a_keras_file_mirrored_equals_default(small_dataset, keras_run, tmp_path):
    """Loaded into 2 replicas: the same run (its frozen BatchNorm normalizes with the file's
    statistics on both)."""
    values = dict(model=keras_run[0], freeze="backbone", keep_best=1, eval_every_steps=3)
    summary = _run(small_dataset, tmp_path, strategy="mirrored", **values)
    assert summary["num_replicas"] == 2
    assert_same_weights(tmp_path, keras_run[1], atol=ATOL)


def test_a_keras_file_fine_tunes_its_head_only(keras_run):
    path, run = keras_run
    saved = {w.path: w.numpy() for w in keras.saving.load_model(path, safe_mode=True).weights}
    # The run's final weights in the model a run builds of the file (no export at the run's
    # end: test_a_keras_file_run_is_exported_served_evaluated_predicted_and_reported exports).
    trained = models.build_model(path, 4, SETTINGS["image_size"])
    trained.load_weights(run / "final.weights.h5")
    network = [x for x in trained.layers if isinstance(x, keras.Model)][0]
    for w in network.weights:
        if w.path.startswith("classifier"):
            assert w.shape[-1] == 4  # replaced: 5 -> 4 classes
        else:  # the frozen backbone, its BatchNorm statistics included
            np.testing.assert_array_equal(w.numpy(), saved[w.path])
    lines = _lines(run)
    assert "classifier classifier new (5 -> 4 classes)" in lines
    assert "4 layer(s) frozen (BatchNorm in inference mode), training classifier only" in lines


def test_a_keras_file_run_is_exported_served_evaluated_predicted_and_reported(keras_run, tmp_path):
    run = str(keras_run[1])
    entry = export(run, ExportOptions(format="saved_model"), checkpoint="best", log=_quiet)
    assert entry["verdict"] == "ok"  # its signatures checked against predict
    # model.keras beside it loads as a user loads it (the fine-tuned file's classes: 4)
    exported = keras.saving.load_model(os.path.join(run, "export", "model.keras"), safe_mode=True)
    assert exported.output_shape[-1] == 4
    report = evaluate(run, checkpoint="best", log=_quiet)
    with open(os.path.join(run, "best", "best.json"), encoding="utf-8") as f:
        best = json.load(f)
    assert report["top1"] == pytest.approx(best["kept"][0]["top1"])
    rows = predict(model_dir=run, split="validation", output=str(tmp_path / "p.csv"), top_k=2)
    assert len(rows) == 24 and not any(r["error"] for r in rows)
    requires("matplotlib")  # the report draws with the [report] extra
    from tfgpu.report.write import write_report  # noqa: PLC0415 (after requires)

    runs, output = read_runs([run]), str(tmp_path / "r.html")
    page = write_report(runs, output, gallery=2, log=_quiet, open_run=head.open_run)
    assert page["evaluations"][0]["top1"] == pytest.approx(summary_top1(run))


def summary_top1(run: str) -> float:
    return run_summary(run)["final_eval"]["top1"]


@pytest.fixture(scope="module")
def vit_preset(tmp_path_factory):
    """A tiny KerasHub ViT, built offline and saved to a preset directory with its image
    converter (x / 127.5 - 1)."""
    requires("hub")  # the [hub] extra: make test installs it
    import keras_hub  # noqa: PLC0415

    directory = str(tmp_path_factory.mktemp("hub") / "vit")
    keras.utils.set_random_seed(4)
    vit = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=4, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32
    )
    vit.save_to_preset(directory)
    converter = keras_hub.layers.ViTImageConverter(
        image_size=(16, 16), scale=1 / 127.5, offset=-1.0
    )
    converter.save_to_preset(directory)
    return directory


# The KerasHub backbone frozen until update 3, then trained at a tenth of the head's rate
# (--freeze=backbone, --unfreeze_after_steps, --backbone_lr_multiplier): the run the
# accumulation test compares with and the unfreeze test reads, one ViT run for both.
VIT = dict(
    strategy="default",
    sync_batchnorm=False,
    freeze="backbone",
    unfreeze_after_steps=3,
    backbone_lr_multiplier=0.1,
)


@pytest.fixture(scope="module")
def vit_run(small_dataset, vit_preset, tmp_path_factory):
    """The ViT preset's run on one device (VIT): its folder."""
    model_dir = tmp_path_factory.mktemp("vit")
    summary = _run(small_dataset, model_dir, model=f"hub:{vit_preset}", **VIT)
    assert np.isfinite(summary["final_eval"]["loss"])
    return model_dir


def test_a_kerashub_preset_trains_and_accumulation_equals_the_large_batch(
    small_dataset, vit_preset, vit_run, tmp_path
):
    accumulated = _run(
        small_dataset, tmp_path, model=f"hub:{vit_preset}", grad_accum_steps=2, **VIT
    )
    assert accumulated["grad_accum_steps"] == 2
    assert_same_weights(tmp_path, vit_run, atol=ATOL)
    lines = _lines(vit_run)
    assert "KerasHub preset ViTBackbone, weights from the preset" in lines
    assert "the preset's image converter in front" in lines


# ONNX by default: ViT's exact GELU computes with Erfc, which ONNX lacks (onnx.py rewrites it).
def test_a_frozen_vit_backbone_unfreezes_at_its_own_learning_rate(vit_preset, vit_run, tmp_path):
    """--freeze=backbone with --unfreeze_after_steps and --backbone_lr_multiplier: the
    KerasHub backbone is the group that waits, then trains at a tenth of the head's rate.
    Read in the module's ViT run: its final weights in the model a run builds of the preset,
    saved as the export's model.keras is (model.save) and loaded as a user loads that."""
    import keras_hub  # noqa: PLC0415  (the [hub] extra)

    built = models.build_model(f"hub:{vit_preset}", 4, SETTINGS["image_size"])
    built.load_weights(vit_run / "final.weights.h5")
    built.save(tmp_path / "model.keras")
    trained = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    vit = [x for x in trained.layers if isinstance(x, keras_hub.models.Backbone)][0]
    saved = keras_hub.models.Backbone.from_preset(vit_preset)
    assert changed(vit, saved)  # trained after update 3
    lines = _lines(vit_run)
    assert "fine-tune: learning rate logits x1, backbone x0.1" in lines
    assert "the backbone trains from update 4 on" in lines


@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param("onnx", marks=pytest.mark.requires("onnx")),
        pytest.param("litert", marks=[pytest.mark.heavy, pytest.mark.requires("litert")]),
    ],
)
def test_a_kerashub_vit_exports_to_onnx_and_litert(vit_run, fmt):
    entry = export(str(vit_run), ExportOptions(format=fmt), log=_quiet)
    assert entry["verdict"] == "ok"  # checked against predict on the run's images


# Horovod and Ray widen the two-worker case above (multi_worker_mirrored) to the other
# backends: heavy, as their tiny_cnn cases beside them (tests/e2e/: test_equivalence.py,
# test_ray.py).
@pytest.mark.heavy
def test_horovod_two_ranks_equal_one_device_with_sync_batchnorm(
    small_dataset, nets, functional_default, tmp_path, horovodrun_tfgpu
):
    _two_processes(horovodrun_tfgpu, "horovod", small_dataset, nets, tmp_path, functional_default)


@pytest.mark.heavy
def test_ray_two_workers_equal_one_device_with_sync_batchnorm(
    small_dataset, nets, functional_default, tmp_path
):
    requires("ray")
    cmd = [sys.executable, "-m", "tfgpu.ray", "--num_workers=2", "--"]
    _two_processes(cmd, "auto", small_dataset, nets, tmp_path, functional_default)


def test_progressive_resizing_of_a_vit_is_refused_before_training(
    small_dataset, vit_preset, tmp_path
):
    with pytest.raises(ConfigError) as err:
        _run(
            small_dataset,
            tmp_path,
            model=f"hub:{vit_preset}",
            progressive_stages=2,
            progressive_min_image_size=8,
        )
    message = str(err.value)
    assert "\n" not in message and "--progressive_stages" in message and "one size only" in message
    assert not os.path.exists(tmp_path / "checkpoints") or not os.listdir(tmp_path / "checkpoints")
