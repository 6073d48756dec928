"""The order in which ``make test`` hands modules to its pytest-xdist workers
(conftest.spread): the modules that start processes first, then those with slow tests, then
the fast ones; a module's tests stay together (``--dist loadfile`` keeps them on one worker)."""

import types

import pytest
from conftest import spread


class _Item:
    """What spread reads of a pytest item: its module and its markers."""

    def __init__(self, module, *marks):
        self.module, self.marks = module, {name: getattr(pytest.mark, name).mark for name in marks}

    def get_closest_marker(self, name):
        return self.marks.get(name)


def _module(name, **names):
    return types.SimpleNamespace(__name__=name, **names)


def test_modules_that_start_processes_go_first_and_stay_together():
    quick = _module("test_quick")
    trains = _module("test_trains")
    launches = _module("test_launches", subprocess=types.ModuleType("subprocess"))  # a stand-in
    items = [
        _Item(quick, "fast"),
        _Item(trains, "slow"),
        _Item(launches, "slow", "skip"),  # a skipped heavy test weighs nothing
        _Item(trains, "slow"),
        _Item(quick, "fast"),
        _Item(launches, "slow"),
    ]
    names = [item.module.__name__ for item in items]
    spread(items)
    assert [item.module.__name__ for item in items] == [
        "test_launches",
        "test_launches",
        "test_trains",
        "test_trains",
        "test_quick",
        "test_quick",
    ]
    assert sorted(names) == sorted(item.module.__name__ for item in items)


def test_more_slow_tests_first_and_the_order_within_a_module_is_kept():
    few, many = _module("test_few"), _module("test_many")
    items = [_Item(few, "slow"), _Item(many, "slow"), _Item(many, "slow")]
    second = items[2]
    spread(items)
    assert [item.module.__name__ for item in items] == ["test_many", "test_many", "test_few"]
    assert items[1] is second
