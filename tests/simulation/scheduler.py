"""The simulation's one clock and its seeded scheduler.

Everything runs on one asyncio loop whose time is virtual: when no callback is ready the loop
jumps to the next timer instead of waiting, so ack waits, pull expiries and the keepers' looks
cost nothing and happen in the same order on every run of a seed. `nats_spark.clock` reads the
same time.

Each participant (a Spark driver, a task attempt, the publisher) runs as a task whose context
names it; tasks it starts (its keepers) inherit the name. Every fake I/O call is a scheduling
point (`Scheduler.point`): there the seeded generator picks a delay (none, or a little) and may
crash the participant, or rarely stall its whole process for a good part of an ack wait (each
of its coroutines then waits at its next scheduling point until the stall is over). A crashed
participant's coroutines are abandoned where they are, as after kill -9: they never run again,
no `finally` of theirs runs, and whatever they held in memory is gone. A task attempt may also
be lost instead: Spark gives up on it and retries, while it runs on beside its retry (a zombie).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import heapq
import random
import types
from asyncio import base_events, events, futures
from collections.abc import Callable, Coroutine, Generator
from contextvars import Context
from dataclasses import dataclass, field
from typing import Any, TypeVarTuple, Unpack

from nats_spark import clock

_Ts = TypeVarTuple("_Ts")
_allocate = object.__new__  # an instance, without running its __init__
START_TIME = 1000.0  # virtual monotonic seconds at the start (0 reads as "never" in places)


class Crashed(Exception):
    """The participant was killed (kill -9)."""


class Lost(Exception):
    """Spark gave up on the task attempt; it runs on (a zombie)."""


class Deadlock(Exception):
    """Nothing is ready and no timer is set: the simulation cannot go on."""


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop on virtual time: when no callback is ready it jumps to the next timer.

    It takes asyncio's own steps in asyncio's order (cancelled timers dropped the same way, due
    timers moved to the ready queue, then the callbacks ready at the start of the round), so a
    seed's schedule is what it was on asyncio's selector loop; it only skips the selector and
    the I/O polling, and goes round without returning to `run_forever` until it is stopped.
    Callbacks and timers are scheduled and run without asyncio's checks for debug mode, a closed
    loop and other threads, which the simulation never needs and would pay at every step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = START_TIME

    def time(self) -> float:
        return self.now

    def call_soon(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> events.Handle:
        handle = self._new_handle(events.Handle, callback, args, context)
        self._ready.append(handle)  # type: ignore[attr-defined]  # asyncio's private state
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> events.TimerHandle:
        timer = self._new_handle(_TimerHandle, callback, args, context)
        timer._when = when
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True
        return timer

    def _new_handle(self, kind: type, callback: Any, args: Any, context: Context | None) -> Any:
        """What asyncio's `Handle.__init__` sets, on a bare handle (no `__init__` call per step),
        without asking the loop whether it is in debug mode."""
        handle: Any = _allocate(kind)
        handle._context = contextvars.copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> events.TimerHandle:
        return self.call_at(self.now + delay, callback, *args, context=context)

    def _run_once(self) -> None:
        base: Any = self  # asyncio's private state, which typeshed does not declare
        ready: collections.deque[Any] = base._ready
        popleft, heappop, resolution = ready.popleft, heapq.heappop, base._clock_resolution
        while True:
            scheduled = base._scheduled
            if scheduled and (scheduled[0]._cancelled or len(scheduled) > _REBUILD_FROM):
                scheduled = self._drop_cancelled_timers()  # else it would leave them as they are
            if not ready and not base._stopping:
                if not scheduled:
                    raise Deadlock("every participant waits and no timer is set")
                wait = scheduled[0]._when - self.now  # asyncio's timeout, without min and max
                if wait > 0:
                    self.now += wait if wait < _MAX_WAIT else _MAX_WAIT
            end_time = self.now + resolution
            while scheduled and scheduled[0]._when < end_time:
                handle = heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)
            for _ in range(len(ready)):
                handle = popleft()
                if not handle._cancelled:
                    try:  # `Handle._run`, inline
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as error:
                        message = f"Exception in callback {handle._callback!r}"
                        context = {"message": message, "exception": error, "handle": handle}
                        self.call_exception_handler(context)
            if base._stopping:
                return

    def _write_to_self(self) -> None:
        """Nothing to wake: the loop never blocks (async generators are closed this way)."""

    def _drop_cancelled_timers(self) -> list[Any]:
        """asyncio's: rebuild the timer heap when most of it is cancelled, else pop its head."""
        base: Any = self
        scheduled: list[Any] = base._scheduled
        if (
            len(scheduled) > _REBUILD_FROM
            and base._timer_cancelled_count / len(scheduled) > _REBUILD_FRACTION
        ):
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
            base._scheduled = scheduled = [h for h in scheduled if not h._cancelled]
            heapq.heapify(scheduled)
            base._timer_cancelled_count = 0
            return scheduled
        while scheduled and scheduled[0]._cancelled:
            base._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        return scheduled


