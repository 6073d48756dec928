"""The two real photographs scikit-learn ships (china.jpg, flower.jpg, 427x640), for the
benchmarks that need real photos. scikit-learn is not a tfgpu dependency (Keras imports it at
start-up whenever it is installed): these benchmarks ask for it."""

import numpy as np


def sample_photos() -> list[np.ndarray]:
    """scikit-learn's two sample photos as uint8 [427, 640, 3] arrays; without scikit-learn,
    exits with one line saying how to install it."""
    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        raise SystemExit(
            "this benchmark needs scikit-learn's sample photos: pip install scikit-learn"
        ) from None
    return list(load_sample_images().images)
