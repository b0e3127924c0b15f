"""The preemption signal: its argument, its handler, and how a job ends.

The end-to-end runs are elsewhere: `test_resume.py` stops every training
path with SIGUSR1 and resumes it exactly, and `cluster/test_slurm_requeue.py`
lets a real Slurm job hit its time limit, requeue itself and finish.
"""

import contextlib
import os
import signal
import types

import pytest

from multigpu.checkpoints import preemption


@pytest.mark.parametrize("value", ["SIGUSR1", "USR1", "usr1",
                                   int(signal.SIGUSR1), signal.SIGUSR1])
def test_a_signal_is_named_by_name_or_number(value):
    assert preemption.check_preemption_signal(value) is signal.SIGUSR1


def test_none_watches_no_signal():
    assert preemption.check_preemption_signal(None) is None
    watch = preemption.PreemptionWatch(None)
    watch.start()
    assert not watch.caught
    watch.stop()


@pytest.mark.parametrize("value, problem", [
    ("SIGNOPE", "'SIGNOPE', which is no signal here"),
    (999, "999, which is no signal here"),
    ("KILL", "'KILL', which no process can catch"),
    (int(signal.SIGSTOP), f"{int(signal.SIGSTOP)}, which no process can catch"),
])
def test_a_signal_that_cannot_be_watched_is_refused_by_name(value, problem):
    with pytest.raises(ValueError, match="Invalid `preemption_signal`") as raised:
        preemption.check_preemption_signal(value)
    assert problem in str(raised.value)
    assert "'SIGUSR1'" in str(raised.value)


@pytest.mark.parametrize("value", [1.5, True, ["SIGUSR1"]])
def test_a_value_of_another_type_is_a_type_error(value):
    with pytest.raises(TypeError, match="`preemption_signal`.*of type"):
        preemption.check_preemption_signal(value)


@contextlib.contextmanager
def _handled_by(signum, handler):
    """Installs `handler` for `signum`, then puts back the one it replaced."""
    old = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, old)


def test_the_watch_records_the_signal_and_puts_the_old_handler_back():
    def before(signum, frame):
        raise AssertionError("the old handler ran while watched")

    with _handled_by(signal.SIGUSR1, before):
        watch = preemption.PreemptionWatch(signal.SIGUSR1)
        watch.start()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.caught
        # A second start while watching keeps what was caught.
        watch.start()
        assert watch.caught
        watch.stop()
        assert signal.getsignal(signal.SIGUSR1) is before
        # Started again after stop: a fresh watch.
        watch.start()
        assert not watch.caught
        watch.stop()


def test_a_warning_after_training_is_reported_and_ends_nothing(capfd):
    # The default action of SIGUSR1 ends the process: a job warned while
    # its script saves the final model would lose it.
    with _handled_by(signal.SIGUSR1, signal.SIG_DFL):
        watch = preemption.PreemptionWatch(signal.SIGUSR1)
        watch.start()
        watch.stop()
        assert signal.getsignal(signal.SIGUSR1) is preemption.late_warning
        os.kill(os.getpid(), signal.SIGUSR1)
        assert not watch.caught
        assert capfd.readouterr().err == (
            "checkpoint_callbacks: caught SIGUSR1 after training ended; "
            "nothing is left to save, and the script goes on until the "
            "job's time limit.\n")
        # The next training watches again, and puts the same handler back.
        watch.start()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watch.caught
        watch.stop()
        assert signal.getsignal(signal.SIGUSR1) is preemption.late_warning


