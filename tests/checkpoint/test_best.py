"""--keep_best, --best_metric, --early_stop_patience and --export_best."""

import json
import os

import keras
import numpy as np
import pytest
from weights import assert_same_weights

from tfgpu import train
from tfgpu.config import ConfigError, config_from, validate

BASE = dict(
    strategy="default",
    model="tiny_cnn",
    image_size=16,  # the claims are the best-keeping, not the model: ~10% less CPU than 32
    global_batch_size=16,
    optimizer="adam",
    learning_rate=0.003,
    weight_decay=0.0,
    lr_schedule="constant",
    random_flip=False,
    crop_min_area=0.8,
    log_every_steps=4,
    steps_per_loop=2,
    checkpoint_every_steps=4,
    eval_every_steps=2,
    seed=1,
    deterministic=True,
    input_probe_s=0.0,
    export=False,  # ~1.2 CPU-s a run (measured); the tests of the export turn it on
)


def _config(data_dir, model_dir, **kw):
    return validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(BASE, **kw)))


def _evals(model_dir) -> list[dict]:
    with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["split"] == "validation"]


@pytest.mark.fast
@pytest.mark.parametrize("flag", ["keep_best", "best_metric", "early_stop_patience"])
def test_best_flags_without_evaluations_are_one_line_errors(flag):
    value = {"keep_best": 2, "best_metric": "loss", "early_stop_patience": 3}[flag]
    with pytest.raises(ConfigError, match=f"--{flag}.*--eval_every_steps") as err:
        validate(config_from(**{flag: value}))
    assert "\n" not in str(err.value)


@pytest.mark.fast
def test_unknown_best_metric_is_named():
    with pytest.raises(ConfigError, match="--best_metric='acc' is unknown"):
        validate(config_from(best_metric="acc", eval_every_steps=2))


def test_keep_best_may_be_added_to_a_run_that_had_none(small_dataset, tmp_path, capsys):
    """A run resumed with --keep_best from checkpoints written without it: the model and
    optimizer come back, the best so far starts from this run."""
    train.run(_config(small_dataset, tmp_path, train_steps=2, eval_every_steps=0))
    summary = train.run(_config(small_dataset, tmp_path, train_steps=4, keep_best=1))
    out = capsys.readouterr().out
    assert "at step 2" in out and "it holds no best_step, best_value, evals_since_best" in out
    assert summary["steps"] == 4
    with open(os.path.join(tmp_path, "best", "best.json"), encoding="utf-8") as f:
        assert [e["step"] for e in json.load(f)["kept"]] == [4]


def test_keep_best_resumes_with_its_best_and_exports_it(small_dataset, tmp_path):
    # Run 1: evaluations at 2 and 4 (the final one); run 2 resumes at 4 and goes on to 8.
    settings = dict(keep_best=2, best_metric="loss", export_best=True)
    train.run(_config(small_dataset, tmp_path, train_steps=4, **settings))
    settings.update(export=True)  # run 2's export is checked below
    first = _evals(tmp_path)
    assert [r["step"] for r in first] == [2, 4]

    # The best so far is in the checkpoint: a Run restored from it knows it.
    from tfgpu.distribute import backends
    from tfgpu.train import loop

    config = _config(small_dataset, tmp_path, train_steps=8, **settings)
    backend = backends.setup(config.dist)
    _, _, r, _ = loop.assemble(config, backend)
    assert r.checkpoints.restore(lambda _: None) == 4
    best_first = min(first, key=lambda e: e["loss"])
    assert float(r.best.value.numpy()) == pytest.approx(best_first["loss"])
    assert int(r.best.step.numpy()) == best_first["step"]

    summary = train.run(config)
    evals = _evals(tmp_path)
    assert [r["step"] for r in evals] == [2, 4, 6, 8]
    ranked = sorted(evals, key=lambda e: e["loss"])
    doc = json.load(open(tmp_path / "best" / "best.json"))
    assert doc["metric"] == "loss" and doc["mode"] == "min"
    assert [e["step"] for e in doc["kept"]] == [e["step"] for e in ranked[:2]]
    for entry, logged in zip(doc["kept"], ranked[:2], strict=True):
        assert entry["loss"] == pytest.approx(logged["loss"])
        assert entry["top1"] == pytest.approx(logged["top1"])
        assert os.path.exists(entry["checkpoint"] + ".index")
    # Exactly the two kept checkpoints are on disk.
    on_disk = {n.split(".")[0] for n in os.listdir(tmp_path / "best") if n.startswith("ckpt-")}
    assert on_disk == {f"ckpt-{e['step']}" for e in doc["kept"]}
    assert summary["best"] == {
        "metric": "loss",
        "step": ranked[0]["step"],
        "value": pytest.approx(ranked[0]["loss"]),
    }

    # --export_best: export/model.keras holds the best checkpoint's model.
    import tensorflow as tf

    exported = keras.saving.load_model(tmp_path / "export" / "model.keras", compile=False)
    r.model.set_weights([np.zeros_like(w) for w in r.model.get_weights()])
    tf.train.Checkpoint(model=r.model).read(doc["kept"][0]["checkpoint"]).expect_partial()
    assert_same_weights(exported, r.model)


