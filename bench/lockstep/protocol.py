"""Lockstep control of benchmark workers.

All the configurations of one group (a workload on one device count) run in
processes of their own, alive at the same time, but only one of them works
at any moment: the orchestrator grants one epoch (or one `predict` call) to
one worker, waits for its report, then grants the next, round after round in
a shuffled order. So load from elsewhere on the machine hits every
configuration alike, and each round gives side-by-side ratios.

The worker end is `Channel` and `bench.lockstep.timer.LockstepTimer` (used by
Python and R-driven workers alike); the orchestrator end is `WorkerHandle`.
This module does not import TensorFlow, so the orchestrator does not either. Messages are JSON lines over two pipes
the orchestrator passes to the worker as inherited file descriptors, named
in the `MULTIGPU_BENCH_FDS` environment variable (`"<read>,<write>"`).
"""

import json
import os
import select
import signal
import subprocess
import time

FDS_VARIABLE = "MULTIGPU_BENCH_FDS"


class WorkerError(RuntimeError):
    """A worker failed, exited or timed out; the message says which."""


class Channel:
    """The worker's end: waits for grants, sends reports.

    Args:
        read_fd: Descriptor the orchestrator's commands arrive on.
        write_fd: Descriptor reports are written to.
    """

    def __init__(self, read_fd, write_fd):
        self._commands = os.fdopen(int(read_fd), "r")
        self._write_fd = int(write_fd)

    @classmethod
    def from_env(cls):
        """The channel named by `MULTIGPU_BENCH_FDS`."""
        read_fd, write_fd = os.environ[FDS_VARIABLE].split(",")
        return cls(read_fd, write_fd)

    def send(self, event, **fields):
        """Reports `event` with JSON-serialisable `fields`."""
        line = json.dumps(dict(fields, event=event)) + "\n"
        os.write(self._write_fd, line.encode())

    def wait(self):
        """Blocks until the next command; returns it (`"go"`, `"finish"`)."""
        command = self._commands.readline().strip()
        if not command:
            raise SystemExit("benchmark orchestrator went away")
        return command


class WorkerHandle:
    """The orchestrator's end of one worker process.

    Args:
        name: Label used in error messages.
        command: The worker's argv.
        env: Its environment (the channel variable is added).
        log_path: File receiving the worker's stdout and stderr.
        timeout: Seconds to wait for any single report.
    """

    def __init__(self, name, command, env, log_path, timeout):
        self.name = name
        self.timeout = timeout
        self.log_path = log_path
        self.failed = None
        command_read, command_write = os.pipe()
        report_read, report_write = os.pipe()
        env = dict(env)
        env[FDS_VARIABLE] = f"{command_read},{report_write}"
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(command_read, report_write))
        os.close(command_read)
        os.close(report_write)
        self._commands = os.fdopen(command_write, "w", buffering=1)
        self._reports = report_read
        self._buffer = b""

    def _fail(self, message):
        self.failed = message
        raise WorkerError(f"{self.name}: {message}")

    def receive(self):
        """The next report (a dict); raises `WorkerError` on failure."""
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.dump_stacks()
                self.kill()
                self._fail(f"no report within {self.timeout:.0f} s; stacks "
                           f"in {self.log_path}")
            ready, _, _ = select.select([self._reports], [], [], remaining)
            if ready:
                chunk = os.read(self._reports, 65536)
                if not chunk:
                    self.process.wait()
                    self._fail(f"exited with status {self.process.returncode}"
                               f"; see {self.log_path}:\n{self.log_tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        report = json.loads(line)
        if report.get("event") == "error":
            self._fail(report.get("message", "unknown error"))
        return report

    def expect(self, event):
        report = self.receive()
        if report["event"] != event:
            self._fail(f"expected a {event!r} report, got {report!r}")
        return report

    def command(self, text):
        try:
            self._commands.write(text + "\n")
        except BrokenPipeError:
            self._fail(f"went away; see {self.log_path}:\n{self.log_tail()}")

    def grant(self, event):
        """Lets the worker run one unit of work; returns its report."""
        self.command("go")
        return self.expect(event)

    def finish(self):
        """Asks for the final report, waits for the worker to exit."""
        self.command("finish")
        report = self.expect("done")
        self.process.wait(timeout=self.timeout)
        return report

    def log_tail(self, lines=15):
        try:
            with open(self.log_path) as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return ""

    def dump_stacks(self):
        """Asks a Python worker to write its thread stacks to its log."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(2)

    def close(self):
        """Ends the worker if needed and closes the pipes to it."""
        self.kill()
        for stream in (self._commands,):
            try:
                stream.close()
            except OSError:
                pass
        os.close(self._reports)

    def kill(self, grace=0):
        """Ends the worker, after `grace` seconds to exit by itself."""
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
