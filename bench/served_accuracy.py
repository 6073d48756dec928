"""The accuracy a run's export serves: its SavedModel's ``classify_bytes`` signature fed the
validation split's raw image bytes (as a client would send them), against the run's final
evaluation in summary.json (issue 55: the number a user quotes and the model they deploy).

    python bench/served_accuracy.py --model_dir=/runs/fmnist-fast --data_dir=/data/fmnist-tfr
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

from tfgpu.config import config_from, validate
from tfgpu.data.spec import load_spec


def validation(data_dir: str, image_size: int) -> tuple[list[bytes], np.ndarray]:
    """The validation split's encoded images and labels, in the records' order."""
    spec = load_spec(validate(config_from(data_dir=data_dir, image_size=image_size)).data)
    records = tf.data.TFRecordDataset(list(spec.eval_files)).map(spec.parse)
    encoded, labels = zip(*[(e["encoded"].numpy(), int(e["label"])) for e in records])
    return list(encoded), np.array(labels)


def served_top1(saved_model: str, encoded: list[bytes], labels: np.ndarray, batch: int = 500):
    """The SavedModel's top-1 on ``encoded`` through classify_bytes, ``batch`` at a time."""
    served = tf.saved_model.load(saved_model).signatures["classify_bytes"]
    hits = 0
    for i in range(0, len(encoded), batch):
        out = served(image_bytes=tf.constant(encoded[i : i + batch]))
        hits += int(np.sum(out["top_k_indices"].numpy()[:, 0] == labels[i : i + batch]))
    return hits / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--data_dir", required=True)
    args = parser.parse_args()
    with open(os.path.join(args.model_dir, "summary.json"), encoding="utf-8") as f:
        final = json.load(f)["final_eval"]
    with open(os.path.join(args.model_dir, "config.json"), encoding="utf-8") as f:
        image_size = json.load(f)["image_size"]
    encoded, labels = validation(args.data_dir, image_size)
    top1 = served_top1(os.path.join(args.model_dir, "export", "saved_model"), encoded, labels)
    print(
        f"{args.model_dir}: the run's final evaluation {final['top1']:.4f} "
        f"(TTA {final.get('tta', 'none')}); its SavedModel serves {top1:.4f} "
        f"on the same {len(labels):,} images"
    )


if __name__ == "__main__":
    main()
