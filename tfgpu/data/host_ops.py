"""Per-example host ops of the input pipeline: check, decode only the crop window, resize to
uint8, and draw each example's random choices from its stateless seed.

Every function here maps one example, and works the same eagerly and inside ``Dataset.map``.
"""

import tensorflow as tf

from tfgpu.data import rng_streams

# Each random choice of an example gets its own stream of the example's stateless seed.
_FLIP, _MIX_KIND, _GAMMA_A, _GAMMA_B, _CUT_Y, _CUT_X, _ALTERNATING = (
    rng_streams.EXAMPLE[k]
    for k in ("flip", "mix_kind", "gamma_a", "gamma_b", "cut_y", "cut_x", "alternating_flip")
)


def example_seed(seed: int, epoch: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """The stateless seed of one example: a function of (seed, epoch, position) only."""
    epoch = tf.cast(epoch, tf.int64)
    return tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + epoch, tf.cast(position, tf.int64)])


def _stream(seed: tf.Tensor, k: int) -> tf.Tensor:
    return seed + tf.constant([0, k << 40], tf.int64)


def stream_keys(seed: tf.Tensor):
    """``key(stream) -> seed`` of an example's streams (an example seed), for draws made
    elsewhere (``augment.draw``)."""
    return lambda k: _stream(seed, k)


def random_crop_window(shape, seed, min_area: float):
    """Random-resized-crop window (Inception style) ``[y, x, h, w]`` for an image ``shape``."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def center_crop_window(shape, crop_fraction: float):
    """The central square of ``crop_fraction`` of the shorter side (resized afterwards)."""
    height, width = shape[0], shape[1]
    side = tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def _tail_has(tail, marker: bytes):
    """Where ``marker`` occurs in ``tail`` (strings of up to 16 bytes, any shape: trailing
    padding after the end marker is common). String ops on short strings: a handful of ops
    per block of records (a byte-array version cost ~0.05 ms an image, 5% of a decode)."""
    # Left-padded to 16 bytes, so every window below exists; zero bytes are in no marker.
    tail = tf.strings.substr(tf.strings.join([b"\0" * 16, tail]), -16, 16)
    found = [
        tf.equal(tf.strings.substr(tail, k, len(marker)), marker)
        for k in range(16 - len(marker) + 1)
    ]
    return tf.reduce_any(tf.stack(found, -1), -1)


def looks_whole(encoded: tf.Tensor) -> tf.Tensor:
    """A cheap check that encoded images (a string tensor, any shape) are not cut short or
    garbage; a bool of the same shape.

    JPEG must start with SOI and hold its EOI marker in its last 16 bytes, PNG its IEND chunk;
    GIF and BMP are checked by magic only. An image that passes and still fails to decode (a
    broken header) stops the pipeline with TensorFlow's error.
    """
    head = tf.strings.substr(encoded, 0, 4)
    start = tf.maximum(tf.strings.length(encoded) - 16, 0)
    tail = tf.strings.substr(encoded, start, tf.fill(tf.shape(start), 16))
    jpeg = tf.strings.substr(head, 0, 3) == b"\xff\xd8\xff"
    png = head == b"\x89PNG"
    other = tf.logical_or(
        tf.strings.substr(head, 0, 3) == b"GIF", tf.strings.substr(head, 0, 2) == b"BM"
    )
    return (jpeg & _tail_has(tail, b"\xff\xd9")) | (png & _tail_has(tail, b"IEND")) | other


# DCT scalings libjpeg offers through decode_and_crop_jpeg's ``ratio``.
_RATIOS = (1, 2, 4, 8)


def _scaled_window(window, shape, ratio: int):
    """A crop window ``[y, x, h, w]`` in the image decoded at 1/``ratio`` scale (libjpeg's
    size: ceil(side / ratio)), covering the original window."""
    if ratio == 1:
        return window
    limit = (shape[:2] + ratio - 1) // ratio
    start = window[:2] // ratio
    end = tf.minimum((window[:2] + window[2:] + ratio - 1) // ratio, limit)
    return tf.concat([start, end - start], 0)


def decode_crop(
    encoded: tf.Tensor, crop_window_fn, min_side: int = 0, dct_mode: str = "on"
) -> tf.Tensor:
    """Decodes only the window ``crop_window_fn(shape)`` picks: fused for JPEG (rows below the
    window are never decoded, columns outside skip the IDCT), sliced otherwise.

    With ``min_side`` (the output size), a JPEG window at least 2, 4 or 8 times ``min_side``
    on both sides is decoded at that DCT scale, still >= ``min_side``: less to decode and
    copy (1600x1200 photos: -15-20% host CPU per image), and the IDCT's scaling averages like
    an antialiased resize (within ~1-2.5/255 of one, tested). Keeps the crops of large photos
    small for ``--resize_on=device``. ``dct_mode`` "on": every JPEG window goes through the
    choice of scale (a Case op of four decodes, ~3% on ImageNet-sized images, where it
    applies to 0.1% of crops); "auto": only windows that qualify do, the others take the plain
    fused decode after one comparison (``--dct_scaled_decode``).
    """

    def jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)
        window = crop_window_fn(shape)

        def at(ratio):
            scaled = _scaled_window(window, shape, ratio)
            return lambda: tf.image.decode_and_crop_jpeg(encoded, scaled, channels=3, ratio=ratio)

        if not min_side:
            return at(1)()
        smaller = tf.minimum(window[2], window[3])
        index = tf.add_n([tf.cast(smaller >= r * min_side, tf.int32) for r in _RATIOS[1:]])
        if dct_mode == "auto":  # decided per example; most windows are under 2x the output
            scaled = lambda: tf.switch_case(index - 1, [at(r) for r in _RATIOS[1:]])  # noqa: E731
            return tf.cond(index > 0, scaled, at(1))
        return tf.switch_case(index, [at(r) for r in _RATIOS])

    def other():
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        window = crop_window_fn(tf.shape(image))
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def resize_uint8(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Bilinear resize (half-pixel centers, as ``tf.image.resize``) of uint8 to uint8.

    The raw op reads uint8 directly, and pixel values cannot leave [0, 255] under bilinear
    interpolation, so no clip: two passes over the output instead of ``tf.image.resize``'s five.
    """
    resized = tf.raw_ops.ResizeBilinear(
        images=image[None], size=[image_size, image_size], half_pixel_centers=True
    )[0]
    return tf.cast(resized + 0.5, tf.uint8)


