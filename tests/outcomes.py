"""Property tests that say what they claim: "any input is accepted or refused in one line"
passes as well when every input is refused, so it shows nothing about acceptance unless some
inputs were. ``@expects("accepted", "refused")`` above ``@given`` runs the property and then
fails unless each outcome happened at least once; the property calls ``outcome(name)`` per
example (also a Hypothesis ``event``, in ``--hypothesis-show-statistics``). The strategies
then have to generate valid inputs too, beside hostile ones.
"""

import collections
import contextvars
import functools

from hypothesis import event

_SEEN = contextvars.ContextVar("outcomes")


def outcome(name: str) -> None:
    """Counts one example's outcome (inside a test decorated with ``expects``)."""
    _SEEN.get()[name] += 1
    event(name)


def expects(*names: str):
    """Decorates a ``@given`` test: after it ran, each of ``names`` was an outcome at least
    once (else AssertionError with the counts); an outcome not named is an error too."""

    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            seen = collections.Counter()
            token = _SEEN.set(seen)
            try:
                test(*args, **kwargs)
            finally:
                _SEEN.reset(token)
            assert set(seen) <= set(names), f"outcomes {sorted(set(seen) - set(names))}?"
            missing = [name for name in names if not seen[name]]
            assert not missing, f"no example was {missing}: {dict(seen)}"

        return run

    return decorate
