"""The errors a tfgpu command stops with, each carrying its exit code, and the one way every
command (``tfgpu.main``, ``tfgpu.launch``, ``tfgpu-to-tfrecord``, ``tfgpu-data-service``) turns
them into one line on stderr and that code (docs/faults.md: the table of faults).

No TensorFlow here: commands report bad flags before TensorFlow starts. Errors that come from
TensorFlow ops are translated into one of these, in words (``op_error_cause``), by the module
that knows what failed; an error tfgpu does not know keeps its full traceback.
"""

import errno
import os
import re
import sys

EXIT_USAGE = 2


class TfgpuError(Exception):
    """An error the user can act on; its first argument is one line saying what and where."""

    exit_code = 1

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__

    def line(self, prog: str) -> str:
        """What ``prog`` prints for it: one line."""
        return f"{prog}: error: {self.message}"


class UsageError(TfgpuError, ValueError):
    """A flag or an argument that is wrong (or a port that is taken)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A setting (or combination) that cannot work; raised before TensorFlow starts."""


class DataError(UsageError):
    """A dataset that cannot be read as asked; the message is one line naming the file or flag."""


class DistributeError(UsageError):
    """A cluster description (TF_CONFIG, Slurm, horovodrun) that cannot work as asked."""


class ConvertError(TfgpuError):
    """A conversion that cannot go on; the message is one line for the user. (Not a
    ValueError: the converter's ``except ValueError`` around parsing must not catch it.)"""

    exit_code = EXIT_USAGE


class NonFiniteLoss(TfgpuError, FloatingPointError):
    """The loss went NaN or infinite; checkpoints are left as they were."""

    exit_code = 3

    def line(self, prog: str) -> str:
        return f"{prog}: error: {self.message}; the last good checkpoint is kept"


class CheckpointError(TfgpuError, RuntimeError):
    """The final checkpoint could not be written, or none of those there reads back."""

    exit_code = 4


class WorkerLost(TfgpuError):
    """Another worker died or froze; run again (all workers) to resume."""

    exit_code = 5


class ExportRefused(TfgpuError):
    """An exported model that departs from the Keras model beyond its tolerance
    (``tfgpu-export``'s check): it is left unchecked beside the output, not at it."""

    exit_code = 6


class OutOfMemory(TfgpuError, MemoryError):
    """The device ran out of memory and the run cannot back off (no --micro_batch_size=auto,
    nothing smaller left, or several processes); the line says what to set."""

    exit_code = 7


class Preempted(TfgpuError):
    """The run was asked to stop (SIGTERM/SIGINT) and saved a checkpoint; run it again."""

    exit_code = 75  # EX_TEMPFAIL

    def line(self, prog: str) -> str:
        return f"{prog}: {self.message}; run the same command again to resume"


# How a user installs what an optional part of tfgpu needs: tfgpu is installed from its source
# folder (README: Install), so an extra is ``pip install '.[EXTRA]'`` there; Horovod is built
# against the installed TensorFlow by a script of its own.
INSTALL_HOROVOD = "bash tools/install_horovod.sh"


def install_extra(extra: str) -> str:
    """The command that installs tfgpu's optional ``extra`` (setup.cfg's extras_require):
    ``pip install '.[ray]'`` in tfgpu's folder."""
    return f"pip install '.[{extra}]' in tfgpu's folder"


def say(line: str) -> None:
    """Writes ``line`` and its newline to stderr in one write. The processes of one launch
    share a stream (mpirun forwards their stderr as it comes), and print() writes the two
    apart (stderr writes through): two workers' lines at once ran into one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def warn(message: str, prog: str = "tfgpu") -> None:
    """Says ``message`` as ``prog``'s warning line (``say``)."""
    say(f"{prog}: WARNING: {message}")


_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\]\s*$")
_OS_REASONS = sorted({os.strerror(code) for code in errno.errorcode}, key=len, reverse=True)


def first_line(err: BaseException, limit: int = 0) -> str:
    """The first line of ``err``'s message (its type's name when it has none), cut to
    ``limit`` characters (0: whole): what a one-line error quotes of a library's own."""
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return line[:limit] if limit else line


def op_error_cause(err: BaseException) -> str:
    """Why an OSError or a TensorFlow OpError failed, in words: its OS reason ("No space left
    on device") when it has one, else its first line without TensorFlow's function-node
    prefix, op suffix and temp-file paths."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = getattr(err, "message", None) or str(err)
    text = _OP_SUFFIX.sub("", _FUNCTION_NODE.sub("", (text.strip().splitlines() or [""])[0]))
    reason = next((r for r in _OS_REASONS if r in text), None)
    if reason:
        return reason
    words = [w for w in text.split() if "_temp" not in w and ".tempstate" not in w]
    return " ".join(words).strip(" ;:") or type(err).__name__
