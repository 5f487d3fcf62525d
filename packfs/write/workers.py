"""Worker processes for ``packfs pack -j N``: forked from the packer, fed chunks of work
through pipes, their results taken back in the chunks' order.

Processes, not threads: reading a small file is mostly Python (open, fstat, read,
fstat, close), which holds the GIL.  Forked, so the scanned tree is shared without
being sent.  Each worker dies with the packer (PR_SET_PDEATHSIG), even when the packer
is killed with SIGKILL, and leaves the packer's signals to the packer: a terminal's
Ctrl-C reaches the whole process group, and only the packer cleans up.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import selectors
import signal
import struct
from collections import deque
from typing import Callable, Generic, Iterator, Sequence, TypeVar

from ..errors import PackError

__all__ = ["Workers", "available_cores"]

_COMMAND = struct.Struct("<qqq")
_LENGTH = struct.Struct("<Q")
_PR_SET_PDEATHSIG = 1
# Chunks given to a worker before it reports one: it never waits for the next.
_IN_FLIGHT = 2


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, as taskset sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


Result = TypeVar("Result")  # what ``work`` returns a list of, for each chunk


class Workers(Generic[Result]):
    """``jobs`` forked processes applying ``work(worker, start, stop, tag)`` to
    ``chunks`` (``(start, stop)`` pairs; ``tag`` is the :attr:`tag` when the chunk was
    given out); :meth:`results` yields each chunk's result list, item by item, in the
    chunks' order, whichever worker finished first.

    A worker that raises sends the exception, which :meth:`results` raises; one that
    dies is a PackError.  Leaving the ``with`` block ends every worker (SIGKILL when
    the block ends with an exception) and reaps it.
    """

    def __init__(self, jobs: int, chunks: Sequence[tuple[int, int]],
                 work: Callable[[int, int, int, int], list[Result]]) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs!r}")
        self._jobs = jobs
        self._chunks = chunks
        self._work = work
        self._pids: list[int] = []
        self._commands: list[int] = []
        self._results: list[int] = []
        self._selector = selectors.DefaultSelector()
        self._pending: deque[int] = deque(range(len(chunks)))  # chunks not given out yet
        self._given: list[deque[int]] = []  # per worker, its chunks not reported yet
        self._done: dict[int, list[Result]] = {}
        self.tag = -1  # given with each chunk from now on

    def __enter__(self) -> Workers[Result]:
        try:
            for worker in range(self._jobs):
                self._start(worker)
            for worker in range(self._jobs):
                for _ in range(_IN_FLIGHT):
                    self._give(worker)
        except BaseException:
            self._stop(kill=True)
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop(kill=exc_type is not None)

    def _start(self, worker: int) -> None:
        command_read, command_write = os.pipe2(os.O_CLOEXEC)
        result_read, result_write = os.pipe2(os.O_CLOEXEC)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child's coverage is not collected)
            code = 1
            try:
                os.close(command_write)
                os.close(result_read)
                for fd in self._commands + self._results:
                    os.close(fd)  # an earlier worker's pipes: they must see only the packer end
                _become_worker(parent)
                _serve(worker, command_read, result_write, self._work)
                code = 0
            finally:
                os._exit(code)
        os.close(command_read)
        os.close(result_write)
        self._pids.append(pid)
        self._commands.append(command_write)
        self._results.append(result_read)
        self._given.append(deque())
        self._selector.register(result_read, selectors.EVENT_READ, worker)

    def _give(self, worker: int) -> None:
        if self._pending:
            chunk = self._pending.popleft()
            self._given[worker].append(chunk)
            start, stop = self._chunks[chunk]
            os.write(self._commands[worker], _COMMAND.pack(start, stop, self.tag))

    def _receive(self) -> None:
        """Wait for one chunk's result from any worker, and give that worker another."""
        for key, _ in self._selector.select():
            worker = key.data
            message = _read_message(key.fd)
            if message is None:
                raise PackError(f"a packing process ended unexpectedly ({self._fate(worker)})")
            status, value = pickle.loads(message)
            if status == "raise":
                raise value
            self._done[self._given[worker].popleft()] = value
            self._give(worker)

    def _fate(self, worker: int) -> str:
        pid, status = os.waitpid(self._pids[worker], 0)
        self._pids[worker] = -1
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"

    def results(self) -> Iterator[Result]:
        """Every chunk's results, in the chunks' order."""
        for chunk in range(len(self._chunks)):
            while chunk not in self._done:
                self._receive()
            yield from self._done.pop(chunk)

    def finish(self, before: int | None = None) -> None:
        """Wait until every chunk is done (those given out so far, with ``before`` set to
        :meth:`given`'s count then), its results kept for :meth:`results`."""
        while any(chunk < (before if before is not None else len(self._chunks))
                  for given in self._given for chunk in given):
            self._receive()

    def given(self) -> int:
        """How many chunks were given out so far (they are given in order)."""
        return len(self._chunks) - len(self._pending)

    def _stop(self, kill: bool) -> None:
        for pid in self._pids:
            if kill and pid > 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for fd in self._commands:  # end of commands: an idle worker exits
            os.close(fd)
        self._commands = []
        for pid in self._pids:
            if pid > 0:
                _reap(pid)
        self._pids = []
        self._selector.close()
        for fd in self._results:
            os.close(fd)
        self._results = []


def _reap(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except ChildProcessError:
            return
        except InterruptedError:  # pragma: no cover (PEP 475 retries; kept for safety)
            continue


def _become_worker(parent: int) -> None:  # pragma: no cover (runs in the child)
    """Die with the packer; leave its signals to it."""
    # The packer's objects, shared copy-on-write, out of the collector's sight: a
    # collection would touch every one of them, and copy each page it is on.
    gc.freeze()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: the worker still ends at its command pipe's end
    if os.getppid() != parent:  # the packer died before the line above
        os._exit(1)
    # The packer's handlers (the CLI's remove its temporary files) are not the worker's
    # to run: Ctrl-C goes to the packer, which ends the workers; other signals kill.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(number, signal.SIG_DFL)


def _serve(worker: int, commands: int, results: int,
           work: Callable[[int, int, int, int], list]) -> None:  # pragma: no cover (runs in the child)
    while True:
        command = _read_exactly(commands, _COMMAND.size)
        if command is None:
            return
        start, stop, tag = _COMMAND.unpack(command)
        try:
            reply: tuple[str, object] = ("ok", work(worker, start, stop, tag))
        except OSError as error:  # sent to the packer, which raises it: rebuilt, to unpickle
            reply = ("raise", OSError(error.errno, error.strerror))
        except Exception as error:
            reply = ("raise", PackError(str(error)))
        message = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
        _write_all(results, _LENGTH.pack(len(message)) + message)


def _read_message(fd: int) -> bytes | None:
    header = _read_exactly(fd, _LENGTH.size)
    if header is None:
        return None
    (length,) = _LENGTH.unpack(header)
    return _read_exactly(fd, length)


def _read_exactly(fd: int, length: int) -> bytes | None:
    """``length`` bytes from the pipe ``fd``; None at its end."""
    parts = []
    while length:
        part = os.read(fd, min(length, 1 << 20))
        if not part:
            return None
        parts.append(part)
        length -= len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
