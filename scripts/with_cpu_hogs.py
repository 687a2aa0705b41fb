"""Run a command with CPU-bound processes alongside it, to prove it works on a busy machine.

    python scripts/with_cpu_hogs.py -n 2 -- make test
    python scripts/with_cpu_hogs.py -n 2 --timeout 1800 -- \
        .venv/bin/python -m checks grade solutions

Starts N hogs (busy loops in plain Python, one core each, at normal priority), runs the command,
and stops the hogs when the command ends, fails, times out or is interrupted (Ctrl-C). The exit
status is the command's (128 + N when a signal N ended it; 124 when it ran past --timeout, as
coreutils' `timeout` says). Everything is bounded in time: the command is stopped after
--timeout seconds (SIGTERM to its process group, SIGKILL 10 s later), and every hog also stops by
itself at that deadline or as soon as this script is gone, even if it was killed with SIGKILL.

The command runs in its own process group, so that a timeout or Ctrl-C reaches the processes it
started too; it should not read from the terminal. The hogs' process ids are in the command's
environment as CPU_HOGS_PIDS (comma-separated). One line on stderr at the start and one at the
end say what ran and how much CPU the hogs took (they get their share of the cores: about
N / (N + busy threads of the command) of them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time

KILL_GRACE = 10.0  # seconds between SIGTERM and SIGKILL for a command that overran or was stopped
TIMEOUT_STATUS = 124

# The hog: pure Python arithmetic (no I/O, no memory traffic), checking about every 10 ms whether
# its deadline has passed or its parent (this script) is gone.
HOG = """
import os, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
x = 0
while time.time() < deadline and os.getppid() == parent:
    for _ in range(100_000):
        x += 1
"""


def own_process_group() -> dict:
    """Popen arguments that start a process in a process group of its own but in this session.
    Its own group: the terminal's Ctrl-C reaches only this script, which decides what to stop
    and when. This session: Linux's autogroup scheduling (on in many distributions) shares the
    CPU between sessions first, so a hog in a session of its own would take one session's share
    whatever the command runs; within one session every busy process counts alike, as on a
    machine without autogroup."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def start_hogs(n: int, deadline: float) -> list[subprocess.Popen]:
    """n busy processes that stop by themselves at `deadline` (time.time()) at the latest."""
    return [subprocess.Popen([sys.executable, "-c", HOG, repr(deadline), str(os.getpid())],
                             stdin=subprocess.DEVNULL, **own_process_group())
            for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> float:
    """Kill every hog and reap it; the CPU seconds they used in all."""
    cpu = 0.0
    for hog in hogs:
        if hog.returncode is None:
            try:
                hog.kill()
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(hog.pid, 0)
            hog.returncode = os.waitstatus_to_exitcode(status)
            cpu += usage.ru_utime + usage.ru_stime
    return cpu


@contextlib.contextmanager
def cpu_hogs(n: int, seconds: float):
    """n hogs for the `with` block (each stops by itself after `seconds` at the latest). Yields a
    dict with the hogs' process ids; on leaving it gains `cpu_seconds`, what they used in all.
    (checks/tools/benchmark/common.py uses this.)"""
    hogs = start_hogs(n, time.time() + seconds)
    usage: dict = {"hogs": n, "pids": [h.pid for h in hogs]}
    try:
        yield usage
    finally:
        usage["cpu_seconds"] = stop_hogs(hogs)


def signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def run_command(argv: list[str], hogs: list[subprocess.Popen], timeout: float) -> int:
    """Run argv in its own process group until it ends or `timeout` passes; Ctrl-C, SIGTERM and
    SIGHUP are passed on to the group (a second one kills it). The exit status, as a shell
    reports it."""
    env = dict(os.environ, CPU_HOGS_PIDS=",".join(str(h.pid) for h in hogs))
    try:
        process = subprocess.Popen(argv, env=env, **own_process_group())
    except OSError as exc:
        print(f"with_cpu_hogs: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    received: list[int] = []

    def forward(sig, _frame):
        received.append(sig)
        signal_group(process, sig if len(received) == 1 else signal.SIGKILL)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"with_cpu_hogs: the command ran longer than {timeout:g} s; stopping it",
              file=sys.stderr)
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
            process.wait()
        return TIMEOUT_STATUS
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    code = process.returncode
    return 128 - code if code < 0 else code


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python scripts/with_cpu_hogs.py",
        description="Run a command with N CPU-bound processes alongside it for its whole "
                    "duration; exit with the command's status.",
        usage="%(prog)s [-n N] [--timeout SECONDS] -- COMMAND [ARG ...]")
    parser.add_argument("-n", "--hogs", type=int, default=2, metavar="N",
                        help="CPU-bound processes to run alongside (default 2)")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="stop the command (exit status 124) after this long (default 3600)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given (put it after --)")
    if args.hogs < 0:
        parser.error("-n must be 0 or more")
    if not args.timeout > 0:
        parser.error("--timeout must be a positive number of seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    # The hogs' own deadline: the command's, plus the time it may take to stop it.
    hogs = start_hogs(args.hogs, time.time() + args.timeout + 2 * KILL_GRACE)
    shown = shlex.join(args.command)
    print(f"with_cpu_hogs: {args.hogs} CPU hog(s) running alongside `{shown}` "
          f"(limit {args.timeout:g} s)", file=sys.stderr, flush=True)
    code = 1
    try:
        code = run_command(args.command, hogs, args.timeout)
    finally:
        cpu = stop_hogs(hogs)
        wall = time.monotonic() - started
        print(f"with_cpu_hogs: `{shown}` exited with status {code} after {wall:.0f} s; the "
              f"{args.hogs} hog(s) used {cpu:.0f} CPU s ({cpu / max(wall, 1e-9):.2f} cores)",
              file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
