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
import contextvars
import random
import selectors
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats_spark import clock

START_TIME = 1000.0  # virtual monotonic seconds at the start (0 reads as "never" in places)


class Crashed(Exception):
    """The participant was killed (kill -9)."""


class Lost(Exception):
    """Spark gave up on the task attempt; it runs on (a zombie)."""


class Deadlock(Exception):
    """Nothing is ready and no timer is set: the simulation cannot go on."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector whose wait advances the loop's virtual clock instead of blocking."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        self.keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self.keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every participant waits and no timer is set")
        self.loop.now += max(timeout, 0.0)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self.keys

    def close(self) -> None:
        self.keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = START_TIME
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self.now


@dataclass(eq=False)
class Participant:
    name: str
    kind: str  # driver, task, world
    finished: asyncio.Future[Any]
    parent: Participant | None = None
    dead: bool = False
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

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time() - START_TIME

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
        loop = asyncio.get_running_loop()
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

    async def point(self, what: str) -> None:
        """A scheduling point of the current participant (before or after one fake I/O)."""
        me = _current.get()
        if me is None:
            await asyncio.sleep(0)
            return
        if me.dead:
            await _forever()
        self.steps += 1
        if self.verbose:
            self.note(what)
        loop = asyncio.get_running_loop()
        if me.frozen_until > loop.time():  # another coroutine of this process stalled it
            await asyncio.sleep(me.frozen_until - loop.time())
        chaos = self.chaos
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
        draw = self.rng.random()
        if chaos.enabled and draw < chaos.stall:
            delay = self.ack_wait * self.rng.uniform(0.2, 1.3)
            me.frozen_until = loop.time() + delay
            self.note(f"stalls {delay:.1f}s at {what} (its whole process)")
        elif draw < 0.4:
            return  # no switch: the call answers at once
        elif draw < 0.7:
            delay = 0.0
        else:
            delay = self.rng.choice((0.001, 0.01, 0.05, 0.2))
        await asyncio.sleep(delay)
        if me.dead:
            await _forever()

    def kill(self, victim: Participant, at: str) -> None:
        victim.dead = True
        self.note(f"CRASH {victim.name} at {at}")
        if not victim.finished.done():
            victim.finished.set_exception(Crashed())
        if victim.kind == "driver":  # its process's tasks die with it, or linger a while
            for other in self.participants:
                if other.parent is victim and not other.dead and self.rng.random() < 0.5:
                    self.kill(other, at="its driver's crash")

    def current(self) -> Participant | None:
        return _current.get()


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on a fresh virtual loop, with `nats_spark.clock` on its time. Abandoned
    participants are left where they stopped: the loop is closed without finalizing them."""
    loop = VirtualLoop()
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
