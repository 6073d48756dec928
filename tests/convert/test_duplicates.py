"""The converter's duplicate check (--check_duplicates, --dedupe): copies planted by the
transformations that make near-duplicates (JPEG quality 95 -> 60, a 90% resize, a 2-pixel
crop, a mirror) are found across splits beside distinct real photos (scikit-image's samples),
which group with nothing; a copy with another label is named; --dedupe leaves no validation
image that is in train and counts that add up; hostile inputs (1x1, one colour, 100,000 copies
of one image) end in results, never a hang; tfgpu-evaluate's line reads quality.json."""

import functools
import gc
import io
import json
import os

import imagehash
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image
from skimage import data as skimage_data

from tfgpu.data import recordformat
from tfgpu.cli import convert as cli
from tfgpu.convert import columns, dedupe, duplicates, fingerprint, near_search
from tfgpu.data.dataset_info import leak_line

# Distinct photographs and scans among scikit-image's samples (data.cat is chelsea again).
PHOTOS = [
    "astronaut", "camera", "coffee", "chelsea", "rocket", "coins", "moon", "page", "text",
    "clock", "hubble_deep_field", "immunohistochemistry", "brick", "grass", "gravel", "cell",
]  # fmt: skip
PLANTED = {"astronaut": "q60", "coffee": "resize90", "rocket": "crop2", "chelsea": "flip"}


@functools.cache
def _photo(name: str) -> Image.Image:
    array = getattr(skimage_data, name)()
    if array.dtype != np.uint8:
        array = (255 * (array - array.min()) / (np.ptp(array) or 1)).astype(np.uint8)
    return Image.fromarray(array).convert("RGB")


