"""checkpoint.network.restore_newest: a run's newest checkpoint read whole while its trainer
deletes it (--keep_checkpoints) — through hard links made before the read."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu.checkpoint import network


def _model(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def _write(folder, seed: int, step: int) -> str:
    """A checkpoint of a freshly seeded model at ``step`` in ``folder``/checkpoints, as the
    trainer writes them (model and step, through a CheckpointManager keeping them all)."""
    model = _model(seed)
    step_var = tf.Variable(step, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, step=step_var)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(folder, "checkpoints"), None)
    return manager.save(checkpoint_number=step), model.get_weights()


def _reader():
    return network.Network(_model(99), None, None)


def test_a_pinned_checkpoint_reads_whole_after_the_trainer_deletes_it(tmp_path):
    path, weights = _write(tmp_path, seed=1, step=7)
    net = _reader()
    with network._pinned(path) as readable:
        for f in os.listdir(tmp_path / "checkpoints"):
            if f.startswith("ckpt-7."):
                os.remove(tmp_path / "checkpoints" / f)  # the trainer moved on
        assert network.restore(net, readable) == 7
    for got, want in zip(net.model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)
    assert os.listdir(tmp_path / "checkpoints") == ["checkpoint"]  # no pins left


def test_a_checkpoint_gone_before_it_is_pinned_is_followed_to_the_newest(tmp_path):
    old, _ = _write(tmp_path, seed=1, step=3)
    _, newest = _write(tmp_path, seed=2, step=4)
    for f in os.listdir(tmp_path / "checkpoints"):
        if f.startswith("ckpt-3."):
            os.remove(tmp_path / "checkpoints" / f)
    with network._pinned(old) as readable:
        assert readable is None
    net = _reader()
    step, path = network.restore_newest(net, old, str(tmp_path))
    assert (step, os.path.basename(path)) == (4, "ckpt-4")
    for got, want in zip(net.model.get_weights(), newest):
        np.testing.assert_array_equal(got, want)


def test_where_no_hard_link_can_be_made_the_checkpoint_is_read_in_place(tmp_path, monkeypatch):
    path, weights = _write(tmp_path, seed=1, step=5)

    def refused(*_):
        raise PermissionError("no hard links here")

    monkeypatch.setattr(os, "link", refused)
    with network._pinned(path) as readable:
        assert readable == path
    net = _reader()
    assert network.restore_newest(net, path, str(tmp_path)) == (5, path)
    for got, want in zip(net.model.get_weights(), weights):
        np.testing.assert_array_equal(got, want)


def test_a_damaged_newest_checkpoint_is_an_error_naming_it(tmp_path):
    path, _ = _write(tmp_path, seed=1, step=2)
    with open(path + ".index", "wb") as f:
        f.write(b"not an index")
    with pytest.raises(network.CheckpointError, match="ckpt-2 does not read back"):
        network.restore_newest(_reader(), path, str(tmp_path))
    assert not [f for f in os.listdir(tmp_path / "checkpoints") if f.startswith(".tfgpu-read")]