def test_early_stop_ends_cleanly_and_stays_stopped(small_dataset, tmp_path):
    # learning_rate 0: every evaluation equals the first, so none is better than it.
    settings = dict(train_steps=20, learning_rate=0.0, early_stop_patience=2)
    summary = train.run(_config(small_dataset, tmp_path, export=True, **settings))
    assert summary["stopped"] == "early_stop" and summary["stopped_at_step"] == 6
    assert summary["steps"] == 6 and summary["final_eval"]["loss"] is not None
    # The final evaluation at step 6 replaces the early stop's row of that step: one each.
    assert [r["step"] for r in _evals(tmp_path)] == [2, 4, 6]
    assert os.path.exists(tmp_path / "export" / "model.keras")
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt-6.index")
    assert json.load(open(tmp_path / "summary.json"))["stopped"] == "early_stop"
    # The same command again resumes at 6 and stops at once: the count is in the checkpoint.
    # Without --export (a resume may change it): it would write the export above once more
    # (~1 CPU-s), which nothing reads.
    again = train.run(_config(small_dataset, tmp_path, export=False, **settings))
    assert again["steps"] == 6 and again["stopped"] == "early_stop"


class _Worker:
    """A backend's verbs that ``best.Best`` uses, for one worker of two; ``chief_kept`` is
    what the chief's best.json lists (the all-gather gives every worker the chief's)."""

    def __init__(self, is_chief: bool, scratch, chief_kept: list):
        self.is_chief, self._scratch, self._kept = is_chief, str(scratch), chief_kept

    def checkpoint_dir(self, directory: str) -> str:
        return directory if self.is_chief else self._scratch

    def all_gather_bytes(self, blob: bytes) -> list:
        return [json.dumps(self._kept).encode(), blob]


def _best(tmp_path, model_dir, is_chief: bool, chief_kept: list):
    import tensorflow as tf

    from tfgpu.checkpoint.best import Best

    train = _config("", model_dir, keep_best=1, best_metric="loss").train
    (tmp_path / "scratch").mkdir(exist_ok=True)
    best = Best(train, _Worker(is_chief, tmp_path / "scratch", chief_kept), str(model_dir))
    best.checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    return best


@pytest.mark.fast
def test_a_resumed_worker_deletes_only_its_own_copies(tmp_path):
    # After a resume every worker's kept list is the chief's; on a shared disk a non-chief
    # that dropped an entry deleted the chief's files (and one of the two deletes failed).
    chief_dir = tmp_path / "chief"
    (chief_dir / "best").mkdir(parents=True)
    for suffix in (".index", ".data-00000-of-00001"):
        (chief_dir / "best" / f"ckpt-2{suffix}").write_bytes(b"x")
    kept = [dict(step=2, loss=1.0, top1=0.5, top5=1.0, checkpoint=str(chief_dir / "best/ckpt-2"))]
    worker = _best(tmp_path, tmp_path / "worker1", False, kept)
    worker.resume(4)
    assert [e["step"] for e in worker.kept] == [2]
    for step, loss in ((4, 0.5), (6, 0.25)):  # each better: the previous one is dropped
        assert worker.observe(step, {"loss": loss, "top1": 0.5, "top5": 1.0})
    assert sorted(os.listdir(chief_dir / "best")) == ["ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    assert [e["step"] for e in worker.kept] == [6]
    assert {n.split(".")[0] for n in os.listdir(tmp_path / "scratch")} == {"ckpt-6"}  # 4's gone
    assert not (tmp_path / "worker1" / "best").exists()  # only the chief writes best/


@pytest.mark.fast
def test_best_checkpoint_is_found_in_the_model_dir_by_name(tmp_path):
    # best.json holds the path the run wrote: relative to where it started, or moved since.
    from tfgpu.checkpoint.best import best_checkpoint

    (tmp_path / "moved" / "best").mkdir(parents=True)
    doc = {
        "metric": "top1",
        "mode": "max",
        "kept": [{"step": 4, "checkpoint": "runs/ft/best/ckpt-4"}],
    }
    (tmp_path / "moved" / "best" / "best.json").write_text(json.dumps(doc))
    assert best_checkpoint(str(tmp_path / "moved")) == str(tmp_path / "moved" / "best" / "ckpt-4")
    assert best_checkpoint(str(tmp_path / "nothing")) == ""
