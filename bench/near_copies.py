"""How many planted near-copies the converter's duplicate check finds, by transformation x
original size x format, and how many false groups it makes among distinct photos.

    python bench/near_copies.py [--per_cell=60] [--distinct=1200] [--sizes=28,48,...]

The photos are tiles cut from real photographs that no test uses: the 12 nature photos and
one painting of Debian's ``mate-backgrounds`` (1280-2560 px; ``apt-get install
mate-backgrounds``), matplotlib's ``grace_hopper.jpg`` and scikit-image's ``motorcycle_left``
and ``retina`` (the tests use scikit-image's other photos). A tile is a region of a photo
(aspect 3:4 to 4:3, 0.8-8 times the tile's size, at most 400 px for the originals and 250 px
for the distinct tiles) resized to its size with Lanczos; no two originals' regions overlap,
nor two distinct tiles'. Smooth tiles are left out: an 8x8 thumbnail with under 1 grey level
of detail beyond its 3x3 local means (``crops.fine``: gradients, bokeh; a few % of these
photos' regions, alike wherever they are cut, and a crop of one looks like any other).

Each original is stored as the format says (JPEG at quality 90, stored by the converter as it
is; PNG; a raw uint8 array, as .npz/IDX/CIFAR inputs give them) and so is its copy, made by
tests/planted.py (the tests plant theirs with it too):

  q60     decoded, saved as JPEG at quality 60, decoded again
  resize  resized to 80-120% (uniform), bicubic
  crop    each side cut by 0-5% of it (uniform, independently)
  crop5   one side (random) cut by 5%
  flip    mirrored left to right
  all     resize, crop, flip and q60, in that order

A copy counts as found when the check puts it in its original's group. For each format and
transformation, the check runs once over every size's originals and copies together with the
distinct tiles that overlap no original beside them, through the converter's own worker code
(``encode.encode_image``, ``fingerprint.Collector``, ``duplicates.check``), as a conversion
would: the JPEG's draft, the arrays' path. A group holding two tiles from regions that do not
overlap is false; every tile, copy or not, keeps its region.

The distinct set: ``--distinct`` more tiles of mixed sizes and formats; every group among
them alone is false.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np
from PIL import Image

from tfgpu.convert import columns, crops, duplicates, encode, fingerprint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the copies (planted.py)
import planted  # noqa: E402
from calibration import calibration  # noqa: E402

MATE = "/usr/share/backgrounds/mate"
SIZES = (28, 48, 64, 100, 160, 300, 500)
FORMATS = ("jpeg", "png", "raw")
TRANSFORMS = ("q60", "resize", "crop", "crop5", "flip", "all")
MIN_DETAIL = 1.0  # grey levels: smoother tiles are left out (see above)


def photo_paths() -> list:
    """The bench's photos; exits with one line when Debian's photos are missing."""
    mate = sorted(glob.glob(f"{MATE}/nature/*.jpg")) + [f"{MATE}/abstract/Elephants.jpg"]
    if len(mate) < 13 or not all(os.path.exists(p) for p in mate):
        raise SystemExit(
            "this benchmark cuts its tiles from Debian's photos: apt-get install mate-backgrounds"
        )
    import matplotlib
    import skimage

    others = [
        os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg"),
        os.path.join(os.path.dirname(skimage.__file__), "data", "motorcycle_left.png"),
        os.path.join(os.path.dirname(skimage.__file__), "data", "retina.jpg"),
    ]
    return mate + others


class Tiles:
    """Tiles cut from ``photos`` (uint8 RGB arrays) at random, from regions 0.8-8 times
    their size and at most ``span`` px, none overlapping another cut by the same ``Tiles``;
    each tile's region is (photo, x, y, width, height)."""

    def __init__(self, photos: list, seed: int, span: int):
        self.photos, self.rng, self.span = photos, np.random.default_rng(seed), span
        self.taken = [[] for _ in photos]

    def cut(self, size: int, count: int) -> list:
        """[(tile, region)] of ``count`` tiles whose shorter side is ``size``."""
        out, tries = [], 0
        while len(out) < count and tries < 200 * count:
            tries += 1
            tile = self._one(size)
            if tile is not None:
                out.append(tile)
        return out

    def _one(self, size: int):
        k = int(self.rng.integers(len(self.photos)))
        photo = self.photos[k]
        aspect = np.exp(self.rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        w, h = (size, round(size * aspect)) if aspect > 1 else (round(size / aspect), size)
        most = min(photo.shape[0] / h, photo.shape[1] / w, 8.0, self.span / size)
        if most < 0.8:
            return None
        zoom = np.exp(self.rng.uniform(np.log(min(1.0, most)), np.log(most)))
        rw, rh = int(w * zoom), int(h * zoom)
        x = int(self.rng.integers(0, photo.shape[1] - rw + 1))
        y = int(self.rng.integers(0, photo.shape[0] - rh + 1))
        if any(_overlap((x, y, rw, rh), box) > 0 for box in self.taken[k]):
            return None
        tile = Image.fromarray(photo[y : y + rh, x : x + rw]).resize((w, h), Image.LANCZOS)
        tile = np.asarray(tile)
        if _detail(tile) < MIN_DETAIL:
            return None
        self.taken[k].append((x, y, rw, rh))
        return tile, (k, x, y, rw, rh)


def _overlap(a: tuple, b: tuple) -> float:
    """Regions (x, y, width, height)' intersection over their union."""
    w = max(0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


def _detail(tile: np.ndarray) -> float:
    """The check's measure of a tile's detail (its 8x8 thumbnail against a plane)."""
    gray = np.asarray(Image.fromarray(tile).convert("L"))
    small = fingerprint.small(columns.thumbnails([(gray, gray.shape, 1)]))
    return float(crops.fine(crops._eighths(small))[0])


def fingerprinted(tiles: list, fmt: str) -> list:
    """Each tile's (exact key, view), from the converter's own worker code."""
    looks = []
    for tile in tiles:
        look: list = []
        encode.encode_image(planted.stored(tile, fmt), look=look)
        looks.append(look)
    return looks


def check(looks: list) -> tuple:
    """(groups, CPU seconds, report) of the duplicate check over ``looks`` (one shard)."""
    collector = fingerprint.Collector()
    for n, (key, view) in enumerate(looks):
        collector.add(key, view, 0, str(n), 0)
    shard = ("train", "train-00000-of-00001.tfrecord", {"fingerprints": collector.record()})
    start = time.process_time()
    _, groups, report = duplicates.check([shard], ["c"])
    return groups, time.process_time() - start, report


def false_groups(groups: list, regions: list) -> int:
    """Groups holding two tiles whose regions do not overlap."""
    return sum(
        any(
            regions[a][0] != regions[b][0] or _overlap(regions[a][1:], regions[b][1:]) == 0
            for a in group
            for b in group
        )
        for group in groups
    )


def recall_table(originals: dict, distinct: list, rng) -> None:
    """Prints the found/planted table, one check per format and transformation, with the
    distinct tiles that overlap no original beside them."""
    taken = [r for size in originals for _, r in originals[size]]
    distinct = [
        (t, r)
        for t, r in distinct
        if not any(r[0] == o[0] and _overlap(r[1:], o[1:]) > 0 for o in taken)
    ]
    background = [t for t, _ in distinct]
    print(f"{'':>14}" + "".join(f"{s:>9}" for s in originals))
    for fmt in FORMATS:
        base = [t for size in originals for t, _ in originals[size]]
        regions = [r for size in originals for _, r in originals[size]]
        base_looks = fingerprinted(base + background, fmt)
        for how in TRANSFORMS:
            copies = [planted.copy(t, how, rng) for t in base]
            groups, seconds, _ = check(base_looks + fingerprinted(copies, fmt))
            print(_row(fmt, how, groups, originals, len(base) + len(background), seconds))
            all_regions = regions + [r for _, r in distinct] + regions
            bad = false_groups(groups, all_regions)
            if bad:
                print(f"{'':>14}false groups: {bad}")


def _row(fmt: str, how: str, groups: list, originals: dict, first_copy: int, seconds) -> str:
    """One line: for each size, the share of copies grouped with their original."""
    group_of = {m: g for g, members in enumerate(groups) for m in members}
    cells, at = [], 0
    for size in originals:
        n = len(originals[size])
        found = sum(
            group_of.get(at + k, -1) == group_of.get(first_copy + at + k, -2) for k in range(n)
        )
        cells.append(f"{100 * found / max(n, 1):8.0f}%")
        at += n
    return f"{fmt:>5} {how:>7} " + "".join(cells) + f"   (check {seconds:.2f} CPU s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per_cell", type=int, default=60, help="originals per size")
    parser.add_argument("--distinct", type=int, default=1200, help="distinct tiles")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("calibration:", calibration())
    photos = [np.asarray(Image.open(p).convert("RGB")) for p in photo_paths()]
    sizes = [int(s) for s in args.sizes.split(",")]
    cutter, originals = Tiles(photos, args.seed, span=400), {}
    for size in sorted(sizes, reverse=True):  # the largest first, while there is room
        originals[size] = cutter.cut(size, args.per_cell)
    originals = {s: originals[s] for s in sizes}
    cutter = Tiles(photos, args.seed + 1, span=250)
    distinct = [tile for _ in range(args.distinct) for tile in cutter.cut(_draw(cutter), 1)]
    rng = np.random.default_rng(args.seed)
    looks = [
        look
        for n, (tile, _) in enumerate(distinct)
        for look in fingerprinted([tile], FORMATS[n % 3])
    ]
    groups, seconds, report = check(looks)
    counts = {s: len(t) for s, t in originals.items()}
    print(f"originals per size: {counts}; distinct tiles: {len(distinct)}")
    print(
        f"distinct tiles (sizes {min(sizes)}-{max(sizes)}, JPEG/PNG/raw in turn): "
        f"{len(groups)} groups ({false_groups(groups, [r for _, r in distinct])} false) "
        f"among {len(distinct)}; check {seconds:.2f} CPU s; cropped copies "
        + report["method"]["cropped"].rpartition("; ")[2]
    )
    print("planted copies found (grouped with their original), by original size:")
    recall_table(originals, distinct, rng)


def _draw(cutter: Tiles) -> int:
    """A distinct tile's size: small ones mostly, as there is room for them."""
    return int(cutter.rng.choice(SIZES, p=[0.3, 0.25, 0.2, 0.15, 0.07, 0.02, 0.01]))


if __name__ == "__main__":
    main()