def test_a_signal_that_ends_jobs_gets_its_default_action_back():
    with _handled_by(signal.SIGTERM, signal.SIG_DFL):
        watch = preemption.PreemptionWatch(signal.SIGTERM)
        watch.start()
        watch.stop()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _scontrol(show, requeue_code=0):
    """A stand-in for subprocess.run that answers as scontrol would."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if command[1] == "show":
            return types.SimpleNamespace(returncode=0, stdout=show, stderr="")
        return types.SimpleNamespace(returncode=requeue_code, stdout="",
                                     stderr="Requested operation not allowed")
    return run, calls


SHOWN = "JobId=7 JobName=train UserId=root(0) Priority=1 Requeue={} Restarts=0"


def test_requeue_needs_the_jobs_requeue_flag():
    run, _ = _scontrol(SHOWN.format(1))
    assert preemption.requeue_allowed("7", run) == (True, "")
    run, _ = _scontrol(SHOWN.format(0))
    assert preemption.requeue_allowed("7", run) == (
        False, "the job was not submitted with `--requeue`")


def test_scontrol_missing_is_no_requeue():
    def run(command, **kwargs):
        raise FileNotFoundError("scontrol")
    allowed, why = preemption.requeue_allowed("7", run)
    assert not allowed and "scontrol could not be asked" in why


def _stop(monkeypatch, capsys, job_id, run=None, requeues=True):
    if job_id is None:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("SLURM_JOB_ID", job_id)
    with pytest.raises(SystemExit) as ended:
        preemption.stop_job(signal.SIGUSR1, "the state after batch 3 of "
                            "epoch 2", requeues=requeues, run=run)
    assert ended.value.code == preemption.PREEMPTED_EXIT_STATUS == 75
    said = capsys.readouterr().err
    assert said.startswith("checkpoint_callbacks: caught SIGUSR1; saved the "
                           "state after batch 3 of epoch 2. ")
    return said


def test_outside_slurm_the_process_says_to_run_it_again(monkeypatch, capsys):
    said = _stop(monkeypatch, capsys, None)
    assert "Run the same script again to resume there" in said


def test_a_requeueable_slurm_job_is_requeued(monkeypatch, capsys):
    run, calls = _scontrol(SHOWN.format(1))
    said = _stop(monkeypatch, capsys, "7", run)
    assert calls == [["scontrol", "show", "job", "-o", "7"],
                     ["scontrol", "requeue", "7"]]
    assert "Requeued Slurm job 7: it runs the same script again" in said


def test_a_job_without_requeue_says_how_to_resume(monkeypatch, capsys):
    run, calls = _scontrol(SHOWN.format(0))
    said = _stop(monkeypatch, capsys, "7", run)
    assert calls == [["scontrol", "show", "job", "-o", "7"]]
    assert ("Slurm job 7 was not requeued (the job was not submitted with "
            "`--requeue`); submit it again to resume there") in said


def test_a_refused_requeue_is_said(monkeypatch, capsys):
    run, _ = _scontrol(SHOWN.format(1), requeue_code=1)
    said = _stop(monkeypatch, capsys, "7", run)
    assert "was not requeued (Requested operation not allowed)" in said


def test_only_the_chief_requeues(monkeypatch, capsys):
    def run(command, **kwargs):
        raise AssertionError("a worker other than the chief ran scontrol")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with pytest.raises(SystemExit):
        preemption.stop_job(signal.SIGUSR1, "the state after batch 3 of "
                            "epoch 2", requeues=False, run=run)
    assert capsys.readouterr().err == (
        "checkpoint_callbacks: caught SIGUSR1; the chief worker saved the "
        "state after batch 3 of epoch 2. It requeues Slurm job 7.\n")


def test_checkpoint_callbacks_refuse_a_bad_signal_before_training(tmp_path):
    import multigpu

    with pytest.raises(ValueError, match="Invalid `preemption_signal`: "
                                         "received 'SIGKILL'"):
        multigpu.checkpoint_callbacks(tmp_path / "ckpt",
                                      preemption_signal="SIGKILL")
    assert not (tmp_path / "ckpt" / "backup").exists()


def test_r_users_read_r_literals(monkeypatch):
    from multigpu import messages

    monkeypatch.setattr(messages, "current_language", lambda: "r")
    with pytest.raises(TypeError, match='"SIGUSR1", its number, or NULL'):
        preemption.check_preemption_signal(1.5)


def test_the_exit_status_is_sysexits_tempfail():
    # Shells and schedulers read 75 as "try again later" (sysexits.h).
    assert os.EX_TEMPFAIL == preemption.PREEMPTED_EXIT_STATUS
