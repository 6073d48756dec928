"""tfgpu: train image classifiers on GPUs with TensorFlow 2 and Keras 3, from one laptop to many
multi-GPU machines. See README.md; ``python -m tfgpu.main --helpfull`` lists every flag."""

__version__ = "0.1.0"
