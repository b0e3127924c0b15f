"""Stopping on the signal a scheduler sends before it ends a job.

Slurm sends a chosen signal some time before a job's time limit
(`sbatch --signal=B:USR1@90`: to the batch shell; `--signal=USR1@90`: to
every task of the job's steps), and many clusters preempt jobs the same way.
`PreemptionWatch` catches that signal while `fit` runs; the checkpoint
callback asks it after every batch, saves the exact training state when it
was caught, and calls `stop_job`: a Slurm job that may be requeued
(`sbatch --requeue`) is requeued with `scontrol requeue`, and the process
exits with `PREEMPTED_EXIT_STATUS` and a message saying how training
resumes. The rest of the job is the scheduler's: a requeued job runs the
same script again, whose checkpoint callbacks resume at the saved step.
"""

import os
import signal
import subprocess
import sys
import threading
import warnings

from multigpu.messages import literal

# sysexits.h's EX_TEMPFAIL: the work is not done, and running the same
# command again continues it.
PREEMPTED_EXIT_STATUS = 75
DEFAULT_SIGNAL = "SIGUSR1"
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
# Signals that mean only "time is short": after training, their default
# action (ending the process) would cut off the script's own last steps.
_WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)
_SCONTROL_TIMEOUT = 30


def check_preemption_signal(value):
    """`value` as a catchable `signal.Signals`, or None (watch no signal).

    Args:
        value: A signal name (`"SIGUSR1"` or `"USR1"`), its number, a
            `signal.Signals`, or None.

    Returns:
        A `signal.Signals`, or None.

    Raises:
        ValueError: for a name or number that is no signal, or one that
            cannot be caught (SIGKILL, SIGSTOP).
        TypeError: for anything else.

    Example:
    >>> check_preemption_signal("USR1")
    <Signals.SIGUSR1: 10>
    """
    if value is None:
        return None
    expected = (f"a signal name such as {literal(DEFAULT_SIGNAL)}, its "
                f"number, or {literal(None)} to watch no signal")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(
            f"Invalid `preemption_signal`: received an object of type "
            f"{type(value).__name__}; expected {expected}.")
    try:
        if isinstance(value, str):
            name = value.upper()
            found = signal.Signals[name if name.startswith("SIG")
                                   else "SIG" + name]
        else:
            found = signal.Signals(int(value))
    except (KeyError, ValueError):
        raise ValueError(
            f"Invalid `preemption_signal`: received {literal(value)}, which "
            f"is no signal here; expected {expected}.") from None
    if found in _UNCATCHABLE:
        raise ValueError(
            f"Invalid `preemption_signal`: received {literal(value)}, which "
            f"no process can catch; expected {expected} (Slurm: "
            "`--signal=B:USR1@90`).")
    return found


class PreemptionWatch:
    """Notes the arrival of one signal until training ends.

    `start` installs a handler that only records the signal (Python runs it
    between two batches, never inside a step); `stop` puts the previous
    handler back. A signal that arrives between `start` and the first
    batch is kept for it, so a job warned while it starts up still saves. A
    process can only install handlers from its main thread: elsewhere
    `start` warns and watches nothing.

    When the previous handler was the default action (or one Python cannot
    put back, such as R's), `stop` leaves `SIGUSR1` and `SIGUSR2` to
    `late_warning` instead: a warning that arrives after training, while
    the script saves its final model, is reported and does not end the
    process; the scheduler still ends the job at its time limit.

    Args:
        signum: The `signal.Signals` to watch, or None (watch nothing).

    Example:
    >>> watch = PreemptionWatch(signal.SIGUSR1)
    >>> watch.start()
    >>> watch.caught    # True once SIGUSR1 arrived
    False
    >>> watch.stop()
    """

    def __init__(self, signum):
        self.signum = signum
        self.caught = False
        self._previous = None
        self._installed = False

    def start(self):
        """Installs the handler, unless it is; a new one clears `caught`."""
        if self.signum is None or self._installed:
            return
        self.caught = False
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                f"checkpoint_callbacks: fit runs outside the main thread, "
                f"where {self.signum.name} cannot be caught; a job stopped "
                "by it resumes from the last checkpoint.",
                UserWarning, stacklevel=3)
            return
        self._previous = signal.signal(self.signum, self._record)
        self._installed = True

    def stop(self):
        """Puts back the handler `start` replaced."""
        if not self._installed:
            return
        # None: the previous handler was not installed from Python (R's
        # own, for one), and cannot be put back. In its place, and in the
        # default action's, a warning signal gets `late_warning`; any other
        # signal its default action.
        previous = self._previous
        if previous in (None, signal.SIG_DFL):
            previous = (late_warning if self.signum in _WARNINGS
                        else signal.SIG_DFL)
        signal.signal(self.signum, previous)
        self._installed = False

    def _record(self, signum, frame):
        self.caught = True


