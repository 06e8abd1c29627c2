"""Ack reply subjects: what they say about a delivery, and acks published in bulk."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Sequence

from nats.aio.client import Client as NATS
from nats.errors import ConnectionClosedError

from nats_spark import clock
from nats_spark.nats_py import queue_command, write_queued

log = logging.getLogger(__name__)


def delivered_at(tokens: Sequence[str | bytes], reply: str | bytes) -> int:
    """Where the delivery count is in a split ack subject: after `$JS.ACK.<stream>.<consumer>`
    (v1, 9 tokens) or after `$JS.ACK.<domain>.<account hash>.<stream>.<consumer>` (v2, 11+)."""
    if len(tokens) < 9 or tokens[0] not in ("$JS", b"$JS") or tokens[1] not in ("ACK", b"ACK"):
        raise ValueError(f"{reply!r} is not a JetStream ack subject")
    return 4 if len(tokens) == 9 else 6


def ack_prefix(reply: bytes) -> bytes:
    """The ack subject up to its delivery count: `$JS.ACK.<stream>.<consumer>`, or the v2 form's
    `$JS.ACK.<domain>.<account hash>.<stream>.<consumer>`, as the server sent it."""
    tokens = reply.split(b".")
    return b".".join(tokens[: delivered_at(tokens, reply)])


# All four bytes: the PUB template below relies on it. `NAK` gives a delivery back for now.
ACK, IN_PROGRESS, NAK = b"+ACK", b"+WPI", b"-NAK"
# Seconds of ack wait below which in-progress acks are neither skipped nor put off: a few
# hundred milliseconds of delay on a busy machine would then let messages come back.
SHORT_ACK_WAIT = 6.0
# Of the ack wait, what a finished task may have used since its held deliveries' wait last
# started before it restarts it at the end; the driver's keeper of finished batches counts on it.
RESTART_AFTER = 1 / 6
# Of the ack wait, how much of it a delivery may have used for sure before a NAK of it is sent:
# past it, its wait may run out before the server has the NAK.
NAK_WITHIN = 1 / 2


def surely_running(since: float, now: float, ack_wait: float) -> bool:
    """Whether a delivery whose ack wait surely started at `since` has it running `now`, with
    more than `NAK_WITHIN` of it left. A NAK names a delivery, but nats-server's `processNak`
    gives back whatever delivery of the stream sequence is pending (it checks the consumer
    sequence against the ack floor only): a NAK of a delivery whose wait ran out, and which the
    server then delivered again, gives back that later delivery (another attempt's, recorded
    and maybe committed) to any reader of the consumer."""
    return now - since < ack_wait * NAK_WITHIN


def ack_commands(replies: Sequence[bytes], kind: bytes = ACK, block: int = 4096) -> list[bytes]:
    """`PUB` commands acking (or, with `IN_PROGRESS`, restarting the ack wait of) every delivery
    in `replies`, in blocks of `block` commands, built by joining and replacing bytes: no Python
    step per ack (ack subjects come from the server, so they need no validation)."""
    tail = b" 4\r\n%b\r\n" % kind
    return [
        b"PUB " + b"\n".join(replies[start : start + block]).replace(b"\n", tail + b"PUB ") + tail
        for start in range(0, len(replies), block)
    ]


async def publish_acks(
    nc: NATS, replies: Sequence[bytes], block: int = 4096, kind: bytes = ACK
) -> int:
    """Ack every delivery in `replies` and wait until the server has them all; returns the count.
    With `kind=IN_PROGRESS` the deliveries are not acked but their ack wait starts over."""
    return await send_acks(nc, ack_commands(replies, kind, block), len(replies))


async def send_acks(nc: NATS, commands: Sequence[bytes], count: int) -> int:
    """Queue `commands` (`ack_commands`, `EntryDeliveries.ack_commands`) on the connection's write
    buffer and wait until the server has processed them all (one round trip, see
    `flush_published`); returns `count`, the acks they hold. nats-py has no batch publish, and
    `publish` costs microseconds per call."""
    if nc.is_closed:
        raise ConnectionClosedError
    for command in commands:
        await queue_command(nc, command)
    if commands:
        await flush_published(nc, timeout=30)
    return count


async def flush_published(nc: NATS, timeout: float) -> None:
    """Return once the server has processed everything published on `nc` so far.

    nats-py's `flush()` writes its PING straight to the socket, ahead of commands still queued
    for its flusher task, so its PONG can come back before the server has seen those commands
    (and before any permission error they cause). Writing the queue out first keeps them ahead
    of the PING.
    """
    await write_queued(nc, force=True)
    # Shielded: a flush cancelled while its PING is out leaves nats-py's PONG handler a
    # cancelled future, and the exception that raises ends the connection's read loop.
    await asyncio.shield(nc.flush(timeout=timeout))  # type: ignore[arg-type]  # a float works


class InProgressKeeper:
    """Keeps held deliveries from being redelivered: `+WPI` for all of them a few times per ack
    wait (nats.go's `InProgress`), from `run` until `stop`. Stopped, never cancelled: it may be
    inside a flush (see `flush_published`)."""

    def __init__(self, nc: NATS, ack_wait: float, label: str) -> None:
        self.nc = nc
        self.ack_wait = ack_wait
        self.label = label
        self.held: dict[int, bytes] = {}  # stream seq -> reply subject of its latest delivery
        # stream seq -> when the ack wait of its latest delivery surely last started: its pull
        # request's sending, or a confirmed round's (a give-back NAKs by it: `surely_running`)
        self.since: dict[int, float] = {}
        self.again: set[int] = set()  # stream seqs held that came again (`redelivered`)
        self.renewed = 0.0  # monotonic time of the last confirmed round
        self.stopped = False
        self._between_rounds: asyncio.Future[None] | None = None  # `run`'s wait, until `stop`
        self._round: list[int] = []  # what the round in progress restarts

    def hold(self, seqs: Sequence[int], replies: Iterable[bytes], since: float) -> None:
        """Keep these deliveries (stream seqs, their reply subjects, `since` their wait surely
        started: their request's sending, or -inf when unknown) until released."""
        self.held.update(zip(seqs, replies, strict=True))
        self.since.update(dict.fromkeys(seqs, since))

    def redelivered(self, seq: int, reply: bytes, since: float) -> None:
        """A held message came again: later rounds must name its latest delivery."""
        if seq in self.held:
            self.held[seq] = reply
            self.since[seq] = since
            self.again.add(seq)

    async def renew_taken_late(self, seqs: Iterable[int]) -> None:
        """Restart at once the ack wait of the deliveries held of these (stream seqs): the rounds
        alone would leave them unkept for up to another third of the wait."""
        await self.restart([self.held[seq] for seq in seqs if seq in self.held])

    async def restart_running(self, came_again: bool = False) -> None:
        """Restart at once the ack wait of the held deliveries whose wait surely runs
        (`surely_running`): a `+WPI` of one whose wait may have run out would restart another
        reader's delivery of it. Of those that did not come again (`again`), or with
        `came_again` of those that did: their holder gives them back, or, once its release
        landed, leaves them to a taker that keeps them. None counts as restarted: the holder
        lets them go."""
        now, since, wait = clock.monotonic(), self.since, self.ack_wait
        running = [
            reply
            for seq, reply in self.held.items()
            if (seq in self.again) == came_again
            and surely_running(since.get(seq, -math.inf), now, wait)
        ]
        await self.restart(running)

    async def restart(self, replies: Sequence[bytes]) -> None:
        """Restart at once the ack wait of these deliveries, held or not; none counts as
        restarted (`since`): one whose wait may have run out may be another reader's."""
        if not replies:
            return
        try:
            await publish_acks(self.nc, replies, kind=IN_PROGRESS)
        except Exception as error:  # the pulls meet the same trouble and report it
            log.debug("%s: progress acks failed: %s", self.label, error)

    def held_deliveries(self, seqs: Iterable[int]) -> list[tuple[bytes, float]]:
        """The latest delivery held of each of these (stream seqs, all held), with when its ack
        wait surely started (-inf when unknown): what a give-back NAKs by `surely_running`."""
        return [(self.held[seq], self.since.get(seq, -math.inf)) for seq in seqs]

    def release(self, seqs: Iterable[int]) -> None:
        """Stop keeping these (their messages go back to the server)."""
        for seq in seqs:
            self.held.pop(seq, None)
            self.since.pop(seq, None)

    def restarted(self, sent: float) -> None:
        """The round sent at `sent` was confirmed: it restarted the wait of the deliveries it
        named whose wait surely ran then. Not the others': a `+WPI` too restarts whatever
        delivery of the message is pending, and one whose wait may have run out may be another
        reader's by then. Nor a delivery that came after the round was sent (`redelivered`): its
        wait started later, and dating it back to the round made a give-back skip its NAK as
        maybe run out (seed 264 of the worlds of mutant cancelled-record-leaves-its-chunks)."""
        since, wait = self.since, self.ack_wait
        running = [
            seq
            for seq in self._round
            if (started := since.get(seq, -math.inf)) <= sent
            and surely_running(started, sent, wait)
        ]
        since.update(dict.fromkeys(running, sent))

    async def due(self) -> tuple[list[bytes], int]:
        """The `+WPI` commands of this round, and how many deliveries they name."""
        self._round = list(self.held)
        return ack_commands(list(self.held.values()), IN_PROGRESS), len(self.held)

    async def run(self) -> None:
        """A round every third of the ack wait until `stop`, each due a third after the one
        before started, not after it ended: a round whose flush a busy machine holds up does
        not put off the next (on two loaded cores a round's answer took most of a second wait,
        and every round coming that much later let a 1 s wait run out). Each wait is one future
        and one timer, not `wait_for` on an event (a task per round), which the driver's keeper
        would pay a dozen times per ack wait and the simulation at every round."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self.stopped:
            due += self.ack_wait / 3
            self._between_rounds = waiting = loop.create_future()
            timer = loop.call_at(due, _end_wait, waiting)
            try:
                await waiting
            finally:
                timer.cancel()
            if not self.stopped:
                due = loop.time()  # the next is due a third after this one starts
                await self.renew()

    def stop(self) -> None:
        """`run` returns once its round in progress (if any) is done."""
        self.stopped = True
        if self._between_rounds is not None:
            _end_wait(self._between_rounds)

    async def renew(self) -> None:
        """One round: restart the ack wait of what is due."""
        try:
            sent = clock.monotonic()
            commands, count = await self.due()
            if count:
                await send_acks(self.nc, commands, count)
                self.renewed = sent  # the ack wait of all held so far started over by then
                self.restarted(sent)
        except Exception as error:  # the pulls meet the same trouble and report it
            log.debug("%s: progress acks failed: %s", self.label, error)


def _end_wait(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)
