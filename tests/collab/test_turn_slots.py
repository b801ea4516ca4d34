"""A worker process's turn slots and a running turn's stop signal, without a database.

``collab.runtime.slots.TurnSlots`` is the accounting that lets one worker process run many turns
at once: at most ``size`` slots are taken, a turn started in a taken slot runs on a slot thread
and gives its slot back when it ends (however it ends), ``after`` runs on that thread, and the
counts it reports (``in_use``, ``running``, ``snapshot``) are what is really held — also when many
threads take, start and give back at once.

``collab.services.liveness.StopSignal`` is how a turn learns of a stop request from its process's
stop watch: ``set`` wakes whoever waits on it, and ``aborting(abort)`` calls ``abort`` when the
stop comes during the block (at once if it came before), never after the block.
"""

import os
import random
import threading
import time

import pytest

from collab.runtime.slots import TurnSlots, process_slots
from collab.services.liveness import StopSignal

pytestmark = pytest.mark.timeout(60)

SOON = 10.0  # what "promptly" may take on a loaded machine; never reached when things work


def eventually(condition, timeout=SOON, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached after {timeout}s"
        time.sleep(0.005)


# --- taking and giving back ---------------------------------------------------------------------


def test_slots_are_taken_up_to_their_size_and_a_further_take_times_out():
    slots = TurnSlots(3)
    assert [slots.take(timeout=0) for _ in range(3)] == [True, True, True]
    assert slots.in_use() == 3
    started = time.monotonic()
    assert slots.take(timeout=0.2) is False
    assert time.monotonic() - started >= 0.15  # it waited for its timeout before saying no
    assert slots.take(timeout=0) is False
    assert slots.in_use() == 3  # a refused take holds nothing


def test_giving_back_a_slot_frees_exactly_one():
    slots = TurnSlots(2)
    assert slots.take(timeout=0) and slots.take(timeout=0)
    slots.give_back()
    assert slots.in_use() == 1
    assert slots.take(timeout=0) is True
    assert slots.take(timeout=0) is False
    slots.give_back()
    slots.give_back()
    assert slots.in_use() == 0
    with pytest.raises(RuntimeError):
        slots.give_back()  # nothing taken: nothing to give back
    assert slots.in_use() == 0


def test_a_waiting_take_gets_the_slot_given_back_meanwhile():
    slots = TurnSlots(1)
    assert slots.take(timeout=0)
    threading.Timer(0.2, slots.give_back).start()
    started = time.monotonic()
    assert slots.take(timeout=SOON) is True
    assert time.monotonic() - started < SOON
    assert slots.in_use() == 1


def test_slots_count_as_contended_while_all_are_in_use_and_a_moment_after(monkeypatch):
    from collab.runtime import slots as module

    clock = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    slots = TurnSlots(2)
    assert slots.take(0) and not slots.contended()  # one of two in use: nothing waits
    assert slots.take(0) and slots.contended()  # all in use
    slots.give_back()
    clock[0] += module.CONTENDED_SECONDS / 2
    assert slots.contended(), "turns that ended together free their slots together"
    clock[0] += module.CONTENDED_SECONDS
    assert not slots.contended()
    assert slots.take(0) and slots.contended()  # all in use again
    assert not slots.take(0) and slots.contended()  # a take that finds none free
    clock[0] += 10 * module.CONTENDED_SECONDS  # full all this time; then turns end together
    slots.give_back()
    slots.give_back()
    assert slots.take(0) and slots.contended(), "the slots were full until a moment ago"


def test_a_process_needs_at_least_one_slot():
    with pytest.raises(ValueError):
        TurnSlots(0)


# --- turns in slots -----------------------------------------------------------------------------


def test_a_started_turn_holds_its_slot_until_it_ends_then_frees_it():
    slots = TurnSlots(2)
    release = threading.Event()
    assert slots.take(timeout=0)
    slots.start("job-a", lambda: release.wait(SOON))
    assert slots.running() == ["job-a"]
    assert slots.in_use() == 1
    snap = slots.snapshot()
    assert snap["size"] == 2 and snap["in_use"] == 1 and snap["free"] == 1 and snap["started"] == 1
    assert list(snap["running"]) == ["job-a"] and snap["running"]["job-a"] >= 0
    release.set()
    eventually(lambda: slots.in_use() == 0, what="the ended turn's slot to come free")
    assert slots.running() == []
    snap = slots.snapshot()
    assert snap == {"size": 2, "in_use": 0, "free": 2, "started": 1, "running": {}}


def test_a_turn_that_raises_frees_its_slot_and_its_after_still_runs():
    slots = TurnSlots(1)
    ran_after = threading.Event()

    def turn():
        raise RuntimeError("the turn blew up")

    assert slots.take(timeout=0)
    slots.start("job-boom", turn, after=ran_after.set)
    assert ran_after.wait(SOON)
    eventually(lambda: slots.in_use() == 0, what="the failed turn's slot to come free")
    assert slots.running() == []
    assert slots.take(timeout=0) is True  # the slot is really free again


def test_an_after_that_raises_still_frees_the_slot():
    slots = TurnSlots(1)

    def after():
        raise RuntimeError("closing the connection failed")

    assert slots.take(timeout=0)
    slots.start("job-after-boom", lambda: None, after=after)
    eventually(lambda: slots.in_use() == 0, what="the slot to come free")
    assert slots.running() == []


def test_after_runs_on_the_slot_thread_once_the_turn_has_ended():
    slots = TurnSlots(2)
    seen = []
    done = threading.Event()

    def turn():
        seen.append(("turn", threading.current_thread()))

    def after():
        seen.append(("after", threading.current_thread()))
        # the turn is still counted while its after runs: the slot is given back after it
        seen.append(("running during after", slots.running()))
        done.set()

    assert slots.take(timeout=0)
    slots.start("job-t", turn, after=after)
    assert done.wait(SOON)
    (first, turn_thread), (second, after_thread), (_, during) = seen
    assert (first, second) == ("turn", "after")
    assert after_thread is turn_thread
    assert turn_thread is not threading.current_thread()
    assert turn_thread.name.startswith("trellis-turn")
    assert during == ["job-t"]
    eventually(lambda: slots.in_use() == 0, what="the slot to come free")


def test_start_needs_a_slot_taken_for_it():
    slots = TurnSlots(2)
    with pytest.raises(RuntimeError):
        slots.start("job-x", lambda: None)  # nothing taken
    assert slots.in_use() == 0 and slots.running() == []

    release = threading.Event()
    assert slots.take(timeout=0)
    slots.start("job-1", lambda: release.wait(SOON))
    with pytest.raises(RuntimeError):
        slots.start("job-2", lambda: None)  # the one slot taken is job-1's
    assert slots.running() == ["job-1"] and slots.in_use() == 1
    release.set()
    eventually(lambda: slots.in_use() == 0, what="the slot to come free")


def test_a_job_runs_in_at_most_one_slot_of_a_process():
    slots = TurnSlots(2)
    release = threading.Event()
    assert slots.take(timeout=0) and slots.take(timeout=0)
    slots.start("job-same", lambda: release.wait(SOON))
    with pytest.raises(RuntimeError):
        slots.start("job-same", lambda: None)
    # the refused start left its taken slot taken: the caller gives it back
    assert slots.in_use() == 2 and slots.running() == ["job-same"]
    slots.give_back()
    assert slots.in_use() == 1
    release.set()
    eventually(lambda: slots.in_use() == 0, what="the slot to come free")
    assert slots.snapshot()["started"] == 1


def test_turns_in_flight_are_reported_with_how_long_they_have_run():
    slots = TurnSlots(4)
    release = threading.Event()
    for job in ("job-c", "job-a", "job-b"):
        assert slots.take(timeout=0)
        slots.start(job, lambda: release.wait(SOON))
    assert slots.take(timeout=0)  # taken, not started: counted in use, not running
    time.sleep(0.15)
    assert slots.running() == ["job-a", "job-b", "job-c"]
    snap = slots.snapshot()
    assert (snap["size"], snap["in_use"], snap["free"], snap["started"]) == (4, 4, 0, 3)
    assert sorted(snap["running"]) == ["job-a", "job-b", "job-c"]
    assert all(isinstance(age, float) and age >= 0.1 for age in snap["running"].values())
    release.set()
    slots.give_back()
    eventually(lambda: slots.in_use() == 0, what="every slot to come free")
    assert slots.snapshot()["free"] == 4


def test_many_threads_taking_starting_and_giving_back_never_exceed_the_size():
    size, threads, rounds = 4, 24, 250
    slots = TurnSlots(size)
    lock = threading.Lock()
    held = [0]  # slots held as the takers see them: from a successful take to give_back / after
    running = [0]  # turns inside their body
    peak = {"held": 0, "running": 0, "in_use": 0}
    started = [0]
    failures = []

    def hold(counter, name, delta):
        with lock:
            counter[0] += delta
            peak[name] = max(peak[name], counter[0])

    def body():
        hold(running, "running", +1)
        try:
            if random.random() < 0.1:
                raise RuntimeError("some turns fail")
            time.sleep(random.choice((0, 0, 0.0005, 0.001)))
        finally:
            hold(running, "running", -1)

    def taker(n):
        try:
            for i in range(rounds):
                if not slots.take(timeout=SOON):
                    failures.append(f"thread {n}: no slot within {SOON}s")
                    return
                hold(held, "held", +1)
                seen = slots.in_use()
                with lock:
                    peak["in_use"] = max(peak["in_use"], seen)
                if random.random() < 0.25:
                    hold(held, "held", -1)
                    slots.give_back()
                else:
                    with lock:
                        started[0] += 1
                    slots.start(f"job-{n}-{i}", body, after=lambda: hold(held, "held", -1))
        except Exception as exc:  # reported below, with the thread that saw it
            failures.append(f"thread {n}: {exc!r}")

    workers = [threading.Thread(target=taker, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(SOON * 6)
    assert not any(t.is_alive() for t in workers), "a taker is stuck"
    assert failures == []
    eventually(lambda: slots.in_use() == 0, what="every slot to come free")
    assert peak["held"] <= size, peak
    assert peak["running"] <= size, peak
    assert peak["in_use"] <= size, peak
    assert peak["running"] >= 2, peak  # it really ran turns side by side
    assert slots.running() == []
    snap = slots.snapshot()
    assert snap["started"] == started[0] > 0
    assert snap["in_use"] == 0 and snap["free"] == size


def test_a_process_has_one_set_of_slots_and_a_forked_child_its_own():
    from django.conf import settings

    mine = process_slots()
    assert process_slots() is mine
    assert mine.size == settings.TRELLIS_TURNS_PER_WORKER
    assert mine.take(timeout=0)
    try:
        pid = os.fork()
        if pid == 0:  # the child: django-q2 forks its workers the same way
            code = 1
            try:
                child = process_slots()
                code = 0 if child is not mine and child.in_use() == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        mine.give_back()
    assert process_slots() is mine


# --- a running turn's stop signal ------------------------------------------------------------------


def test_setting_a_stop_signal_wakes_a_waiter():
    signal = StopSignal()
    assert not signal.is_set() and signal.status is None
    assert signal.wait(0.05) is False
    woke = {}

    def waiter():
        started = time.monotonic()
        woke["result"] = signal.wait(SOON)
        woke["after"] = time.monotonic() - started

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    signal.set("stopping")
    t.join(SOON)
    assert woke["result"] is True and woke["after"] < SOON
    assert signal.is_set() and signal.status == "stopping"
    signal.set("cancelled")  # the first stop is the one it reports
    assert signal.status == "stopping"


def test_a_stop_calls_the_abort_of_a_block_in_progress_once():
    signal = StopSignal()
    calls = []
    with signal.aborting(lambda: calls.append(threading.current_thread())):
        assert calls == []
        setter = threading.Thread(target=signal.set, args=("stopping",))
        setter.start()
        setter.join(SOON)
        assert calls == [setter]  # called from the thread that set the stop (the stop watch)
        signal.set("stopping")
    assert len(calls) == 1


def test_a_block_entered_after_the_stop_is_aborted_at_once():
    signal = StopSignal()
    signal.set("stopping")
    calls = []
    with signal.aborting(lambda: calls.append("abort")):
        assert calls == ["abort"]  # before the block's body runs
    assert calls == ["abort"]


def test_no_abort_after_its_block_has_ended():
    signal = StopSignal()
    calls = []
    with signal.aborting(lambda: calls.append("first")):
        pass
    with signal.aborting(lambda: calls.append("second")):
        pass
    signal.set("stopping")
    assert calls == []


def test_only_the_blocks_in_progress_are_aborted_and_a_failing_abort_stops_no_other():
    signal = StopSignal()
    calls = []

    def broken():
        calls.append("broken")
        raise RuntimeError("the client was closed already")

    with signal.aborting(lambda: calls.append("ended")):
        pass
    with signal.aborting(broken), signal.aborting(lambda: calls.append("inner")):
        signal.set("stopping")
    assert sorted(calls) == ["broken", "inner"]
    assert signal.is_set() and signal.status == "stopping"


def test_a_running_job_is_registered_with_its_stop_signal_only_while_it_runs(monkeypatch):
    from collab.services import liveness

    monkeypatch.setattr(liveness, "start_heartbeat", lambda: None)  # no threads, no database
    assert liveness.stop_signal("job-live") is None
    with liveness.running("job-live") as signal:
        assert isinstance(signal, StopSignal) and not signal.is_set()
        assert liveness.stop_signal("job-live") is signal
        assert "job-live" in liveness.running_job_ids()
    assert liveness.stop_signal("job-live") is None
    assert "job-live" not in liveness.running_job_ids()
