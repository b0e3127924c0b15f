"""Start N local workers of a multi-worker training script.

    python -m multigpu.launch --workers 2 train.py --epochs 3
    python -m multigpu.launch --workers 2 -- Rscript train.R --epochs 3

starts `train.py` (or, after `--`, any command) N times, each with a
`TF_CONFIG` describing a cluster of N workers on free loopback ports and its
own task index, and streams their output prefixed with `[worker i]`. The
script creates its strategy with `multigpu.multi_worker_strategy()` (in R:
`multi_worker_strategy()`) and trains with `fit_distributed`; on Keras's
JAX backend, `import multigpu` joins the workers instead and
`multi_gpu_model(model, gpus=None)` spans every worker's devices
(`multigpu.engines.jax.processes`). On a real cluster the same script runs
unchanged, one copy per machine, started by the
cluster manager (Kubernetes sets `TF_CONFIG`, Slurm's `srun` its step
variables) instead of this launcher; see docs/cluster.md.

A worker that dies takes the others down at once: TensorFlow workers whose
peers are gone wait in their collectives (for over 10 minutes, ignoring
SIGTERM), so the launcher kills the rest with SIGKILL and exits with the
failed worker's code and a message naming it. SIGUSR1 and SIGUSR2 sent to
the launcher go to every worker (a scheduler's warning before a time
limit, on which `checkpoint_callbacks` save); workers that then exit with
status 75 have saved, and the launcher waits for them all and exits with
75 too. Every worker must also join
the cluster within `--startup-timeout` seconds (`multi_worker_strategy()`
reports when it has), or all are killed.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from multigpu.arguments import check_int
from multigpu.checkpoints.preemption import PREEMPTED_EXIT_STATUS
from multigpu.cluster.readiness import READY_DIR_VARIABLE, not_ready
from multigpu.messages import literal

_POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1
# Signals the command-line launcher passes on to every worker: a
# scheduler's warning before it stops the job (Slurm's `--signal=B:USR1@90`
# goes to the batch shell, which the launcher is when the script `exec`s
# it), for the workers' `checkpoint_callbacks` to save on.
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# How long the others may take to exit once one worker has stopped with
# PREEMPTED_EXIT_STATUS: they have saved and are on their way out (the
# chief may still be asking Slurm to requeue the job).
_PREEMPTED_GRACE_SECONDS = 60.0
# The workers of the run in progress, for the forwarding handler.
_RUNNING = []


def free_ports(count, host="127.0.0.1"):
    """`count` distinct TCP ports that are free on `host` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses, index):
    """The `TF_CONFIG` JSON of worker `index` in a cluster of `addresses`."""
    return json.dumps({
        "cluster": {"worker": list(addresses)},
        "task": {"type": "worker", "index": index},
    })


