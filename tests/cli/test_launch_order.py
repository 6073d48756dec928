"""tfgpu-launch's "worker N failed first": the worker that ended first, not the lowest index
among those ended when the launcher looked (cli/launch.wait_all)."""

import signal
import subprocess

from tfgpu.cli import launch


def _workers(*scripts: str) -> list:
    """One ``sh -c`` process per script: workers that end as the script says."""
    return [subprocess.Popen(["sh", "-c", script]) for script in scripts]


def test_the_first_to_end_is_named_when_two_end_within_one_look(capsys):
    # Worker 1 is killed at once; worker 0 exits 5 (what a survivor that lost contact with it
    # exits with) 0.1 s later, within one of the launcher's 0.2-s looks: looking in index
    # order named worker 0 (seen failing in the ci run of a fresh clone).
    procs = _workers("sleep 0.1; exit 5", "kill -9 $$")
    code = launch.wait_all(procs, grace_s=5)
    out = capsys.readouterr().out
    assert code == 128 + signal.SIGKILL, out
    assert "worker 1 failed first (killed by SIGKILL); stopping the others" in out


def test_a_worker_that_exits_0_is_no_failure_and_a_later_failure_is_named(capsys):
    procs = _workers("exit 0", "sleep 0.3; exit 3")
    assert launch.wait_all(procs, grace_s=5) == 3
    assert "worker 1 failed first (exit code 3)" in capsys.readouterr().out


def test_all_ending_well_is_exit_0_and_says_nothing(capsys):
    procs = _workers("exit 0", "exit 0")
    assert launch.wait_all(procs, grace_s=5) == 0
    assert "failed first" not in capsys.readouterr().out


def test_a_lost_contact_exit_before_the_kill_it_reacted_to_names_the_killed_worker(capsys):
    # Under load the survivor's exit 5 (lost contact) can be recorded before the killed
    # worker is reaped: the launcher names the failure the survivor reacted to.
    procs = _workers("exit 5", "sleep 0.5; kill -9 $$")
    assert launch.wait_all(procs, grace_s=5) == 128 + signal.SIGKILL
    assert "worker 1 failed first (killed by SIGKILL)" in capsys.readouterr().out


def test_only_lost_contact_exits_name_the_first_of_them(capsys):
    # 1.5 s apart: a loaded CI run started worker 1's shell more than 0.3 s after worker 0's.
    procs = _workers("sleep 1.5; exit 5", "exit 5")
    assert launch.wait_all(procs, grace_s=5) == 5
    assert "worker 1 failed first (exit code 5)" in capsys.readouterr().out