class _TimerHandle(events.TimerHandle):
    __slots__ = ()

    def __lt__(self, other: Any) -> bool:  # the heap's order: asyncio's, without its type check
        return self._when < other._when


# asyncio's own thresholds (base_events), so that timers run in the same order as there.
_ASYNCIO: Any = base_events  # typeshed does not declare these
_REBUILD_FROM: int = _ASYNCIO._MIN_SCHEDULED_TIMER_HANDLES
_REBUILD_FRACTION: float = _ASYNCIO._MIN_CANCELLED_TIMER_HANDLES_FRACTION
_MAX_WAIT: float = _ASYNCIO.MAXIMUM_SELECT_TIMEOUT
_FUTURES: Any = futures  # its `_set_result_unless_cancelled`, which asyncio.sleep's timer calls


@dataclass(eq=False)
class Participant:
    name: str
    kind: str  # driver, task, world
    finished: asyncio.Future[Any]
    parent: Participant | None = None
    dead: bool = False
    died: float | None = None  # when it was killed (the scheduler's time)
    lost: bool = False
    frozen_until: float = 0.0  # a stall: the whole process pauses (GC, CPU starvation)
    task: asyncio.Task[None] | None = None  # held, so an abandoned one is never finalized


_current: contextvars.ContextVar[Participant | None] = contextvars.ContextVar(
    "participant", default=None
)


@dataclass
class Chaos:
    """How often the scheduler interferes: per scheduling point of a driver or a task, the
    chance to crash it (or lose a task attempt), and to stall it."""

    driver_crash: float = 0.0
    task_crash: float = 0.0
    task_lost: float = 0.0
    stall: float = 0.0
    crashes: int = 0  # at most this many crashes and losses in all
    # A lost attempt's executor stalled (a long pause, its heartbeats stopped: Spark gives up on
    # it), and its attempt runs on once the stall ends, after 1 to this many ack waits (0: it
    # runs on at once, as one cut off from the driver does).
    lost_stall: float = 0.0
    # Per scheduling point of a lost attempt that runs on, the chance its executor is killed
    # (as a lost one's often is): it dies mid-way, between any two of its requests (0: never;
    # nothing drawn then).
    dying_zombies: float = 0.0
    enabled: bool = True