def decode_window_resized(
    encoded, valid, crop_window_fn, image_size: int, min_side: int = 0, dct_mode: str = "on"
):
    """The uint8 [S, S, 3] image of one encoded image; zeros unless ``valid``
    (``looks_whole``). ``min_side``, ``dct_mode``: see ``decode_crop``."""
    return tf.cond(
        valid,
        lambda: resize_uint8(decode_crop(encoded, crop_window_fn, min_side, dct_mode), image_size),
        lambda: tf.zeros([image_size, image_size, 3], tf.uint8),
    )


# 8 RGB pixels = 24 bytes = 3 int64 words: a packed crop is whole words and starts on a whole
# pixel, whatever the crops before it in the batch.
WORD_PIXELS = 8


def pack_pixels(image: tf.Tensor) -> tf.Tensor:
    """uint8 [h, w, 3] -> int64 [3 * ceil(h * w / 8)]: the pixels, zero-padded to a multiple
    of 24 bytes and bitcast (undone on the device, ``device_ops.unpack_rgb``).

    int64 because batching concatenates element by element: 8x fewer elements than uint8
    (measured: 0.5 -> 0.15 ms of host CPU per image, bench/README.md).
    """
    flat = tf.reshape(image, [-1])
    flat = tf.pad(flat, [[0, tf.math.floormod(-tf.size(flat), 3 * WORD_PIXELS)]])
    return tf.bitcast(tf.reshape(flat, [-1, 8]), tf.int64)


def decode_window_packed(encoded, valid, crop_window_fn, min_side: int = 0, dct_mode="on"):
    """For ``--resize_on=device``: (the crop window's pixels un-resized, uint8 [h * w * 3],
    size [2] int32 (h, w)) of one encoded image; one black pixel unless ``valid``
    (``looks_whole``). The batch pads and packs them (``packing.flat_batches``, the words of
    ``pack_pixels``) and the device resizes it (``device_ops.resize_flat``).
    ``min_side``, ``dct_mode``: see ``decode_crop``.
    """
    image = tf.cond(
        valid,
        lambda: decode_crop(encoded, crop_window_fn, min_side, dct_mode),
        lambda: tf.zeros([1, 1, 3], tf.uint8),
    )
    return tf.reshape(image, [-1]), tf.shape(image)[:2]


def _beta(seed, alpha):
    """A stateless Beta(alpha, alpha) draw, as the ratio of two gamma draws."""
    a = tf.random.stateless_gamma([], _stream(seed, _GAMMA_A), alpha=alpha)
    b = tf.random.stateless_gamma([], _stream(seed, _GAMMA_B), alpha=alpha)
    return a / tf.maximum(a + b, 1e-12)


def draw_mixing(seed, image_size: int, mixup_alpha: float, cutmix_alpha: float) -> dict:
    """One example's MixUp/CutMix choice: {mix_lam, cut_box [y0, x0, y1, x1], use_cut}.

    With both alphas set, each example picks CutMix or MixUp with equal odds. ``mix_lam`` is
    the share of the example's own image (for CutMix, 1 - the pasted box's area fraction).
    """
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cut = tf.random.stateless_uniform([], _stream(seed, _MIX_KIND)) < 0.5
    else:
        use_cut = tf.constant(cutmix_alpha > 0)
    alpha = tf.where(use_cut, max(cutmix_alpha, 1e-3), max(mixup_alpha, 1e-3))
    lam = _beta(seed, alpha)
    side = tf.cast(image_size, tf.float32)
    half = side * tf.sqrt(1.0 - lam) / 2
    cy = tf.random.stateless_uniform([], _stream(seed, _CUT_Y)) * side
    cx = tf.random.stateless_uniform([], _stream(seed, _CUT_X)) * side
    box = tf.cast(
        tf.round(tf.clip_by_value(tf.stack([cy - half, cx - half, cy + half, cx + half]), 0, side)),
        tf.int32,
    )
    area = tf.cast((box[2] - box[0]) * (box[3] - box[1]), tf.float32) / (side * side)
    return {
        "mix_lam": tf.where(use_cut, 1.0 - area, lam),
        "cut_box": tf.where(use_cut, box, tf.zeros([4], tf.int32)),
        "use_cut": use_cut,
    }


def draw_flip(seed) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed=_stream(seed, _FLIP)) < 0.5


def alternating_flip(seed: int, epoch: tf.Tensor, origin: tf.Tensor) -> tf.Tensor:
    """--alternating_flips on the per-example path: whether the record ``origin``
    (``broken.origin``: its file and index, the same in every epoch) is mirrored in ``epoch``.
    A coin per record, drawn once from (seed, origin), says whether it is mirrored in even
    epochs; in odd ones it is the other way round."""
    first = tf.random.stateless_uniform(
        [], seed=_stream(example_seed(seed, 0, origin), _ALTERNATING)
    )
    return tf.not_equal(first < 0.5, tf.math.floormod(tf.cast(epoch, tf.int64), 2) == 1)