def _die_with_parent():
    """In the child: get SIGKILL if the launcher dies (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class _Worker:
    """One worker process and the thread that streams its output."""

    def __init__(self, index, command, env, output_lock):
        self.index = index
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        self._lock = output_lock
        self._thread = threading.Thread(target=self._stream, daemon=True)

    def start_streaming(self):
        self._thread.start()

    def _stream(self):
        prefix = f"[worker {self.index}] ".encode()
        for line in iter(self.process.stdout.readline, b""):
            with self._lock:
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()

    def kill(self):
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, timeout=10.0):
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self._thread.join(timeout=timeout)


def _describe_exit(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _exit_status(code):
    return 128 - code if code < 0 else (code or 1)


class LaunchError(RuntimeError):
    """The launched workers failed; the message says which and why."""

    def __init__(self, message, exit_status):
        super().__init__(message)
        self.exit_status = exit_status


def _is_stopped(pid):
    """Whether process `pid` is stopped (SIGSTOP/SIGTSTP; Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _stopped_since(workers, stopped, now):
    """Updates {index: time first seen stopped}; returns it."""
    for w in workers:
        if w.process.poll() is None and _is_stopped(w.process.pid):
            stopped.setdefault(w.index, now)
        else:
            stopped.pop(w.index, None)
    return stopped


def _watch(workers, ready_dir, startup_timeout, timeout, stopped_timeout):
    """Waits until all workers succeed; raises LaunchError on any failure."""
    start = time.monotonic()
    stopped = {}
    while True:
        elapsed = time.monotonic() - start
        _stopped_since(workers, stopped, elapsed)
        codes = [w.process.poll() for w in workers]
        failed = [(w, c) for w, c in zip(workers, codes) if c not in (None, 0)]
        if failed and failed[0][1] == PREEMPTED_EXIT_STATUS:
            _wait_for_exits(workers, _PREEMPTED_GRACE_SECONDS)
            raise LaunchError(
                f"worker {failed[0][0].index} exited with code "
                f"{PREEMPTED_EXIT_STATUS}, as checkpoint_callbacks do after "
                "a preemption signal once the training state is saved; run "
                "the same command again to resume.",
                PREEMPTED_EXIT_STATUS,
            )
        if failed:
            worker, code = failed[0]
            cause = "".join(
                f" Worker {index} has been stopped (SIGSTOP or SIGTSTP) for "
                f"{elapsed - since:.1f} s: a stopped worker stalls the "
                "collectives of the others, so it is the likely cause."
                for index, since in sorted(stopped.items()))
            raise LaunchError(
                f"worker {worker.index} {_describe_exit(code)} after "
                f"{elapsed:.1f} s; stopped the other workers with SIGKILL "
                "(workers whose peers are gone never return). Its output is "
                f"above, prefixed [worker {worker.index}].{cause}",
                _exit_status(code),
            )
        frozen = [(i, elapsed - since) for i, since in sorted(stopped.items())
                  if stopped_timeout and elapsed - since > stopped_timeout]
        if frozen:
            index, duration = frozen[0]
            raise LaunchError(
                f"worker {index} has been stopped (SIGSTOP or SIGTSTP) for "
                f"{duration:.1f} s, which stalls every other worker; killed "
                "all workers with SIGKILL. Resume a stopped worker within "
                f"{stopped_timeout:g} s with SIGCONT.",
                124,
            )
        if all(c == 0 for c in codes):
            return
        if startup_timeout and elapsed > startup_timeout:
            late = not_ready([w.index for w in workers], ready_dir)
            if late:
                raise LaunchError(
                    f"worker(s) {late} did not join the cluster within "
                    f"{startup_timeout:g} s (--startup-timeout); killed all "
                    "workers with SIGKILL. A worker joins when "
                    "multigpu.multi_worker_strategy() returns: check that the "
                    "script calls it and that every worker reaches it (a "
                    "script that builds tf.distribute.MultiWorkerMirroredStrategy "
                    "itself needs --startup-timeout 0).",
                    124,
                )
        if timeout and elapsed > timeout:
            raise LaunchError(
                f"the workers did not finish within {timeout:g} s "
                "(--timeout); killed all workers with SIGKILL.",
                124,
            )
        time.sleep(_POLL_SECONDS)


def _wait_for_exits(workers, seconds):
    """Waits up to `seconds` for every worker to exit by itself."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(w.process.poll() is not None for w in workers):
            return
        time.sleep(_POLL_SECONDS)


def _forward(signum, frame):
    """Passes `signum` on to every running worker's process group."""
    for worker in list(_RUNNING):
        if worker.process.poll() is None:
            try:
                os.killpg(worker.process.pid, signum)
            except ProcessLookupError:
                pass


def _check_seconds(name, value, zero_means):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            value != value or value < 0):
        raise ValueError(
            f"Invalid `{name}`: received {literal(value)}; expected a number "
            f"of seconds >= 0 (0 or {literal(None)} {zero_means})."
        )
    return float(value)


def launch(script, script_args=(), workers=2, startup_timeout=120.0,
           timeout=None, host="127.0.0.1", stopped_timeout=60.0):
    """Runs the Python script `script` as `workers` local workers of one cluster.

    Args:
        script: Path of the Python training script.
        script_args: Arguments passed to every worker's script.
        workers: Number of worker processes, an int >= 1.
        startup_timeout: Seconds every worker has to join the cluster
            (return from `multigpu.multi_worker_strategy()`, or on JAX from
            `import multigpu`); 0 or None to wait forever.
        timeout: Seconds the whole run may take; None for no limit.
        host: Address the workers listen on.
        stopped_timeout: Seconds a worker may stay stopped (SIGSTOP) before
            all are killed and it is named; 0 or None to wait forever.

    Returns:
        0 once every worker has exited successfully.

    Raises:
        ValueError: for an invalid argument.
        LaunchError: when a worker fails or a deadline passes; every
            worker has then been killed. `exit_status` is the code to exit
            with.
    """
    if not os.path.isfile(script):
        raise ValueError(
            f"Invalid `script`: received {literal(script)}, which is not a file."
        )
    return launch_command([sys.executable, "-u", script, *script_args],
                          workers, startup_timeout, timeout, host,
                          stopped_timeout)