def _jpeg(image: Image.Image, quality: int = 95) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def _transformed(image: Image.Image, how: str) -> bytes:
    """The near-duplicate ``how`` makes of ``image``, as JPEG bytes."""
    if how == "q60":  # a JPEG saved at quality 95, decoded and saved again at 60
        return _jpeg(Image.open(io.BytesIO(_jpeg(image))), 60)
    if how == "resize90":
        size = (image.width * 9 // 10, image.height * 9 // 10)
        return _jpeg(image.resize(size, Image.Resampling.BICUBIC))
    if how == "crop2":
        return _jpeg(image.crop((2, 2, image.width - 2, image.height - 2)))
    return _jpeg(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """ROOT/{train,validation}/{a,b}/: every photo in train; transformed copies of four in
    validation; an exact copy of ``camera`` in train under the other class."""
    root = tmp_path_factory.mktemp("planted")
    for i, name in enumerate(PHOTOS):
        label = "ab"[i % 2]
        image = _photo(name)
        (root / "train" / label).mkdir(parents=True, exist_ok=True)
        (root / "train" / label / f"{name}.jpg").write_bytes(_jpeg(image))
        if name in PLANTED:
            (root / "validation" / label).mkdir(parents=True, exist_ok=True)
            (root / "validation" / label / f"{name}-{PLANTED[name]}.jpg").write_bytes(
                _transformed(image, PLANTED[name])
            )
        if name == "camera":
            other = "ba"[i % 2]
            (root / "train" / other / "camera-copy.jpg").write_bytes(_jpeg(image))
    return root


def _convert(capsys, root, out, *flags) -> tuple[dict, dict, str]:
    """(dataset_info, quality.json, stdout) of converting ``root`` into ``out``."""
    capsys.readouterr()
    code = cli.main(
        ["to_tfrecord", "--noprogress", "--num_workers=0", f"--input={root}", f"--output_dir={out}"]
        + list(flags)
    )
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    with open(os.path.join(out, recordformat.INFO_FILE), encoding="utf-8") as f:
        info = json.load(f)
    with open(os.path.join(out, recordformat.QUALITY_FILE), encoding="utf-8") as f:
        return info, json.load(f), stdout


def _names(group: dict) -> set:
    return {os.path.basename(m["file"]).split(".")[0] for m in group["members"]}


def test_planted_copies_found_across_splits_and_distinct_photos_not(planted, tmp_path, capsys):
    info, quality, stdout = _convert(capsys, planted, tmp_path / "out")
    groups = {frozenset(_names(g)): g for g in quality["groups"]}
    planted_pairs = {frozenset({n, f"{n}-{how}"}) for n, how in PLANTED.items()}
    assert set(groups) == planted_pairs | {frozenset({"camera", "camera-copy"})}
    for pair in planted_pairs:
        assert groups[pair]["kind"] == "near" and groups[pair]["leak"]
        assert groups[pair]["splits"] == {"train": 1, "validation": 1}
    assert quality["leaked_images"] == {"validation": 4}
    assert "4 validation images also in train" in stdout
    assert info["quality"]["num_leak_groups"] == 4


def test_a_copy_with_another_label_is_named(planted, tmp_path, capsys):
    _, quality, stdout = _convert(capsys, planted, tmp_path / "out")
    conflicts = [g for g in quality["groups"] if g["label_conflict"]]
    assert len(conflicts) == 1 and conflicts[0]["kind"] == "exact"
    assert conflicts[0]["labels"] == {"a": 1, "b": 1} and not conflicts[0]["leak"]
    assert quality["num_label_conflicts"] == 1 and "1 groups with different labels" in stdout


@pytest.mark.parametrize("mode", ["validation", "all"])
def test_dedupe_writes_clean_splits_whose_counts_add_up(planted, tmp_path, capsys, mode):
    out = tmp_path / "out"
    info, quality, stdout = _convert(capsys, planted, out, f"--dedupe={mode}")
    dropped = {"validation": 4, **({"train": 1} if mode == "all" else {})}
    assert quality["dedupe"] == {"mode": mode, "dropped": dropped}
    assert info["num_examples"] == {
        "train": len(PHOTOS) + 1 - dropped.get("train", 0),
        "validation": 0,
    }
    for entry in info["splits"].values():
        in_files = [recordformat.scan_shard(out / s["file"])[0] for s in entry["shards"]]
        assert in_files == [s["num_examples"] for s in entry["shards"]]
        assert sum(in_files) == entry["num_examples"] == sum(entry["per_class"].values())
    assert f"--dedupe={mode} dropped" in stdout


def test_dedupe_of_a_shard_is_done_once(tmp_path):
    """A run interrupted after cutting a shard cuts it no further when run again."""
    path = tmp_path / "train-00000-of-00001.tfrecord"
    with open(path, "wb") as f:
        for i in range(5):
            recordformat.write_record(f, recordformat.encode_example(b"x", i, 1, 1, "PNG", str(i)))
    dedupe.drop_records(str(path), {1, 3}, before=5)
    once = path.read_bytes()
    dedupe.drop_records(str(path), {1, 3}, before=5)
    assert path.read_bytes() == once and recordformat.scan_shard(str(path)) == (3, -1)


def test_evaluate_says_when_the_data_leaks(planted, tmp_path, capsys):
    out = tmp_path / "out"
    _convert(capsys, planted, out)
    assert leak_line(str(out), "validation").startswith("data: 4 validation images have")
    assert leak_line(str(out), "train") == ""
    _convert(capsys, planted, out, "--dedupe=validation", "--overwrite")
    assert "were dropped" in leak_line(str(out), "validation")
    assert leak_line(str(tmp_path), "validation") == ""  # no quality.json: nothing said


def test_phash_is_imagehashs_and_the_mirror_hash_the_mirrors():
    for name in PHOTOS:
        thumb = np.rint(fingerprint.thumbnail(_photo(name))).astype(np.uint8)
        direct, mirror = fingerprint.phashes(np.stack([thumb, thumb[:, ::-1]]))
        theirs = imagehash.phash(Image.fromarray(thumb)).hash.reshape(-1)
        ours = np.unpackbits(np.array([direct[0]], ">u8").view(np.uint8)).astype(bool)
        assert (ours == theirs).all(), name
        assert direct[1] == mirror[0], name


def _all_pairs(direct, mirror, thumbs) -> set:
    """Every near pair by the definition, over all pairs: the search's reference."""
    t, found = thumbs.astype(np.float32), set()
    for i in range(len(t)):
        for hashes, others in ((direct, t), (mirror, t[:, :, ::-1])):
            rms = np.sqrt(((t[i] - others) ** 2).mean(axis=(1, 2)))
            bits = np.bitwise_count(direct[i] ^ hashes)
            close = (rms <= duplicates.THUMB_RMS) & (bits <= duplicates.RADIUS)
            found |= {(min(i, j), max(i, j)) for j in np.nonzero(close)[0] if j != i}
    return found


@pytest.mark.parametrize("index", ["thumbnails", "pHashes"])
@pytest.mark.parametrize("kind", ["smooth", "noise"])
def test_the_search_finds_every_near_pair_a_search_over_all_pairs_finds(kind, index, monkeypatch):
    """Copies at noise levels on both sides of the thresholds, some mirrored, of smooth
    images and of noise, searched by either index (near_search.py): the pairs are exactly
    those of the search over all pairs."""
    if index == "thumbnails":  # however many candidates the fewest components leave
        monkeypatch.setattr(near_search, "_CANDIDATES_PER_IMAGE", 1e9)
    else:
        monkeypatch.setattr(near_search, "MAX_TREE_DIMS", 0)
    rng = np.random.default_rng(0)
    side = columns.THUMB
    if kind == "smooth":
        coarse = rng.uniform(0, 255, (60, 4, 4))
        bases = np.kron(coarse, np.ones((side // 4, side // 4)))
    else:
        bases = rng.uniform(0, 255, (60, side, side))
    copies = [bases]
    for sigma in (2, 5, 7, 9, 12):
        noisy = bases + rng.normal(0, sigma, bases.shape)
        copies.append(np.where(rng.random(60)[:, None, None] < 0.3, noisy[:, :, ::-1], noisy))
    thumbs32 = np.clip(np.concatenate(copies), 0, 255).astype(np.float32)
    direct, mirror = fingerprint.phashes(thumbs32)
    thumbs = fingerprint.small(thumbs32)
    pairs, stats, _ = duplicates.near_pairs(direct, mirror, thumbs)
    assert stats["index"].startswith(index)
    expected = _all_pairs(direct, mirror, thumbs)
    assert len(expected) > 50  # the thresholds cut through the copies: some in, some out
    assert {tuple(p) for p in pairs.tolist()} == expected
    if index == "pHashes":  # the tree here searches on its fewest components, however many
        assert stats["candidates"] < len(thumbs) ** 2 / 2


def test_one_pass_over_a_shard_makes_the_hashes_and_thumbnails_image_by_image_would():
    """``summaries`` (matrices folded, a shard's images at once, float32) against
    ``phashes`` and ``small`` of each image's 32x32 thumbnail (float64): the same hashes,
    thumbnails within a grey level of rounding; photos of every size, JPEG drafts at 1/8
    scale of one shape standing for different sizes, Fashion-MNIST-sized arrays."""
    rng = np.random.default_rng(1)
    views = [fingerprint.view(_photo(name)) for name in PHOTOS]
    for cut in range(8):  # 593..600 px wide: 75 px drafts, each its own area matrix
        coffee = _photo("coffee")
        draft = Image.open(io.BytesIO(_jpeg(coffee.crop((cut, 0, coffee.width, 400)))))
        size = draft.size
        draft.draft("RGB", (draft.width // 8, draft.height // 8))
        assert draft.size == (75, 50)
        draft.info["size"] = size  # as the converter's check of a JPEG leaves it
        views.append(fingerprint.view(draft, 8))
    arrays = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8)
    views += [(a, a.shape, 1) for a in arrays[:-1]] + [(arrays[-1, ::-1], (28, 28), 1)]
    views = [views[i] for i in rng.permutation(len(views))]  # the kinds interleaved
    coeffs, smalls = fingerprint.summaries(views)
    thumbs = np.stack([columns.thumbnails([v])[0] for v in views])
    for ours, theirs in zip(fingerprint.hashes(coeffs), fingerprint.phashes(thumbs), strict=True):
        assert (ours == theirs).all()
    apart = np.abs(smalls.astype(int) - fingerprint.small(thumbs))
    assert apart.max() <= 1 and (apart > 0).mean() < 1e-3  # a mean at x.5, rounded apart
    collector = fingerprint.Collector()  # what a shard being written collects: the same
    for i, view in enumerate(views):
        collector.add(i, view, i % 3, f"f{i}", 7)
    record = collector.record()
    assert (record["phash"] == fingerprint.hashes(coeffs)[0]).all()
    assert (record["thumbs"] == smalls).all() and record["exact"].tolist() == list(range(i + 1))


def test_the_collector_keeps_nothing_the_cycle_collector_walks():
    """Collecting a shard leaves no object per image for Python's cycle collector: kept
    tuples made it run three times as often in a conversion, and once more over all of its
    objects (``Collector``). Arrays and JPEG drafts' views, keyed or not."""
    arrays = np.random.default_rng(3).integers(0, 256, (2000, 28, 28), dtype=np.uint8)
    draft = fingerprint.view(_photo("coffee").resize((75, 50)), 8)
    collector = fingerprint.Collector()
    enabled = gc.isenabled()
    gc.disable()  # no collection (which could untrack tuples) while it collects
    try:
        before = len(gc.get_objects(generation=0))
        for i, array in enumerate(arrays):
            key, view = fingerprint.of_array(array, None) if i % 2 else (i, draft)
            collector.add(key, (view[0], tuple(view[1]), view[2]), 0, f"f{i}", 28)
        kept = len(gc.get_objects(generation=0)) - before
    finally:
        if enabled:
            gc.enable()
    assert kept < 10, f"{kept} objects for 2,000 images"
    assert len(collector.record()["exact"]) == 2000


def test_a_jpegs_key_leaves_out_its_metadata_and_nothing_else():
    """A JPEG's exact key (``jpeg_key``) is the same with an EXIF block and a comment
    added, and another for other pixels, other tables, or bytes that do not parse."""
    photo = _photo("coffee").resize((96, 64))
    plain = _jpeg(photo)
    out = io.BytesIO()
    photo.save(out, "JPEG", quality=95, exif=b"Exif\0\0" + bytes(40), comment=b"kept out")
    assert out.getvalue() != plain and fingerprint.jpeg_key(out.getvalue()) == fingerprint.jpeg_key(
        plain
    )
    others = [_jpeg(photo.rotate(180)), _jpeg(photo, quality=94), plain[:-2], b"\xff\xd8\xff"]
    keys = {fingerprint.jpeg_key(data) for data in [plain, *others]}
    assert len(keys) == 1 + len(others)


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 3), (5, 7, 4), (300, 200)])
def test_an_arrays_key_is_the_key_of_the_image_made_of_it(shape):
    """The key taken from an array (``of_array``), kept in a shard's record, equals the
    one taken from its PIL image, as a file of it gives."""
    array = np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8)
    for source in (array, array[::-1]):  # and not contiguous
        pixels = np.ascontiguousarray(source)
        image = Image.fromarray(pixels[:, :, 0] if shape[2:] == (1,) else pixels)
        key, view = fingerprint.of_array(source, image)
        record = fingerprint.shard_record([key], [view], [0], ["f"], [0])
        assert int(record["exact"][0]) == fingerprint.exact_key(image)


def _shards(images: list, split: str = "train") -> list:
    """The check's input for ``images`` (2-D uint8 arrays), as one shard of ``split``."""
    pil = [Image.fromarray(a) for a in images]
    record = fingerprint.shard_record(
        [fingerprint.exact_key(i) for i in pil],
        [fingerprint.view(i) for i in pil],
        [0] * len(pil),
        [f"{split}/{i}" for i in range(len(pil))],
        [16] * len(pil),
    )
    return [(split, f"{split}-00000-of-00001.tfrecord", {"fingerprints": record})]


@settings(max_examples=15, deadline=None)
@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9))))
def test_any_tiny_image_and_its_copy_make_one_exact_group(image):
    """1x1 images, one colour, odd sizes: a result, never an error."""
    _, groups, report = duplicates.check(_shards([image, image.copy()]), ["c"])
    assert [len(g) for g in groups] == [2] and report["num_exact_groups"] == 1


