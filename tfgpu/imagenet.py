"""ImageNet's per-channel mean and standard deviation (RGB), defined once: what
keras.applications' models normalize by, and so tfgpu's own nets and augmentation fills. No
TensorFlow here."""

IMAGENET_MEAN_UNIT = (0.485, 0.456, 0.406)
IMAGENET_STD_UNIT = (0.229, 0.224, 0.225)
# The same on uint8 pixel values (0-255), as the models receive them.
IMAGENET_MEAN = tuple(m * 255 for m in IMAGENET_MEAN_UNIT)
IMAGENET_STD = tuple(s * 255 for s in IMAGENET_STD_UNIT)
IMAGENET_VAR = tuple(s * s for s in IMAGENET_STD)
