"""Where independent jobs run: in this process, on a local process pool,
or on a Ray cluster. One executor for sweeps, tuning and the dashboard.

Imports: the standard library and simspec.types; ray and tqdm only inside
the functions that need them.

Every executor runs ``fn(item)`` for a list of items and gives back
``(index, result)`` pairs as jobs finish (:meth:`imap`), or the results in
order (:meth:`map`); results never depend on where a job ran, because a
job is a pure function of its item. Local pools start their processes with
``spawn`` (a fresh interpreter: safe beside threads, as in the Streamlit
server) on first use and keep them until :meth:`close`; their workers
ignore Ctrl-C, which the parent handles by ending the pool.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from simspec.types import InputError, require


def die_with_parent() -> None:
    """Have the kernel end this process when the one that started it dies
    (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing): a worker or server never
    outlives its command, even one killed outright."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass


def _quiet_worker() -> None:
    import signal

    from tqdm import tqdm

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends the pool
    # tqdm's default lock is a multiprocessing semaphore; a worker ended by
    # terminate() would leave it to be reported leaked at exit.
    tqdm.set_lock(threading.RLock())


class Serial:
    """Every job in this process, in order."""

    processes = 1

    def imap(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        for i, item in enumerate(items):
            yield i, fn(item)

    def map(self, fn: Callable, items: list) -> list:
        return [fn(item) for item in items]

    def close(self, ok: bool = True) -> None:
        pass


class Processes:
    """A spawn-context process pool of ``processes`` workers, started on first use."""

    def __init__(self, processes: int):
        require(processes >= 1, f"processes must be >= 1 (got {processes})")
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # the dashboard submits from several threads

    @property
    def pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_quiet_worker)
            return self._pool

    def submit(self, fn: Callable, *args):
        return self.pool.submit(fn, *args)

    def imap(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        """(index, result) as jobs finish; a job's exception is raised here."""
        if not items:
            return
        pending = {self.pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=pending.get):
                    yield pending.pop(future), future.result()
        finally:
            for future in pending:
                future.cancel()

    def map(self, fn: Callable, items: list) -> list:
        """The results in the items' order (a job's exception is raised;
        ``concurrent.futures.process.BrokenProcessPool`` if a worker died)."""
        return list(self.pool.map(fn, items))

    def close(self, ok: bool = True) -> None:
        """Wait for the workers (``ok``), or end them at once, abandoning what runs."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        if ok:
            pool.shutdown(wait=True)
            return
        processes = list(getattr(pool, "_processes", {}).values())  # no public way to stop running jobs
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join()


class Ray:
    """Jobs as Ray tasks (one CPU each) on the cluster at ``address``."""

    def __init__(self, address: str, processes: int, probe_timeout_s: float = 3.0, connect_timeout_s: float = 30.0):
        import ray

        self.ray, self.started, self.processes = ray, False, processes
        if not ray.is_initialized():
            connect(address, processes, probe_timeout_s, connect_timeout_s)
            self.started = True
        self.remote: dict[Callable, object] = {}

    def imap(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        ray = self.ray
        remote = self.remote.setdefault(fn, ray.remote(num_cpus=1, max_retries=0)(fn))
        pending = {remote.remote(item): i for i, item in enumerate(items)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    index = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as err:
                        if isinstance(err.cause, InputError):
                            raise InputError(str(err.cause)) from None
                        raise
                    yield index, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def map(self, fn: Callable, items: list) -> list:
        out = [None] * len(items)
        for i, result in self.imap(fn, items):
            out[i] = result
        return out

    def close(self, ok: bool = True) -> None:
        if self.started:
            self.ray.shutdown()


def connect(address: str, processes: int, probe_timeout_s: float = 3.0, connect_timeout_s: float = 30.0) -> None:
    """``ray.init`` for ``address`` ("local", "auto", HOST:PORT or
    ray://HOST:PORT), quietly; an address that does not answer is an
    :class:`InputError` after at most the probe and connect timeouts, never a hang."""
    import ray

    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    if address == "local":
        ray.init(num_cpus=processes, **quiet)
        return
    if address != "auto":
        host, sep, port = address.removeprefix("ray://").rpartition(":")
        require(bool(sep and host and port.isdigit()),
                f"--ray {address}: expected HOST:PORT, ray://HOST:PORT, auto or local")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=probe_timeout_s).close()
        except OSError as err:
            raise InputError(f"--ray {address}: nothing answers at {host}:{port} ({err.strerror or err}); "
                             f"start a cluster with `ray start --head` or use --ray local") from None
    outcome: list = []

    def init() -> None:
        try:
            ray.init(address=address, **{k: v for k, v in quiet.items() if k != "include_dashboard"})
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - reported to the caller's thread
            outcome.append(err)

    thread = threading.Thread(target=init, daemon=True)
    thread.start()
    thread.join(connect_timeout_s)
    if not outcome:
        raise InputError(f"--ray {address}: no Ray cluster connected within {connect_timeout_s:g} s")
    if outcome[0] is not None:
        first = str(outcome[0]).strip().splitlines()[0] if str(outcome[0]).strip() else type(outcome[0]).__name__
        raise InputError(f"--ray {address}: cannot connect ({first})")


def executor(processes: int, jobs: int | None = None) -> Serial | Processes:
    """A local executor of at most ``processes`` workers (and no more than
    ``jobs``): in this process when that is one."""
    n = min(processes, jobs) if jobs is not None else processes
    return Serial() if n <= 1 else Processes(n)


__all__ = ["Serial", "Processes", "Ray", "connect", "executor", "die_with_parent"]
