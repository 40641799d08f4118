"""The handle's lifetime in the binding: calls racing close(), finalisation, context manager.

The C ABI forbids ``kvt_tier_free``/``kvt_tier_shutdown`` concurrently with any other call
on the tier and any use of a freed handle. The binding makes both impossible from Python:
every C call holds a shared use of the handle, and close()/shutdown() wait for those uses
and keep new ones out. These tests stop a C call half-way (a wrapper around the library
function that blocks on an event) and check the order in which the library is called.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import threading
import warnings
import weakref

import numpy as np
import pytest

import kvtier
from kvtier import ShutDownError, Tier, _native
from kvtier import tier as tier_module

WAIT = 30.0  # generous bound for a busy machine; never reached when the binding is right


def local(tmp_path):
    return {"store": {"type": "local", "path": str(tmp_path / "store")}}


class Recorder:
    """Wraps library functions: records calls (name, handle) and can hold one mid-call."""

    def __init__(self, monkeypatch):
        self.lib = _native.load()
        self.monkeypatch = monkeypatch
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def wrap(self, name: str, hold: threading.Event | None = None, entered: threading.Event | None = None):
        real = getattr(self.lib, name)

        def wrapper(*args):
            ptr = args[0] if args else None
            if entered is not None:
                entered.set()
            if hold is not None:
                assert hold.wait(WAIT), f"{name} was never released"
            with self.lock:
                self.calls.append((name, ptr))
            return real(*args)

        self.monkeypatch.setattr(self.lib, name, wrapper)

    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _ in self.calls]


def wait_until(predicate, what: str) -> None:
    """Waits for a state change another thread makes (bounded; fails the test on timeout)."""
    done = threading.Event()
    for _ in range(int(WAIT * 1000)):
        if predicate():
            return
        done.wait(0.001)
    pytest.fail(f"timed out waiting for {what}")


def waiting_for_handle(tier) -> bool:
    """True once a thread blocks in the handle's condition (close/shutdown waiting for users)."""
    return bool(tier._h._cond._waiters)