def _check_command(command):
    if isinstance(command, (str, bytes)) or not command or not all(
            isinstance(part, str) for part in command):
        raise ValueError(
            f"Invalid `command`: received {literal(command)}; expected a "
            "non-empty list of strings, the program and its arguments, e.g. "
            f"{literal(['Rscript', 'train.R'])}."
        )
    if shutil.which(command[0]) is None:
        raise ValueError(
            f"Invalid `command`: {literal(command[0])} is not a program on "
            "PATH nor an executable file."
        )
    return list(command)


def launch_command(command, workers=2, startup_timeout=120.0, timeout=None,
                   host="127.0.0.1", stopped_timeout=60.0):
    """Runs any `command` as `workers` local workers of one cluster.

    Each copy gets its `TF_CONFIG`; the command (an R script calling the R
    package's `multi_worker_strategy()`, a shell script, ...) must reach
    `multigpu.multi_worker_strategy()` in some process it starts, with the
    environment it was given, within `startup_timeout`.

    Args:
        command: The program and its arguments, e.g. `["Rscript", "train.R"]`.
        workers: Number of worker processes, an int >= 1.
        startup_timeout: Seconds every worker has to join the cluster; 0 or
            None to wait forever.
        timeout: Seconds the whole run may take; None for no limit.
        host: Address the workers listen on.
        stopped_timeout: As for `launch`.

    Returns:
        0 once every worker has exited successfully.

    Raises:
        ValueError: for an invalid argument.
        LaunchError: when a worker fails or a deadline passes, as `launch`.

    Example:
    >>> launch_command(["Rscript", "train.R"], workers=2)
    0
    """
    workers = check_int("workers", workers, 1)
    startup_timeout = _check_seconds("startup_timeout", startup_timeout,
                                     "to wait forever")
    timeout = _check_seconds("timeout", timeout, "for no limit")
    stopped_timeout = _check_seconds("stopped_timeout", stopped_timeout,
                                     "to wait forever")
    command = _check_command(command)
    addresses = [f"{host}:{port}" for port in free_ports(workers, host)]
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="multigpu-launch-") as ready_dir:
        running = []
        try:
            for index in range(workers):
                env = dict(os.environ, TF_CONFIG=tf_config(addresses, index),
                           PYTHONUNBUFFERED="1")
                env[READY_DIR_VARIABLE] = ready_dir
                running.append(_Worker(index, command, env, lock))
            for worker in running:
                worker.start_streaming()
            _RUNNING[:] = running
            _watch(running, ready_dir, startup_timeout, timeout,
                   stopped_timeout)
        finally:
            _RUNNING.clear()
            for worker in running:
                worker.kill()
            for worker in running:
                worker.finish()
    return 0


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m multigpu.launch",
        description="Run a multi-worker training script (or, after --, any "
        "command) as N local workers, each with its TF_CONFIG (cluster on "
        "free loopback ports).",
    )
    parser.add_argument("--workers", type=int, default=2,
                        help="number of worker processes (default 2)")
    parser.add_argument("--startup-timeout", type=float, default=120.0,
                        help="seconds each worker has to join the cluster, "
                        "i.e. return from multigpu.multi_worker_strategy() "
                        "(default 120; 0 disables)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the whole run may take (default: none)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the workers listen on")
    parser.add_argument("script", nargs="?",
                        help="the Python training script (or, after --, "
                        "any command: -- Rscript train.R)")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="arguments for the script")
    return parser


def _split_command(argv):
    """(launcher options, command) when `--` comes before any script."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    head = _parser().parse_args(argv[:cut])
    if head.script is not None:  # `--` belongs to the script's arguments
        return argv, None
    return argv[:cut], argv[cut + 1:]


def _on_signal(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None):
    """Command-line entry point; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    head, command = _split_command(argv)
    options = parser.parse_args(head)
    if command is None and options.script is None:
        parser.error("give the training script, or -- and a command "
                     "(python -m multigpu.launch --workers 2 -- Rscript "
                     "train.R)")
    signal.signal(signal.SIGTERM, _on_signal)
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, _forward)
    try:
        if command is not None:
            return launch_command(command, options.workers,
                                  options.startup_timeout, options.timeout,
                                  options.host)
        return launch(options.script, options.args, options.workers,
                      options.startup_timeout, options.timeout, options.host)
    except ValueError as error:
        print(f"multigpu.launch: {error}", file=sys.stderr)
        return 2
    except LaunchError as error:
        print(f"multigpu.launch: {error}", file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("multigpu.launch: interrupted; killed all workers.",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
