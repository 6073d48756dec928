"""tfgpu's own code never unpickles, evaluates or executes what a user supplies (what the
servers TensorFlow starts will run is docs/security.md's subject)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(
    r"\bimport pickle\b|\bpickle\.loads?\(|(?<![\w.])eval\(|(?<![\w.])exec\(|safe_mode\s*=\s*False"
    r"|yaml\.load\(|\bmarshal\.|shell\s*=\s*True|allow_pickle\s*=\s*True"
)


# The one exception, and why: CIFAR's python batches exist only as pickles. That module
# imports pickle for a restricted Unpickler that resolves numpy's array globals alone
# (tests/convert/test_convert_cifar.py feeds it pickles naming os.system and other globals).
ALLOWED = {("tfgpu/convert/inputs/cifar.py", "import pickle")}


def test_no_pickle_eval_exec_or_unsafe_loading_in_the_code():
    offenders = []
    for path in [*ROOT.glob("tfgpu/**/*.py"), *ROOT.glob("tools/**/*.py")]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (str(path.relative_to(ROOT)), line.strip()) in ALLOWED:
                continue
            if FORBIDDEN.search(line.split("#", 1)[0]):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_pattern_catches_what_it_should():
    for bad in ("x = eval(s)", "pickle.load(f)", "load_model(p, safe_mode=False)", "exec(code)"):
        assert FORBIDDEN.search(bad), bad
    for fine in ("trainer.evaluate()", "def _evaluate(self):", "safe_mode=True"):
        assert not FORBIDDEN.search(fine), fine