def late_warning(signum, frame):
    """The handler of a warning signal that arrives after training ended.

    Says so on standard error (with `os.write`: a handler may interrupt a
    `print` to the same stream) and lets the script go on.

    Args:
        signum: The signal's number.
        frame: The interrupted frame (unused).

    Example:
    >>> signal.signal(signal.SIGUSR1, late_warning)
    """
    name = signal.Signals(signum).name
    os.write(2, (f"checkpoint_callbacks: caught {name} after training "
                 "ended; nothing is left to save, and the script goes on "
                 "until the job's time limit.\n").encode())


def slurm_job_id(environ=None):
    """The id of the Slurm job this process runs in, or None.

    Example:
    >>> slurm_job_id({"SLURM_JOB_ID": "42"})
    '42'
    """
    environ = os.environ if environ is None else environ
    return environ.get("SLURM_JOB_ID") or None


def requeue_allowed(job_id, run=None):
    """Whether Slurm may requeue job `job_id` (`scontrol show job`'s `Requeue=1`).

    Args:
        job_id: A Slurm job id.
        run: What runs `scontrol` (`subprocess.run` when None).

    Returns:
        (allowed, why): a bool, and when False, what stood in the way.

    Example:
    >>> requeue_allowed("42")
    (False, 'the job was not submitted with `--requeue`')
    """
    run = run or subprocess.run
    try:
        shown = run(["scontrol", "show", "job", "-o", job_id],
                    capture_output=True, text=True,
                    timeout=_SCONTROL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"scontrol could not be asked ({error})"
    if shown.returncode != 0:
        return False, (f"`scontrol show job {job_id}` failed: "
                       f"{shown.stderr.strip()[-300:]}")
    fields = dict(part.split("=", 1) for part in shown.stdout.split()
                  if "=" in part)
    if fields.get("Requeue") != "1":
        return False, "the job was not submitted with `--requeue`"
    return True, ""


def requeue(job_id, run=None):
    """Asks Slurm to requeue job `job_id`; returns what failed, or None.

    Example:
    >>> requeue("42")   # the job is pending again, or will be
    """
    run = run or subprocess.run
    try:
        done = run(["scontrol", "requeue", job_id], capture_output=True,
                   text=True, timeout=_SCONTROL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode != 0:
        return done.stderr.strip()[-300:] or f"exit status {done.returncode}"
    return None


def stop_job(signum, position, requeues=True, run=None):
    """Requeues the Slurm job when it may be, then ends the process.

    Called once the training state is saved. Prints what happened and how
    training resumes, then exits with `PREEMPTED_EXIT_STATUS`: in Python by
    raising `SystemExit`, so that `finally` blocks and `atexit` run; inside
    R (`embedded_in_r`), where reticulate would turn `SystemExit` into an R
    error, by ending the process at once.

    Args:
        signum: The `signal.Signals` that was caught.
        position: Text naming where the state was saved (epoch and batch).
        requeues: Whether this process wrote the state and asks Slurm to
            requeue the job (the chief does; the other workers only exit).
        run: What runs `scontrol` (`subprocess.run` when None).

    Raises:
        SystemExit: always, in Python.

    Example:
    >>> stop_job(signal.SIGUSR1, "the state after batch 3 of epoch 2")
    """
    job_id = slurm_job_id()
    saved = "saved" if requeues else "the chief worker saved"
    said = f"checkpoint_callbacks: caught {signum.name}; {saved} {position}. "
    if job_id is None:
        said += ("Run the same script again to resume there (under Slurm, "
                 "`sbatch --requeue` lets the job requeue itself).")
    elif not requeues:
        said += f"It requeues Slurm job {job_id}."
    else:
        allowed, why = requeue_allowed(job_id, run)
        failed = requeue(job_id, run) if allowed else why
        if failed is None:
            said += (f"Requeued Slurm job {job_id}: it runs the same script "
                     "again and resumes there.")
        else:
            said += (f"Slurm job {job_id} was not requeued ({failed}); "
                     "submit it again to resume there, or submit it with "
                     "`sbatch --requeue` so that it requeues itself.")
    print(said, file=sys.stderr, flush=True)
    sys.stdout.flush()
    if embedded_in_r():
        os._exit(PREEMPTED_EXIT_STATUS)
    raise SystemExit(PREEMPTED_EXIT_STATUS)


def embedded_in_r():
    """Whether this Python runs inside an R process, through reticulate.

    R's `fit()` is keras3's, not multigpu's, so the language of the current
    call does not tell; reticulate's own module, loaded when it starts
    Python, does.

    Example:
    >>> embedded_in_r()
    False
    """
    return "rpycall" in sys.modules