def test_images_of_one_colour_group_only_when_equal():
    flat = [np.full((8, 8), v, np.uint8) for v in (0, 0, 90, 255)]
    _, groups, report = duplicates.check(_shards(flat), ["c"])
    assert [sorted(g) for g in groups] == [[0, 1]] and report["flat_images"] == 4


@pytest.mark.slow  # ~3 s alone, 10 s on a loaded machine: numpy over 100,000 rows
def test_a_hundred_thousand_copies_are_one_group():
    """100,000 copies of one 2x2 image (fingerprinted once), 10,000 in validation: one
    group, 100 members listed, found in well under a second's worth of search."""
    ((_, _, one),) = _shards([np.array([[0, 255], [255, 0]], np.uint8)])
    shards = []
    for split, n in (("train", 90_000), ("validation", 10_000)):
        arrays = {k: v for k, v in one["fingerprints"].items() if isinstance(v, np.ndarray)}
        part = {k: np.repeat(v, n, axis=0) for k, v in arrays.items()}
        part.update(files=[f"{split}/{i}" for i in range(n)])
        shards.append((split, f"{split}-00000-of-00001.tfrecord", {"fingerprints": part}))
    _, groups, report = duplicates.check(shards, ["c"])
    (group,) = report["groups"]
    assert group["size"] == 100_000 and len(group["members"]) == duplicates.MAX_LISTED
    assert group["kind"] == "exact" and group["leak"]
    assert report["leaked_images"] == {"validation": 10_000}
