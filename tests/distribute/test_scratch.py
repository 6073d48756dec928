"""A non-chief's scratch directories are gone when the heartbeat watcher ends the process,
also while the main thread is saving into one (distribute/scratch.py). The fresh-clone CI run
of 3ad00d2 found a worker's scratch directory left after such an end."""

import os
import threading

import pytest

from tfgpu.distribute import scratch

pytestmark = pytest.mark.fast


def _saving(directory: str, stop: threading.Event) -> threading.Thread:
    """A thread that keeps writing small files into ``directory`` (as a checkpoint's save
    does) until it is gone or ``stop`` is set."""

    def save() -> None:
        i = 0
        while not stop.is_set():
            try:
                with open(os.path.join(directory, f"part-{i}"), "wb") as f:
                    f.write(b"x" * 64)
            except FileNotFoundError:  # removed under it
                return
            i += 1

    thread = threading.Thread(target=save, daemon=True)
    thread.start()
    return thread


def test_removed_while_a_save_writes_into_it():
    for _ in range(20):
        directory = scratch.scratch_dir("tfgpu-test-scratch-")
        stop = threading.Event()
        saver = _saving(directory, stop)
        while saver.is_alive() and len(os.listdir(directory)) < 200:  # the save well under way
            pass
        assert saver.is_alive(), "the save stopped before the removal"  # not a hang either
        scratch.remove_scratch_dirs()
        stop.set()
        saver.join()
        assert not os.path.exists(directory) and not os.path.exists(directory + ".removing")


def test_removed_when_idle_and_none_left_to_remove():
    directories = [scratch.scratch_dir("tfgpu-test-scratch-") for _ in range(3)]
    open(os.path.join(directories[0], "ckpt-1.index"), "w").close()
    scratch.remove_scratch_dirs()
    assert not any(os.path.exists(d) or os.path.exists(d + ".removing") for d in directories)
    scratch.remove_scratch_dirs()  # nothing left: nothing to do
