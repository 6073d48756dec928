"""Whether Horovod was built with Gloo or MPI, asked of its TensorFlow extension library.

horovodrun asks by importing horovod.tensorflow, and so all of TensorFlow, in a forked process:
~3.6-4.2 CPU-s and seconds of wall before any rank starts (measured). The answers are two C
functions of that library, which loads with TensorFlow's two C++ libraries alone (~0.5 CPU-s):
tfgpu-horovodrun hands ``built_check`` to ``compat.replace_horovod_build_checks``. Written by
hand: Horovod has no cheaper check.
"""

import ctypes
import functools
import importlib.util
import multiprocessing
import os
import sysconfig


def built_check(feature: str, horovods_own):
    """A stand-in for Horovod's ``<feature>_built(verbose=False)`` ("gloo" or "mpi"): the
    extension library's answer, else ``horovods_own``'s (where the library does not load)."""

    def built(verbose=False):
        answer = extension_says(feature)
        return horovods_own(verbose=verbose) if answer is None else answer

    return built


@functools.cache
def extension_says(feature: str):
    """Horovod's TensorFlow extension's ``horovod_<feature>_built()`` as a bool, asked in a
    forked process as Horovod asks (the libraries' start-up lines go to /dev/null there, not
    into the launcher's output); None where the library does not load."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_send_extension_answer, args=(feature, send), daemon=True)
    child.start()
    send.close()
    try:
        answer = receive.recv()
    except EOFError:  # the child died before it answered
        answer = None
    child.join()
    return answer


def _send_extension_answer(feature: str, send) -> None:
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    send.send(_extension_answer(feature))


def _extension_answer(feature: str):
    """In this process: loads TensorFlow's C++ libraries and Horovod's TensorFlow extension
    (horovod/tensorflow/mpi_lib, as horovod.tensorflow.mpi_ops names it) with ctypes and calls
    its ``horovod_<feature>_built``; None where any of them does not load."""
    try:
        tf_dir = importlib.util.find_spec("tensorflow").submodule_search_locations[0]
        hvd_dir = importlib.util.find_spec("horovod").submodule_search_locations[0]
        for library in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
            ctypes.CDLL(os.path.join(tf_dir, library), mode=ctypes.RTLD_GLOBAL)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        extension = ctypes.CDLL(os.path.join(hvd_dir, "tensorflow", "mpi_lib" + suffix))
        return bool(getattr(extension, f"horovod_{feature}_built")())
    except (OSError, AttributeError, TypeError, IndexError):
        return None
