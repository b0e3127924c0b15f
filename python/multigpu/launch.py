"""Start N local workers of a multi-worker training script.

    python -m multigpu.launch --workers 2 train.py --epochs 3

starts `train.py` N times, each with a `TF_CONFIG` describing a cluster of N
workers on free loopback ports and its own task index, and streams their
output prefixed with `[worker i]`. The script creates its strategy with
`multigpu.multi_worker_strategy()` and trains with `multigpu.fit_distributed`;
on a real cluster the same script runs unchanged, one copy per machine, with
`TF_CONFIG` set by the cluster manager instead of this launcher.

A worker that dies takes the others down at once: TensorFlow workers whose
peers are gone wait in their collectives (for over 10 minutes, ignoring
SIGTERM), so the launcher kills the rest with SIGKILL and exits with the
failed worker's code and a message naming it. Every worker must also join
the cluster within `--startup-timeout` seconds (`multi_worker_strategy()`
reports when it has), or all are killed.
"""

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multigpu.messages import literal

READY_DIR_VARIABLE = "MULTIGPU_LAUNCH_READY_DIR"
_POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1


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


def _not_ready(workers, ready_dir):
    ready = set(os.listdir(ready_dir))
    return [w.index for w in workers if f"worker-{w.index}" not in ready]


def _watch(workers, ready_dir, startup_timeout, timeout):
    """Waits until all workers succeed; raises LaunchError on any failure."""
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        codes = [w.process.poll() for w in workers]
        failed = [(w, c) for w, c in zip(workers, codes) if c not in (None, 0)]
        if failed:
            worker, code = failed[0]
            raise LaunchError(
                f"worker {worker.index} {_describe_exit(code)} after "
                f"{elapsed:.1f} s; stopped the other workers with SIGKILL "
                "(workers whose peers are gone never return). Its output is "
                f"above, prefixed [worker {worker.index}].",
                _exit_status(code),
            )
        if all(c == 0 for c in codes):
            return
        if startup_timeout and elapsed > startup_timeout:
            late = _not_ready(workers, ready_dir)
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


def launch(script, script_args=(), workers=2, startup_timeout=120.0,
           timeout=None, host="127.0.0.1"):
    """Runs `script` as `workers` local workers of one cluster.

    Args:
        script: Path of the Python training script.
        script_args: Arguments passed to every worker's script.
        workers: Number of worker processes, an int >= 1.
        startup_timeout: Seconds every worker has to join the cluster
            (return from `multigpu.multi_worker_strategy()`); 0 or None to
            wait forever.
        timeout: Seconds the whole run may take; None for no limit.
        host: Address the workers listen on.

    Returns:
        0 once every worker has exited successfully.

    Raises:
        ValueError: for an invalid argument.
        LaunchError: when a worker fails or a deadline passes; every
            worker has then been killed. `exit_status` is the code to exit
            with.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(
            f"Invalid `workers`: received {literal(workers)}; expected an int >= 1."
        )
    if not os.path.isfile(script):
        raise ValueError(
            f"Invalid `script`: received {literal(script)}, which is not a file."
        )
    addresses = [f"{host}:{port}" for port in free_ports(workers, host)]
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="multigpu-launch-") as ready_dir:
        running = []
        try:
            for index in range(workers):
                env = dict(os.environ, TF_CONFIG=tf_config(addresses, index),
                           PYTHONUNBUFFERED="1")
                env[READY_DIR_VARIABLE] = ready_dir
                command = [sys.executable, "-u", script, *script_args]
                running.append(_Worker(index, command, env, lock))
            for worker in running:
                worker.start_streaming()
            _watch(running, ready_dir, startup_timeout, timeout)
        finally:
            for worker in running:
                worker.kill()
            for worker in running:
                worker.finish()
    return 0


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m multigpu.launch",
        description="Run a multi-worker training script as N local workers, "
        "each with its TF_CONFIG (cluster on free loopback ports).",
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
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="arguments for the script")
    return parser


def _on_signal(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None):
    """Command-line entry point; returns the process exit status."""
    options = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
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
