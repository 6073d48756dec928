"""Weights compared as what they are, named arrays: ``assert_same_weights(got, want)`` checks
the names, then the count and each shape, and only then the values, so a missing or extra
variable, or two lists paired in another order, fails by name (``zip`` of two lists stops at
the shorter one and says nothing).

What it takes (``named``): a run folder (its ``final.weights.h5``, named by the file's paths,
which Keras makes from each layer's place in the model, not from the process's counters), an
``.h5`` weights file (a path, or open), a Keras model or layer or a list of Keras variables
(named by position and the variable's own name: two twins built in one process have other
layer names), a dict of arrays, or a plain list of arrays (named by position).
"""

import os

import numpy as np


def _h5(path) -> dict:
    import h5py  # noqa: PLC0415 (as conftest's readers: only where a file is read)

    arrays = {}
    with h5py.File(path, "r") as f:
        # visititems stops at the first non-None return: the assignment's lambda returns None.
        f.visititems(
            lambda name, o: arrays.__setitem__(name, o[()]) if isinstance(o, h5py.Dataset) else None
        )
    return arrays


def _variables(variables) -> dict:
    return {f"{i}:{v.name}": np.asarray(v) for i, v in enumerate(variables)}


def named(weights) -> dict:
    """``weights`` (see the module's docstring) as an ordered {name: numpy array}."""
    if isinstance(weights, dict):
        return {k: np.asarray(v) for k, v in weights.items()}
    if isinstance(weights, (str, os.PathLike)):
        path = os.fspath(weights)
        return _h5(os.path.join(path, "final.weights.h5") if os.path.isdir(path) else path)
    if hasattr(weights, "read"):  # an open .h5 file (a .keras archive's model.weights.h5)
        return _h5(weights)
    if hasattr(weights, "weights") and not isinstance(weights, (list, tuple)):
        return _variables(weights.weights)  # a Keras model or layer
    weights = list(weights)
    if weights and hasattr(weights[0], "assign"):
        return _variables(weights)
    return {f"{i}": np.asarray(w) for i, w in enumerate(weights)}


def same_structure(got, want, what: str = "weights") -> tuple[dict, dict]:
    """``got`` and ``want`` as named arrays (``named``), checked to hold the same names in
    the same order and the same shapes: for a comparison of values of one's own."""
    got, want = named(got), named(want)
    _check_names_and_shapes(got, want, what)
    return got, want


def _check_names_and_shapes(got: dict, want: dict, what: str) -> None:
    assert want, f"{what}: nothing to compare with"
    if list(got) != list(want):
        gone, extra = [n for n in want if n not in got], [n for n in got if n not in want]
        raise AssertionError(
            f"{what}: {len(got)} weights against {len(want)}; missing {gone[:5]}, "
            f"extra {extra[:5]}" + ("" if gone or extra else ", in another order")
        )
    for name, array in got.items():
        assert array.shape == want[name].shape, (
            f"{what}: {name} has shape {array.shape}, expected {want[name].shape}"
        )


def assert_same_weights(got, want, *, atol=0.0, rtol=0.0, dtypes=True, what="weights") -> None:
    """``got`` equals ``want`` (anything ``named`` takes): same names in the same order, same
    shapes (and dtypes, unless ``dtypes=False``), values within ``atol`` + ``rtol`` (exact by
    default)."""
    got, want = same_structure(got, want, what)
    for name, array in got.items():
        if dtypes:
            assert array.dtype == want[name].dtype, (
                f"{what}: {name} is {array.dtype}, expected {want[name].dtype}"
            )
        np.testing.assert_allclose(
            array, want[name], atol=atol, rtol=rtol, err_msg=f"{what}: {name}"
        )


def largest(weights) -> float:
    """The largest absolute value in ``weights``: the scale of the contract's 1e-5 bound."""
    return max(float(np.abs(a).max()) for a in named(weights).values() if a.size)


def changed(got, before) -> list:
    """The names of the weights that differ between ``got`` and ``before`` (checked to have
    the same names and shapes first)."""
    got, before = same_structure(got, before)
    return [n for n, a in got.items() if not np.array_equal(a, before[n])]


def combined(fn, *weights) -> dict:
    """{name: fn(a, b, ...)} over weights that share names and shapes (checked): the expected
    side of a mean, a difference."""
    first, *rest = [named(w) for w in weights]
    for other in rest:
        _check_names_and_shapes(other, first, "weights")
    return {n: fn(a, *(o[n] for o in rest)) for n, a in first.items()}
