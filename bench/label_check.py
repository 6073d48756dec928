"""What the reader's label check costs per record (issue 48): ``DataSpec.parse`` of a block of
256 records (the pipeline's unit) with the check that names a label outside [0, num_classes)
by shard and record, against ``parse_example`` alone, host CPU per record, in alternating
rounds (the machine is shared: the two are measured side by side).

    python bench/label_check.py [--record_bytes=100] [--rounds=5] [--calls=2000]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from calibration import calibration  # noqa: E402

BLOCK = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record_bytes", type=int, default=100, help="encoded image bytes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="blocks parsed per round")
    args = parser.parse_args()
    import tensorflow as tf

    from tfgpu.data import broken
    from tfgpu.data.spec import DataSpec
    from tfgpu.data.recordformat import encode_example, parse_example

    print(calibration())
    rng = np.random.default_rng(0)
    records = tf.constant(
        [
            encode_example(rng.bytes(args.record_bytes), i % 10, 355, 480, "JPEG", f"{i}.jpg")
            for i in range(BLOCK)
        ]
    )
    origin = broken.origin(tf.zeros([BLOCK], tf.int64), tf.range(BLOCK, dtype=tf.int64))
    spec = DataSpec("", 10, 0, (), (), 1, 1)
    files = [f"/data/train-{i:05d}-of-01024" for i in range(1024)]
    contenders = {
        "with the check": tf.function(lambda r, o: spec.parse(r, o, files)["label"]),
        "parse_example alone": tf.function(lambda r, o: parse_example(r)["label"]),
    }
    times = {name: [] for name in contenders}
    for f in contenders.values():
        f(records, origin)  # traced outside the timing
    for _ in range(args.rounds):
        for name, f in contenders.items():
            start = time.process_time()
            for _ in range(args.calls):
                f(records, origin)
            times[name].append((time.process_time() - start) / (args.calls * BLOCK) * 1e6)
    for name, t in times.items():
        print(f"{name}: {np.median(t):.3f} µs CPU/record, median [{min(t):.3f}-{max(t):.3f}]")
    extra = np.median(times["with the check"]) - np.median(times["parse_example alone"])
    print(f"the check: {extra:+.3f} µs CPU/record ({args.record_bytes}-byte images)")


if __name__ == "__main__":
    main()
