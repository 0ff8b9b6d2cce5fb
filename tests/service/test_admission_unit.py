"""The admission primitive (service/admission.py) alone: the places a queue holds, the drain gate, and a
call admitted before the drain going on through it. The doors' behaviour is proven on real servers
(test_overload_doors.py, test_drain.py, test_service_admission.py)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from service.admission import Admission, Gate
from service.errors import InvalidArgument, ResourceExhausted, Unavailable


def test_places_are_held_from_take_to_queued_and_never_pass_the_capacity():
    queue: list[int] = []
    adm = Admission("translation", "m", 5, "queued sources", waiting=lambda: len(queue))
    adm.take(3)
    with pytest.raises(ResourceExhausted) as err:
        adm.take(3)  # 3 held + 3 > 5
    assert err.value.message == (
        "translation queue of model 'm' is full (3 of 5 queued sources: 0 waiting, "
        "3 being tokenized; this call adds 3); retry with backoff"
    )
    queue.extend([1, 2, 3])
    adm.queued(3)  # the queue counts them now
    assert adm.reserved == 0
    adm.take(2)
    with pytest.raises(ResourceExhausted, match="3 waiting, 2 being tokenized"):
        adm.take(1)
    adm.release(2)  # the call failed before queueing
    queue.clear()
    adm.take(5)


def test_a_call_bigger_than_the_queue_is_invalid_not_retried():
    """No wait would let 6 places into a queue of 5: INVALID_ARGUMENT telling to split, even when empty."""
    adm = Admission("generation", "m", 5, "queued requests", waiting=lambda: 0)
    with pytest.raises(InvalidArgument) as err:
        adm.take(6)
    assert err.value.message == (
        "this call needs 6 places; the generation queue of model 'm' holds 5 queued requests: split the call"
    )
    assert adm.reserved == 0
    adm.take(5)  # the whole queue is fine


def test_giving_back_more_than_held_is_logged_and_clamped(caplog):
    """A double release must not silently raise the capacity: reserved stays >= 0 and the log says so."""
    queue: list[int] = []
    adm = Admission("embedding", "m", 3, "queued inputs", waiting=lambda: len(queue))
    adm.take(2)
    adm.release(2)
    adm.release(2)  # a bug in a caller: given back twice
    assert adm.reserved == 0
    assert "2 places released but only 0 held" in caplog.text
    adm.take(1)
    adm.queued(3)  # more than held again
    assert adm.reserved == 0
    assert "3 places queued but only 1 held" in caplog.text
    adm.take(3)
    with pytest.raises(ResourceExhausted):  # the capacity is still 3
        adm.take(1)


def test_a_pool_without_a_queue_counts_only_what_it_holds():
    pool = Admission("attention", "", 2, "calls computing")
    with pool.holding(), pool.holding():
        with pytest.raises(ResourceExhausted) as err:
            pool.take()
        assert err.value.message == (
            "attention queue is full (2 of 2 calls computing; this call adds 1); retry with backoff"
        )
    assert pool.reserved == 0
    pool.take(2)


def test_draining_and_stopping_refuse_with_unavailable_before_the_capacity():
    gate = Gate()
    adm = Admission("embedding", "m", 1, "queued inputs", gate=gate, waiting=lambda: 1)  # also full
    gate.draining = True
    with pytest.raises(Unavailable, match="the server is shutting down"):
        adm.take()
    gate.draining = False
    adm.closing = True
    with pytest.raises(Unavailable, match="model 'm' is shutting down"):
        adm.take()


async def test_a_call_that_entered_before_the_drain_goes_on_and_a_new_one_is_refused():
    gate = Gate()
    adm = Admission("embedding", "m", 10, "queued inputs", gate=gate, waiting=lambda: 0)
    started, drained = asyncio.Event(), asyncio.Event()

    async def stream() -> None:  # e.g. an EmbedStream: admitted once, then one take per message
        gate.enter()
        adm.take()
        started.set()
        await drained.wait()
        adm.take()  # a later message of the same call, after the drain started

    task = asyncio.create_task(stream())
    await started.wait()
    gate.draining = True
    drained.set()
    await task
    assert adm.reserved == 2
    with pytest.raises(Unavailable):  # a new call (its own context) is refused
        contextvars.Context().run(gate.enter)
