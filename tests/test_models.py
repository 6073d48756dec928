import numpy as np
import pytest

from tfgpu import models


@pytest.mark.parametrize("name", ["tiny_cnn", "resnet18"])
def test_registry_model_builds_and_returns_float32_logits(name):
    model = models.build_model(name, num_classes=7, image_size=32, small_input=True)
    logits = model(np.zeros((2, 32, 32, 3), np.float32))
    assert logits.shape == (2, 7) and logits.dtype == "float32"


def test_unknown_model_names_the_choices():
    with pytest.raises(KeyError, match="resnet50"):
        models.build_model("resnet5", 10, 32)
