"""What a run leaves in --model_dir, and what it prints. Only the chief writes.

config.json, metrics.jsonl (one JSON object per logged step or evaluation), tensorboard/,
summary.json, final.weights.h5 and export/ (model.keras and a SavedModel taking uint8).
"""

import datetime
import json
import os
import sys

import keras
import tensorflow as tf


def _atomic_json(path: str, obj) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def default_model_dir() -> str:
    """A new folder under runs/, named by the time."""
    return os.path.join("runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


class RunWriter:
    """Writes the run's files and progress lines; a no-op on non-chief workers."""

    def __init__(self, model_dir: str, is_chief: bool):
        self.model_dir, self.is_chief = model_dir, is_chief
        if is_chief:
            os.makedirs(model_dir, exist_ok=True)
            tb = os.path.join(model_dir, "tensorboard")
            self._tb = {
                s: tf.summary.create_file_writer(os.path.join(tb, s)) for s in ("train", "eval")
            }

    def info(self, line: str) -> None:
        if self.is_chief:
            print(line, flush=True)

    def write_config(self, config, backend) -> None:
        if self.is_chief:
            resolved = dict(
                config.to_dict(), strategy=backend.name, num_replicas=backend.num_replicas
            )
            _atomic_json(os.path.join(self.model_dir, "config.json"), resolved)

    def _append(self, record: dict, split: str) -> None:
        with open(os.path.join(self.model_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        with self._tb[split].as_default(step=record["step"]):
            for key, value in record.items():
                if key not in ("step", "split") and isinstance(value, (int, float)):
                    tf.summary.scalar(key, value)
        self._tb[split].flush()

    def log_train(self, record: dict, line: str) -> None:
        if self.is_chief:
            self._append(record, "train")
            print(line, flush=True)

    def log_eval(self, step: int, result: dict) -> None:
        if self.is_chief and result:
            self._append(dict(result, step=step, split="validation"), "eval")
            print(
                f"eval  step {step}: top1 {result['top1']:.4f}  top5 {result['top5']:.4f}  "
                f"loss {result['loss']:.4f}  ({result['num_examples']} examples)",
                flush=True,
            )

    def write_summary(self, summary: dict) -> None:
        if self.is_chief:
            _atomic_json(os.path.join(self.model_dir, "summary.json"), summary)
            print("summary: " + json.dumps(summary), file=sys.stdout, flush=True)


def format_progress(record: dict, total_steps: int, global_batch: int) -> str:
    """``step   200/600  loss 0.4123  acc 0.871  lr 1.8e-03  2,345 img/s  ETA 0:01:20``."""
    ips = record["images_per_sec"]
    remaining = (total_steps - record["step"]) * global_batch / max(ips, 1e-9)
    width = len(str(total_steps))
    return (
        f"step {record['step']:>{width}}/{total_steps}  loss {record['loss']:.4f}  "
        f"acc {record['accuracy']:.3f}  lr {record['learning_rate']:.2e}  "
        f"{ips:,.0f} img/s  ETA {datetime.timedelta(seconds=int(remaining))}"
    )


def export_model(model: keras.Model, directory: str, image_size: int) -> None:
    """Saves ``model.keras`` and a SavedModel whose ``serve`` signature takes uint8 images
    [N, image_size, image_size, 3] and returns float32 logits."""
    os.makedirs(directory, exist_ok=True)
    model.save(os.path.join(directory, "model.keras"))
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve",
        lambda images: model(tf.cast(images, tf.float32), training=False),
        input_signature=[tf.TensorSpec([None, image_size, image_size, 3], tf.uint8, name="images")],
    )
    archive.write_out(os.path.join(directory, "saved_model"), verbose=False)
