"""export/model.keras and export/saved_model (its pixel and bytes signatures) load and predict
in a Python without tfgpu."""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import make_image_arrays
from tfgpu import models
from tfgpu.config import config_from
from tfgpu.inference.export.serving import decode_images, export_model
from tfgpu.models import resnet

# Runs in a fresh interpreter where `import tfgpu` fails (the package is installed editable,
# so hiding the repo from sys.path is not enough: the module entry is blocked instead).
LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["tfgpu"] = None
    try:
        import tfgpu
        raise SystemExit("tfgpu is importable")
    except ImportError:
        pass
    import numpy as np, keras, tensorflow as tf
    export, images = sys.argv[1], np.load(sys.argv[2])
    model = keras.saving.load_model(export + "/model.keras", safe_mode=True)
    loaded = tf.saved_model.load(export + "/saved_model")  # kept: it owns the variables
    served = loaded.serve(tf.constant(images))
    np.save(sys.argv[3], np.stack([model(images.astype("float32")).numpy(), served.numpy()]))
    encoded = tf.constant([open(sys.argv[4], "rb").read()])
    np.save(sys.argv[5], loaded.classify_bytes(encoded)["probabilities"].numpy())
    print("tfgpu" in sys.modules and sys.modules["tfgpu"] is not None)
    """
)


def _build(name: str):
    """Registry model ``name`` for 5 classes at 32x32, or resnet6: the resnet family's code cut
    to two stages of one block (BatchNorm, residual additions, a projection shortcut)."""
    if name == "resnet6":
        return resnet.build(5, 32, small_input=True, depths=(1, 1))
    return models.build_model(name, num_classes=5, image_size=32, small_input=True)


# efficientnet_b0 (a keras.applications backbone, 60-80 s) and resnet18 are heavy; resnet6, the
# same layers as resnet18 in fewer blocks, always runs (resnet18: ~20 s of 2 quiet cores).
@pytest.mark.parametrize(
    "name",
    [
        "resnet6",
        pytest.param("resnet18", marks=pytest.mark.heavy),
        pytest.param("efficientnet_b0", marks=pytest.mark.heavy),
    ],
)
def test_exported_model_predicts_the_same_without_tfgpu(tmp_path, name):
    model = _build(name)
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    expected = model(images.astype(np.float32), training=False).numpy()
    data = config_from(image_size=32).data
    export_model(model, str(tmp_path / "export"), 32, class_names=list("abcde"), data=data)
    np.save(tmp_path / "images.npy", images)
    photo = make_image_arrays(1, size=45, seed=2)[0][0]
    Image.fromarray(photo).save(tmp_path / "photo.png")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            LOADER,
            str(tmp_path / "export"),
            str(tmp_path / "images.npy"),
            str(tmp_path / "out.npy"),
            str(tmp_path / "photo.png"),
            str(tmp_path / "bytes.npy"),
        ],
        capture_output=True,
        check=False,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("False")
    from_keras, from_saved_model = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(from_keras, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(from_saved_model, expected, rtol=1e-4, atol=1e-5)
    # The bytes signature, without tfgpu: evaluation's crop and resize inside the graph.
    decoded, _ = decode_images(tf.constant([(tmp_path / "photo.png").read_bytes()]), data)
    by_tfgpu = tf.nn.softmax(model(tf.cast(decoded, tf.float32), training=False)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "bytes.npy"), by_tfgpu, atol=1e-6)


@pytest.mark.fast
def test_exported_keras_file_names_no_tfgpu_object(tmp_path):
    export_model(models.build_model("tiny_cnn", 3, 32), str(tmp_path), image_size=32)
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        config = json.loads(archive.read("config.json"))
    # No custom object (and no compiled optimizer with tfgpu's WarmupDecay) is saved.
    assert "tfgpu" not in json.dumps(config) and not config.get("compile_config")
