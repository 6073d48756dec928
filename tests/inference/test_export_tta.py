"""--eval_tta in the exports (issue 55): the run's end-of-run SavedModel, fed the validation
split's raw image bytes, gives its final evaluation's top-1 to the image; tfgpu-export's
SavedModel, LiteRT and ONNX models average the same views, their report says which, and their
check against predict (which averages them too) passes."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_RUN

from tfgpu import train
from tfgpu.config import config_from, validate
from tfgpu.data.spec import load_spec
from tfgpu.cli.export import export_run as export
from tfgpu.inference.export import ExportOptions
from tfgpu.step.loops import tta_probabilities

SIZE = 16


@pytest.fixture(scope="module")
def run(small_dataset, tmp_path_factory):
    """tiny_cnn for 6 updates on 16x16 crops (the views are the claim, not the input size),
    evaluated with six-view TTA; (its folder, its summary)."""
    model_dir = tmp_path_factory.mktemp("tta-run")
    values = dict(TINY_RUN, export=True, eval_tta="flip_translate", learning_rate=0.05)
    values.update(image_size=SIZE)
    config = validate(config_from(data_dir=small_dataset, model_dir=str(model_dir), **values))
    return model_dir, train.run(config)


def _validation(data_dir):
    spec = load_spec(validate(config_from(data_dir=data_dir, image_size=SIZE)).data)
    records = tf.data.TFRecordDataset(list(spec.eval_files)).map(spec.parse)
    encoded, labels = zip(*[(e["encoded"].numpy(), int(e["label"])) for e in records])
    return list(encoded), np.array(labels)


def test_the_runs_saved_model_serves_its_final_evaluation(run, small_dataset):
    model_dir, summary = run
    final = summary["final_eval"]
    assert final["tta"] == "flip_translate"
    encoded, labels = _validation(small_dataset)
    loaded = tf.saved_model.load(str(model_dir / "export" / "saved_model"))
    served = loaded.signatures["classify_bytes"](image_bytes=tf.constant(encoded))
    top1 = served["top_k_indices"].numpy()[:, 0]
    assert np.mean(top1 == labels) == final["top1"] and len(labels) == 24
    # serve's logits are those whose softmax is the views' average: classify_images'.
    pixels = tf.constant(np.random.default_rng(0).integers(0, 256, (5, SIZE, SIZE, 3)), tf.uint8)
    logits = loaded.signatures["serve"](images=pixels)["output_0"]
    classified = loaded.signatures["classify_images"](images=pixels)["probabilities"]
    np.testing.assert_allclose(tf.nn.softmax(logits).numpy(), classified.numpy(), atol=1e-6)
    # and that average is of the six views (top-1 on 24 images can agree with fewer views):
    # the views of model.keras beside it, the same weights
    model = keras.saving.load_model(model_dir / "export" / "model.keras", safe_mode=True)
    views = tta_probabilities(model, tf.cast(pixels, tf.float32), "flip_translate")
    np.testing.assert_allclose(classified.numpy(), np.asarray(views), atol=1e-6)


@pytest.mark.parametrize(
    "fmt",
    [
        "saved_model",
        pytest.param("litert", marks=pytest.mark.requires("litert")),
        pytest.param("onnx", marks=pytest.mark.requires("onnx")),
    ],
)
def test_every_format_averages_the_views_and_says_so(run, fmt):
    model_dir, _ = run
    entry = export(str(model_dir), ExportOptions(format=fmt), log=lambda *_: None)
    assert entry["verdict"] == "ok" and entry["tta"] == "flip_translate"
    for out in entry["outputs"].values():
        assert out["top1_agreement"] == 1.0 and out["max_prob_diff"] < 1e-5
    with open(os.path.join(model_dir, "export", "report.json"), encoding="utf-8") as f:
        assert json.load(f)["exports"][os.path.basename(entry["file"])]["tta"] == "flip_translate"


@pytest.mark.fast
def test_a_model_of_ones_own_serves_the_views_average(tmp_path):
    """A subclassed model of the user's own (no get_config: the SavedModel alone) carries the
    views in its signatures as a registry model does."""
    from own_nets import write_module  # noqa: PLC0415 (puts the module on the path)

    from tfgpu import models  # noqa: PLC0415
    from tfgpu.inference.export.serving import export_model  # noqa: PLC0415
    from tfgpu.step.loops import tta_probabilities  # noqa: PLC0415

    model = models.build_model(f"{write_module(tmp_path)}:subclassed", 4, 16)
    note = export_model(model, str(tmp_path / "export"), 16, class_names=list("abcd"), tta="flip")
    assert "no model.keras" in note
    pixels = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3)).astype(np.uint8)
    loaded = tf.saved_model.load(str(tmp_path / "export" / "saved_model"))
    served = loaded.signatures["classify_images"](images=tf.constant(pixels))["probabilities"]
    views = tta_probabilities(model, tf.constant(pixels, tf.float32), "flip")
    one = tta_probabilities(model, tf.constant(pixels, tf.float32), "none")
    np.testing.assert_allclose(served.numpy(), np.asarray(views), atol=1e-6)
    assert np.abs(np.asarray(views) - np.asarray(one)).max() > 1e-3  # the views differ
