"""What workers compare at start-up (``distribute/consensus.py``), without worker processes:
fingerprints as plain data, and one worker's start-up agreement (``train.loop.agreed_input``)
given what another one sent. tests/e2e/test_cluster.py runs real workers that disagree on a flag."""

import json

import pytest

from tfgpu.config import config_from
from tfgpu.distribute import DistributeError, consensus, heartbeats
from tfgpu.train.loop import agreed_input

ALONE = heartbeats.Watch().announced  # what a worker without heartbeats announces


def _agreed_spec(config, backend, announced):
    """The agreement of a run of ``config``, as the conductor makes it."""
    return agreed_input(config, backend, announced)


def _fingerprints(*weights, where=("host-a:1", "host-b:2")) -> list:
    """Two workers' fingerprints, equal but for their class weights."""
    settings = {"class_weights": "/shared/weights.json", "learning_rate": 0.1}
    data = {"num_classes": 3, "train_shards": ["train-00000-of-00001.tfrecord"]}
    found = [consensus.fingerprint(settings, data, "", w) for w in weights]
    return [dict(f, where=w) for f, w in zip(found, where)]


def test_class_weights_that_differ_are_one_line_naming_the_field_and_the_workers():
    message = consensus.disagreement(_fingerprints([1.0, 2.0, 1.0], [1.0, 2.5, 1.0]))
    assert message.startswith("the workers disagree on the class weights (--class_weights): ")
    assert "on worker 0 (host-a:1)" in message and "on worker 1 (host-b:2)" in message
    assert "\n" not in message


@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 0.5]])
def test_equal_class_weights_agree(weights):
    assert consensus.disagreement(_fingerprints(weights, weights and list(weights))) == ""


def test_weights_and_none_disagree():
    assert "class weights" in consensus.disagreement(_fingerprints(None, [1.0, 1.0, 1.0]))


class _Gather:
    """A backend of 2 workers whose all-gather returns this worker's blob, then ``theirs``
    (this worker's again when None); ``sent`` is the blob it was given."""

    num_workers, num_replicas, is_chief = 2, 2, True

    def __init__(self, theirs: bytes | None = None):
        self.theirs, self.sent = theirs, None

    def all_gather_bytes(self, blob: bytes) -> list:
        self.sent = blob
        return [blob, blob if self.theirs is None else self.theirs]


def _sent(config) -> bytes:
    """What a worker of ``config`` sends to the others at start-up."""
    backend = _Gather()
    _agreed_spec(config, backend, announced=ALONE)
    return backend.sent


def test_one_flag_naming_files_of_other_content_stops_every_worker(small_dataset, tmp_path):
    """--class_weights=FILE alike on both workers, but the file each reads differs."""
    path = tmp_path / "weights.json"
    config = config_from(data_dir=small_dataset, class_weights=str(path))
    path.write_text(json.dumps({"a": 2.0}))
    theirs = _sent(config)  # what worker 1 read
    path.write_text(json.dumps({"a": 3.0}))  # worker 0's machine holds another file
    with pytest.raises(DistributeError, match=r"disagree on the class weights \(--class_") as err:
        _agreed_spec(config, _Gather(theirs), announced=ALONE)
    assert "on worker 0 (" in str(err.value) and "on worker 1 (" in str(err.value)
    _agreed_spec(config, _Gather(_sent(config)), announced=ALONE)  # the same content: they agree


def test_a_worker_whose_class_weights_file_does_not_fit_is_named(small_dataset, tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"no-such-class": 2.0}))
    config = config_from(data_dir=small_dataset, class_weights=str(path))
    with pytest.raises(DistributeError, match="worker 0 .*'no-such-class' is not a class"):
        _agreed_spec(config, _Gather(), announced=ALONE)
