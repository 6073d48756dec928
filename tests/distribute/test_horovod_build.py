"""tfgpu-horovodrun's build checks: Horovod's TensorFlow extension library answers as
horovod.tensorflow does, and horovodrun's own check answers where the library gives nothing."""

from requires import requires

from tfgpu import compat
from tfgpu.distribute import horovod_build


def test_the_library_answers_as_horovod_tensorflow_and_horovodrun_gets_it(monkeypatch):
    requires("horovod")
    import horovod.runner.launch as launch  # noqa: PLC0415 (optional: after requires)
    import horovod.tensorflow as hvd  # noqa: PLC0415 (TensorFlow is imported here already)

    for name in ("gloo_built", "mpi_built"):
        monkeypatch.setattr(launch, name, getattr(launch, name))  # put back afterwards
    compat.replace_horovod_build_checks(horovod_build.built_check)
    # The library's own answers (not Horovod's fallback), and horovodrun gets them.
    assert horovod_build.extension_says("gloo") is hvd.gloo_built() is launch.gloo_built()
    assert horovod_build.extension_says("mpi") is hvd.mpi_built() is launch.mpi_built()


def test_where_the_library_gives_no_answer_horovods_own_check_answers():
    asked = []
    # No horovod_unbuilt_built in the library (nor a library, without Horovod): no answer.
    built = horovod_build.built_check("unbuilt", lambda verbose=False: asked.append(verbose) or 7)
    assert built(verbose=True) == 7 and asked == [True]
