"""Every random stream id of the input pipeline, in one table.

Randomness is drawn from stateless keys, and each kind of draw takes its own stream id of the
key, so that draws never share values. There are two kinds of key: an example's seed (a
function of the seed, the epoch and the example's position: ``host_ops.example_seed``), and an
epoch's key (the in-memory path draws whole vectors per epoch: ``memory.py``). The
augmentation policies' draws (``augment.py``) are made from either, so their ids must stay
clear of both. ``tests/data/test_augment.py`` keeps the table collision-free. A new kind of draw is
one new id here; the numbers of existing ones never change (runs would not repeat).
"""

# Draws from an example's seed (host_ops.py).
EXAMPLE = {
    "flip": 1,
    "mix_kind": 2,
    "gamma_a": 3,
    "gamma_b": 4,
    "cut_y": 5,
    "cut_x": 6,
    "alternating_flip": 7,  # from the example's origin, not its position: see host_ops
}
# Draws from an epoch's key, one vector per epoch (memory.py); class and member: balanced
# sampling's class of each position, then its example (sampling.py).
EPOCH = {
    "order": 1,
    "flip": 2,
    "crop": 3,
    "mix_kind": 4,
    "gamma_a": 5,
    "gamma_b": 6,
    "cut_y": 7,
    "cut_x": 8,
    "class": 9,
    "member": 10,
    "alternating_flip": 11,  # one vector over the examples, from (seed, epoch 0)
}
# The augmentation policies' draws (augment.py), from either kind of key.
AUGMENT = {
    "choice": 16,
    "apply": 17,
    "level": 18,
    "sign": 19,
    "erase": 20,
    "area": 21,
    "aspect": 22,
    "erase_y": 23,
    "erase_x": 24,
    "noise": 25,
}


def collisions() -> list[str]:
    """Ids used twice within one kind of key (the policies' count in both): [] when clear."""
    found = []
    for name, table in (("example", EXAMPLE), ("epoch", EPOCH)):
        ids = [*table.values(), *AUGMENT.values()]
        found += [f"{name} key: id {i} twice" for i in sorted(set(ids)) if ids.count(i) > 1]
    return found