@dataclass
class Scheduler:
    rng: random.Random
    chaos: Chaos
    ack_wait: float
    trace: list[str] = field(default_factory=list)
    verbose: bool = False
    steps: int = 0
    participants: list[Participant] = field(default_factory=list)
    loop: VirtualLoop = field(default_factory=VirtualLoop)
    stalls: list[tuple[Participant, float, float]] = field(default_factory=list)  # from, until

    @property
    def now(self) -> float:
        return self.loop.now - START_TIME

    def note(self, what: str) -> None:
        who = _current.get()
        line = f"{self.now:10.3f} {who.name if who else 'world':<22} {what}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    def spawn(
        self,
        name: str,
        kind: str,
        coro: Coroutine[Any, Any, Any],
        parent: Participant | None = None,
    ) -> Participant:
        loop = self.loop
        participant = Participant(name, kind, loop.create_future(), parent)
        self.participants.append(participant)
        context = contextvars.copy_context()
        context.run(_current.set, participant)
        participant.task = loop.create_task(self._run(participant, coro), context=context)
        return participant

    async def _run(self, participant: Participant, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            result = await coro
        except Exception as error:
            if not participant.finished.done():
                participant.finished.set_exception(error)
            if not participant.lost:
                self.note(f"failed: {type(error).__name__}: {error}")
            return
        if not participant.finished.done():
            participant.finished.set_result(result)

    async def sleep(self, delay: float) -> None:
        """`asyncio.sleep(delay)`: the same steps, without looking up the running loop. A
        participant that crashed meanwhile never wakes (it must not act, nor be observed)."""
        if delay > 0:  # `asyncio.sleep`'s steps, written out: one coroutine less per sleep
            loop = self.loop
            future: asyncio.Future[None] = futures.Future(loop=loop)
            wake = _FUTURES._set_result_unless_cancelled
            timer = loop.call_at(loop.now + delay, wake, future, None)
            try:
                await future
            finally:
                if timer._scheduled:  # else it ran, or runs on a done future: nothing to cancel
                    timer.cancel()
        else:
            await _yield()
        me = _current.get()
        if me is not None and me.dead:
            await _forever()

    async def point(self, what: str) -> None:
        """A scheduling point of the current participant (before or after one fake I/O)."""
        me = _current.get()
        if me is None:
            await _yield()
            return
        if me.dead:
            await _forever()
        self.steps += 1
        if self.verbose:
            self.note(what)
        loop = self.loop
        if me.frozen_until > loop.now:  # another coroutine of this process stalled it
            await self.sleep(me.frozen_until - loop.now)
        chaos = self.chaos
        if (
            chaos.enabled
            and me.lost
            and chaos.dying_zombies
            and self.rng.random() < chaos.dying_zombies
        ):
            self.kill(me, at=what)
            await _forever()
        if chaos.enabled and chaos.crashes > 0 and me.kind in ("driver", "task"):
            draw = self.rng.random()
            crash = chaos.driver_crash if me.kind == "driver" else chaos.task_crash
            if draw < crash:
                chaos.crashes -= 1
                self.kill(me, at=what)
                await _forever()
            if me.kind == "task" and not me.lost and draw < crash + chaos.task_lost:
                chaos.crashes -= 1
                me.lost = True
                self.note(f"LOST at {what} (Spark retries it; it runs on)")
                me.finished.set_exception(Lost())
                if chaos.lost_stall:
                    self.stall(me, what, self.ack_wait * self.rng.uniform(1.0, chaos.lost_stall))
                    await self.sleep(me.frozen_until - loop.now)
                    return
        draw = self.rng.random()
        if chaos.enabled and draw < chaos.stall:
            delay = self.ack_wait * self.rng.uniform(0.2, 1.3)
            self.stall(me, what, delay)
        elif draw < 0.4:
            return  # no switch: the call answers at once
        elif draw < 0.7:  # `sleep(0)`, without its coroutine: one round of the loop
            await _yield()
            if me.dead:
                await _forever()
            return
        else:
            delay = self.rng.choice((0.001, 0.01, 0.05, 0.2))
        await self.sleep(delay)

    def stall(self, me: Participant, at: str, delay: float) -> None:
        """`me`'s whole process pauses for `delay` seconds from now (GC, CPU starvation)."""
        me.frozen_until = self.loop.now + delay
        self.stalls.append((me, self.now, self.now + delay))
        self.note(f"stalls {delay:.1f}s at {at} (its whole process)")

    def kill(self, victim: Participant, at: str) -> None:
        victim.dead, victim.died = True, self.now
        self.note(f"CRASH {victim.name} at {at}")
        if not victim.finished.done():
            victim.finished.set_exception(Crashed())
        if victim.kind == "driver":  # its process's tasks die with it, or linger a while
            for other in self.participants:
                if other.parent is victim and not other.dead and self.rng.random() < 0.5:
                    self.kill(other, at="its driver's crash")

    def current(self) -> Participant | None:
        return _current.get()


@types.coroutine
def _yield() -> Generator[None, None, None]:
    """`asyncio.sleep(0)`: one round of the loop."""
    yield


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


def run(loop: VirtualLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on `loop` (a fresh one), with `nats_spark.clock` on its time. Abandoned
    participants are left where they stopped: the loop is closed without finalizing them."""
    loop.set_exception_handler(_ignore_abandoned)
    previous = clock.use(loop.time)
    try:
        return loop.run_until_complete(coro)
    finally:
        clock.use(previous)
        loop.close()


def _ignore_abandoned(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Tasks of crashed participants are destroyed pending: that is the point of a crash."""
    if "destroyed but it is pending" in context.get("message", ""):
        return
    loop.default_exception_handler(context)
