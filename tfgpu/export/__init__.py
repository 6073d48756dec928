"""``python -m tfgpu.export``: the documented module path of ``tfgpu-export``
(``tfgpu.cli.export``; the library is ``tfgpu.inference.export``)."""