def run_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def test_close_waits_for_a_call_in_progress(tmp_path, monkeypatch):
    tier = Tier(local(tmp_path))
    rec = Recorder(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    rec.wrap("kvt_tier_stats", hold=release, entered=entered)
    rec.wrap("kvt_tier_free")

    caller, caller_out = run_thread(tier.stats)
    assert entered.wait(WAIT)  # the caller is inside the C call, holding the handle
    closer, closer_out = run_thread(tier.close)
    # close() has either freed the handle under the running call (the bug) or is waiting.
    wait_until(lambda: "kvt_tier_free" in rec.names() or waiting_for_handle(tier), "close() to start")
    assert "kvt_tier_free" not in rec.names(), "kvt_tier_free ran while kvt_tier_stats was in progress"

    release.set()
    caller.join(WAIT)
    closer.join(WAIT)
    assert not caller.is_alive() and not closer.is_alive()
    assert "error" not in caller_out and "error" not in closer_out, (caller_out, closer_out)
    assert rec.names() == ["kvt_tier_stats", "kvt_tier_free"]
    assert caller_out["value"]["keys_stored"] == 0
    assert tier.closed


def test_a_call_arriving_during_close_raises_instead_of_using_the_freed_handle(tmp_path, monkeypatch):
    tier = Tier(local(tmp_path))
    ptr = tier._h.ptr
    rec = Recorder(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    rec.wrap("kvt_tier_stats", hold=release, entered=entered)
    rec.wrap("kvt_tier_free")
    rec.wrap("kvt_tier_jobs_in_flight")

    first, _ = run_thread(tier.stats)
    assert entered.wait(WAIT)
    closer, _ = run_thread(tier.close)
    wait_until(lambda: waiting_for_handle(tier), "close() to wait for the call in progress")
    late, late_out = run_thread(tier.jobs_in_flight)  # arrives while close() is pending
    wait_until(lambda: len(tier._h._cond._waiters) == 2 or late_out, "the late call to wait or return")
    release.set()
    for thread in (first, closer, late):
        thread.join(WAIT)
        assert not thread.is_alive()

    assert isinstance(late_out.get("error"), ShutDownError), late_out
    assert ("kvt_tier_jobs_in_flight", ptr) not in rec.calls
    assert rec.names() == ["kvt_tier_stats", "kvt_tier_free"]


def test_shutdown_waits_for_calls_in_progress_and_later_calls_still_work(tmp_path, monkeypatch):
    tier = Tier(local(tmp_path))
    rec = Recorder(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    rec.wrap("kvt_tier_jobs_in_flight", hold=release, entered=entered)
    rec.wrap("kvt_tier_shutdown")

    caller, caller_out = run_thread(tier.jobs_in_flight)
    assert entered.wait(WAIT)
    stopper, stopper_out = run_thread(tier.shutdown)
    wait_until(lambda: "kvt_tier_shutdown" in rec.names() or waiting_for_handle(tier), "shutdown() to start")
    assert "kvt_tier_shutdown" not in rec.names()
    release.set()
    caller.join(WAIT)
    stopper.join(WAIT)
    assert caller_out == {"value": 0} and "error" not in stopper_out
    assert rec.names() == ["kvt_tier_jobs_in_flight", "kvt_tier_shutdown"]
    assert tier.stats()["keys_stored"] == 0  # collecting still works after shutdown
    tier.close()


def test_many_threads_racing_close_get_results_or_shut_down_errors(tmp_path):
    tier = Tier(local(tmp_path))
    pool = np.zeros((8, 256), dtype=np.uint8)
    tier.register_memory(pool)
    key = bytes(32) + (0).to_bytes(4, "big")
    start = threading.Barrier(5)
    outcomes: list = []

    def hammer(n):
        start.wait(WAIT)
        for i in range(2000):
            try:
                tier.lookup(n * 10_000 + i, key)
                tier.jobs_in_flight()
                tier.stats()
            except ShutDownError:
                outcomes.append("closed")
                return
        outcomes.append("finished")

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    start.wait(WAIT)
    tier.close()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert len(outcomes) == 4 and set(outcomes) <= {"closed", "finished"}
    with pytest.raises(ShutDownError):
        tier.stats()


def test_an_unclosed_tier_is_freed_by_its_finalizer_after_which_the_pool_is_released(tmp_path, monkeypatch):
    assert "__del__" not in vars(Tier)  # no blocking __del__: weakref.finalize instead
    rec = Recorder(monkeypatch)
    seen_pool_alive = []
    real_free = rec.lib.kvt_tier_free

    tier = Tier(local(tmp_path))
    pool = np.zeros((4, 128), dtype=np.uint8)
    pool_ref = weakref.ref(pool)
    tier.register_memory(pool)

    def free(ptr):
        seen_pool_alive.append(pool_ref() is not None)  # the pool outlives kvt_tier_free
        real_free(ptr)

    monkeypatch.setattr(rec.lib, "kvt_tier_free", free)
    tier_ref = weakref.ref(tier)
    with pytest.warns(ResourceWarning, match="not closed"):
        del tier, pool
        gc.collect()
    assert tier_ref() is None
    assert seen_pool_alive == [True]
    gc.collect()
    assert pool_ref() is None


def test_closed_tiers_have_no_finalizer_left(tmp_path, monkeypatch):
    rec = Recorder(monkeypatch)
    rec.wrap("kvt_tier_free")
    with Tier(local(tmp_path)) as tier:
        finalizer = tier._finalizer
        assert finalizer.alive
    assert not finalizer.alive
    tier.close()  # idempotent
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del tier
        gc.collect()
    assert rec.names() == ["kvt_tier_free"]


def test_the_context_manager_closes_on_errors_too(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with Tier(local(tmp_path)) as tier:
            assert isinstance(tier, kvtier.Tier) and not tier.closed
            raise RuntimeError("boom")
    assert tier.closed
    with pytest.raises(ShutDownError):
        tier.lookup(1, bytes(36))


def test_a_failed_constructor_leaves_nothing_to_finalize():
    before = len(tier_module._live_handles)
    with pytest.raises(kvtier.ConfigError):
        Tier({"store": {"type": "local"}})  # no path
    gc.collect()
    assert len(tier_module._live_handles) == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_fork_child_does_not_wait_for_calls_of_the_parents_threads(tmp_path, monkeypatch):
    tier = Tier(local(tmp_path))
    rec = Recorder(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    rec.wrap("kvt_tier_jobs_in_flight", hold=release, entered=entered)
    caller, caller_out = run_thread(tier.jobs_in_flight)
    assert entered.wait(WAIT)  # a thread of the parent uses the handle while it forks
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            try:
                tier.stats()
                message = "stats() did not raise"
            except kvtier.ForkedError:
                tier.close()  # retires the handle; must not wait for the parent's thread
                message = "ok" if tier.closed else "close() left the tier open"
        except BaseException as exc:  # noqa: BLE001
            message = repr(exc)
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], WAIT)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        message = os.read(read_end, 4096).decode() if ready else "the child hung"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
        release.set()
        caller.join(WAIT)
    assert message == "ok"
    assert caller_out == {"value": 0}
    tier.close()
