"""A simulated JetStream: one stream, a pull consumer per slot, and the client pieces the
driver and the tasks use (API requests, pulls, acks published on the connection).

The consumer does what nats-server's does that the protocol rests on (server/consumer.go and
server/filestore.go; each method names the function it follows), as unkindly:
- deliveries in stream order, at most `max_ack_pending` unacked; redeliveries first, from a
  redelivery queue: a delivery joins it when its ack wait runs out on the server's own timer
  (`checkPending`) or when it is given back (`-NAK`, `processNak`); a `+WPI` restarts the ack
  wait of a delivery not queued yet, and one queued stays queued (`progressUpdate`);
- acks, `+WPI` and `-NAK` matched by stream sequence (whatever delivery's subject they name); a
  `-NAK` whose consumer sequence is at or below the ack floor or past the last delivery is
  ignored (`processNak`);
- `max_deliver`: a delivery that expires (or is given back) at its limit leaves the consumer for
  good, the ack floor moves past it (`hasMaxDeliveries`, `getNextMsg`);
- a `pinned_client` priority group: a pull with a stale pin id gets 423 (at once while another
  is pinned, when a message is ready while none is: `processNextMsgRequest`, `nextWaiting`), one
  without an id while another is pinned waits and gets 408; the pin's timer is reset only by a
  pull that carries it (`setPinnedTimer`), not by deliveries or acks;
- a server restart (`setLeader`, `applyState`): the consumer comes back from its stored state,
  which is written at most every 100 ms (`consumerFileStore.flushLoop`): acks of the last 100 ms
  are lost, the redelivery queue, the waiting pulls (never answered) and the pin are dropped, and
  each pending delivery's wait counts from its start truncated to the whole second
  (`encodeConsumerState` stores seconds), so it may run out up to a second early, though not
  before the first check (`applyState`: at least half a second, or the ack wait if shorter);
- a consumer deleted and created again under its name starts over (DeliverAll), knowing nothing
  of what was delivered or acked; acks on the old deliveries' subjects reach it
  (`processAckMsg` matches the stream sequence);
- the stream's first sequence moves (limits, purge): pending deliveries below it leave the
  consumer (`checkPending`), and reading such a message answers 404 (`NotFound`).
- an `overflow` priority group's pull with `min_pending` or `min_ack_pending` is served only
  while the consumer's num_pending (num_ack_pending) is at least that (either, when both are
  set), and waits otherwise (`nextWaiting` under `PriorityOverflow`).
Waiting pulls are served as messages arrive or come due again; a request of a crashed
participant or a closed pull consumer is not served any more.

Every call the code under test makes is a scheduling point of its participant, before and after
its effect (an ack published and then a crash before the flush confirms it, for one).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from nats_spark import clock
from nats_spark.errors import NotFound
from nats_spark.jetstream.api import StoredMessage
from nats_spark.jetstream.pull import CLIENT_GRACE, Deliveries, PullStatus
from nats_spark.jetstream.replies import ConsumerInfo, StreamInfo
from nats_spark.jetstream.subject_names import subject_matches
from tests.simulation.scheduler import Participant, Scheduler

STREAM = "S"
WHOLE_STREAM = f"{STREAM}."  # the prefix of every subject the stream holds
GROUP = "PCG"
NANOS = 1_000_000_000


FLUSH_INTERVAL = 0.1  # a consumer's state reaches its store at most this often (`flushLoop`)
# After a restart, the least delay of the first look at pending deliveries (`applyState`: 0.5 s
# and a random second, or the ack wait if that is shorter).
FIRST_CHECK = 0.5


@dataclass
class Message:
    seq: int
    subject: str
    time: float


@dataclass
class Delivery:
    delivered: int  # delivery count
    consumer_seq: int
    due: float  # when its ack wait runs out
    owner: Participant | None = None  # whose pull request it went to
    given_back: bool = False  # `-NAK` taken: queued for redelivery, whatever `+WPI` follows
    queued: float | None = None  # when it joined the redelivery queue (expired or given back)
    given_back_by: Participant | None = None  # who sent the `-NAK`
    given_back_after: int = 0  # the deliveries its consumer had made when that `-NAK` came
    # its place among all its consumer's deliveries (`consumer_seq` starts over when the
    # consumer is created again)
    order: int = 0
    at: float = 0.0  # when the server made it


class Stream:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.first_seq = 1  # the messages before it were removed (limits, purge)

    @property
    def last_seq(self) -> int:
        return len(self.messages)

    def publish(self, subject: str, now: float) -> int:
        self.messages.append(Message(len(self.messages) + 1, subject, now))
        return len(self.messages)

    def stored(self) -> list[Message]:
        return self.messages[self.first_seq - 1 :]


@dataclass(eq=False)
class PullRequest:
    owner: Participant | None
    batch: int
    no_wait: bool
    expires_at: float
    pin_id: str | None
    consumer: SimPullConsumer
    # An overflow pull's thresholds (0: none): served only while the consumer's num_pending
    # (num_ack_pending) is at least that (`nextWaiting` under `PriorityOverflow`).
    min_pending: int = 0
    min_ack_pending: int = 0
    delivered: list[tuple[Message, Delivery]] = field(default_factory=list)
    served: int = 0
    made: float = 0.0  # when the client made it
    status: PullStatus | None = None  # set when the server ended it
    closed: bool = False
    dropped: bool = False  # the server restarted: it is never answered
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def live(self) -> bool:
        owner = self.owner
        return (
            self.status is None
            and not self.closed
            and not self.dropped
            and not (owner is not None and owner.dead)
        )


class Consumer:
    """One durable pull consumer of the stream, filtered to one slot's subjects."""

    def __init__(
        self,
        name: str,
        prefix: str,
        stream: Stream,
        ack_wait: float,
        max_ack_pending: int,
        pinning: bool = True,
        max_deliver: int = 0,
        floor_from_zero: bool = False,
    ):
        self.name = name
        self.prefix = prefix
        self.stream = stream
        self.ack_wait = ack_wait
        self.max_ack_pending = max_ack_pending
        self.max_deliver = max_deliver  # 0: no limit
        self.pinning = pinning  # a `pinned_client` group (else `overflow`: no pins)
        # nats-server before 2.14: a new consumer's store starts its ack floor at 0, not at the
        # sequence before its start (`consumerFileStore.SetStarting` sets only what was
        # delivered), and the info reports the store's floor until an ack moves it
        self.floor_from_zero = floor_from_zero
        self.pins = 0
        self.deliveries: dict[int, list[Delivery]] = {}  # by stream seq, in delivery order
        self.made = 0  # deliveries, whatever its creations (`Delivery.order`)
        self.dropped: list[int] = []  # stream seqs that left it past `max_deliver`
        self.start_over(0.0)

    def start_over(self, now: float, start: int = 0) -> None:
        """As created at `now` (DeliverAll, or `--deliver start`: from the stream's first
        sequence when that is later, as the server moves it): nothing delivered, acked or
        pinned."""
        self.created = now
        self.start = start  # its config's `opt_start_seq` (0: DeliverAll)
        # the stream sequence new deliveries look from
        self.next_seq = max(start, self.stream.first_seq)
        self.delivered_seq = self.next_seq - 1
        self.consumer_seq = 0
        self.pending: dict[int, Delivery] = {}
        self.acked: set[int] = set()
        self.unflushed: list[tuple[float, int, Delivery]] = []  # acks not in the store yet
        self.pinned: str | None = None
        self.pin_renewed = 0.0
        self.waiting: list[PullRequest] = []

    @property
    def priority_timeout(self) -> float:
        return max(self.ack_wait, 1.0)

    def mine(self, message: Message) -> bool:
        return message.subject.startswith(self.prefix)

    def num_pending(self) -> int:
        first = max(self.next_seq, self.stream.first_seq)
        return sum(1 for m in self.stream.messages[first - 1 :] if self.mine(m))

    def ack_floor(self) -> int:
        return min(self.pending) - 1 if self.pending else self.delivered_seq

    def ack_floor_delivery(self) -> int:
        """The ack floor's consumer sequence: below every pending delivery."""
        return (
            min((d.consumer_seq for d in self.pending.values()), default=self.consumer_seq + 1) - 1
        )

    def reported_ack_floor(self) -> dict[str, int]:
        """The ack floor as the info reports it: the store's, which on servers before 2.14
        stays at 0 until the consumer's first delivery is acked."""
        delivery = self.ack_floor_delivery()
        if self.floor_from_zero and delivery == 0:
            return {"consumer_seq": 0, "stream_seq": 0}
        return {"consumer_seq": delivery, "stream_seq": self.ack_floor()}

    def info(self, now: float) -> dict[str, Any]:
        self.expire(now)
        return {
            **self.identity(),
            "num_pending": self.num_pending(),
            "num_ack_pending": len(self.pending),
            "num_waiting": sum(1 for r in self.waiting if r.live()),
            "delivered": {"stream_seq": self.delivered_seq, "consumer_seq": self.consumer_seq},
            "priority_groups": [{"group": GROUP, "pinned_client_id": self.pinned or ""}],
        }

    def identity(self) -> dict[str, Any]:
        """What a target checks when it resolves (its config, when it was created), as the
        consumer's info has it."""
        return {
            "created": _rfc3339(self.created),
            "ack_floor": self.reported_ack_floor(),
            "config": {
                "ack_policy": "explicit",
                "ack_wait": int(self.ack_wait * NANOS),
                "max_ack_pending": self.max_ack_pending,
                "max_deliver": self.max_deliver or -1,
                **(
                    {"deliver_policy": "by_start_sequence", "opt_start_seq": self.start}
                    if self.start
                    else {}
                ),
                # a partition's consumer filters on its subjects; a plain one reads them all
                **({} if self.prefix == WHOLE_STREAM else {"filter_subject": f"{self.prefix}>"}),
            },
        }

    def expire(self, now: float) -> None:
        """What the server's own timers did by `now` (`checkPending`, the pin's timer): each
        delivery whose ack wait ran out joined the redelivery queue, or left the consumer at its
        `max_deliver`; deliveries of removed messages left it; the pin lapsed."""
        if self.pinned is not None and now - self.pin_renewed > self.priority_timeout:
            self.pinned = None
        for seq, delivery in list(self.pending.items()):
            if seq < self.stream.first_seq:
                del self.pending[seq]
            elif delivery.queued is None and delivery.due <= now:
                if self._at_max_deliver(seq, delivery):
                    continue
                delivery.queued = delivery.due

    def _at_max_deliver(self, seq: int, delivery: Delivery) -> bool:
        """`hasMaxDeliveries`: a delivery that comes due at the limit leaves for good."""
        if not self.max_deliver or delivery.delivered < self.max_deliver:
            return False
        del self.pending[seq]
        self.dropped.append(seq)
        return True

    def unpin(self, now: float) -> None:
        """`$JS.API.CONSUMER.UNPIN`: the next waiting pull is pinned afresh."""
        self.pinned = None
        self.serve(now)

    def request(self, request: PullRequest, now: float) -> None:
        """A pull request arrives (`processNextMsgRequest`): one carrying the pin resets its
        timer; one carrying another pin gets 423."""
        self.expire(now)
        if self.pinned is not None:
            if request.pin_id == self.pinned:
                self.pin_renewed = now
            elif request.pin_id is not None:
                self._end(request, PullStatus.PIN_MISMATCH)
                return
        self.waiting.append(request)
        self.serve(now)

    def _end(self, request: PullRequest, status: PullStatus) -> None:
        request.status = status
        request.arrived.set()

    def serve(self, now: float) -> None:
        """Serve the waiting requests in order: redeliveries first, then new messages."""
        self.expire(now)
        for request in list(self.waiting):
            if not request.live():
                self.waiting.remove(request)
                continue
            if not request.no_wait and now >= request.expires_at:
                # `nextWaiting`: a request past its expiry gets its 408, never a message (seeds
                # 5089 and 5442 of the worlds with another client and a 4 s wait: one served
                # late, after its client had given it up, held a message past its ack wait)
                self.waiting.remove(request)
                self._end(request, PullStatus.TIMEOUT)
                continue
            if self.pinning and self.pinned is None and request.pin_id and self._ready():
                # `nextWaiting`: no pin, and a request with an id: an old one
                self.waiting.remove(request)
                self._end(request, PullStatus.PIN_MISMATCH)
                continue
            # A pull without the pin while another holds it is passed over (`nextWaiting`),
            # and ends as any other when it expires or, no-wait, at once (`processWaiting`).
            served = self.pinned is None or request.pin_id == self.pinned
            while served and request.served < request.batch and self._over_thresholds(request):
                found = self._next(now)
                if found is None:
                    break
                if self.pinned is None and self.pinning:  # `assignNewPinId`
                    self.pins += 1
                    self.pinned = f"pin-{self.name[-1]}-{self.pins}"
                    self.pin_renewed = now
                    request.pin_id = self.pinned
                found[1].owner = request.owner
                request.delivered.append(found)
                request.served += 1
            if request.delivered:
                request.arrived.set()
            if request.served >= request.batch:
                request.status = PullStatus.BATCH_COMPLETE
            elif request.no_wait:
                request.status = PullStatus.TIMEOUT if request.served else PullStatus.NO_MESSAGES
            if request.status is not None:
                self.waiting.remove(request)
                request.arrived.set()

    def _over_thresholds(self, request: PullRequest) -> bool:
        """Whether an overflow pull's thresholds let it be served now: either one reached, when
        both are set (`nextWaiting`: num_pending counts the message about to go)."""
        if not request.min_pending and not request.min_ack_pending:
            return True
        return bool(request.min_pending and self.num_pending() >= request.min_pending) or bool(
            request.min_ack_pending and len(self.pending) >= request.min_ack_pending
        )

    def _queue(self) -> list[int]:
        """The redelivery queue, in the order it was filled."""
        queued = [(d.queued, seq) for seq, d in self.pending.items() if d.queued is not None]
        return [seq for _, seq in sorted(queued)]

    def _ready(self) -> bool:
        """Whether a message would be delivered now."""
        if self._queue():
            return True
        if len(self.pending) >= self.max_ack_pending:
            return False
        first = max(self.next_seq, self.stream.first_seq)
        return any(self.mine(m) for m in self.stream.messages[first - 1 :])

    def _next(self, now: float) -> tuple[Message, Delivery] | None:
        """`getNextMsg`."""
        for seq in self._queue():
            delivery = self.pending[seq]
            if self._at_max_deliver(seq, delivery):
                continue
            return self._deliver(self.stream.messages[seq - 1], delivery.delivered + 1, now)
        if len(self.pending) >= self.max_ack_pending:
            return None
        first = max(self.next_seq, self.stream.first_seq)
        for message in self.stream.messages[first - 1 :]:
            self.next_seq = message.seq + 1
            if self.mine(message):
                self.delivered_seq = message.seq
                return self._deliver(message, 1, now)
        return None

    def _deliver(self, message: Message, count: int, now: float) -> tuple[Message, Delivery]:
        self.consumer_seq += 1
        self.made += 1
        delivery = Delivery(count, self.consumer_seq, now + self.ack_wait, order=self.made, at=now)
        self.pending[message.seq] = delivery
        self.deliveries.setdefault(message.seq, []).append(delivery)
        return message, delivery

    def ack(self, seq: int, now: float) -> bool:
        """Whether the ack took a pending message off (`processAckMsg`)."""
        self.expire(now)
        delivery = self.pending.pop(seq, None)
        if delivery is None:
            return False
        self.acked.add(seq)
        self.unflushed = [a for a in self.unflushed if a[0] > now - FLUSH_INTERVAL]
        self.unflushed.append((now, seq, delivery))
        return True

    def in_progress(self, seq: int, now: float) -> None:
        """`+WPI` (`progressUpdate`): the ack wait starts over; a delivery already on the
        redelivery queue (its wait ran out, or given back) stays there and is redelivered."""
        self.expire(now)
        if seq in self.pending:
            self.pending[seq].due = now + self.ack_wait

    def give_back(self, seq: int, consumer_seq: int, now: float, by: Participant | None) -> None:
        """`-NAK` (`processNak`, sent by `by`): redelivered at the next pull, before new
        messages; ignored outside the consumer's window (a delivery at or below the ack floor, or
        one it never made) and for a message not pending."""
        self.expire(now)
        if consumer_seq <= self.ack_floor_delivery() or consumer_seq > self.consumer_seq:
            return
        delivery = self.pending.get(seq)
        if delivery is None:
            return
        delivery.given_back = True
        delivery.given_back_by = by
        delivery.given_back_after = self.made
        if delivery.queued is None:
            delivery.queued = now

    def restart(self, now: float) -> None:
        """The server restarted (`setLeader`, `applyState`): back from the store, which missed
        the acks of the last `FLUSH_INTERVAL`; no redelivery queue, no waiting pull (none is
        answered), no pin. Each pending delivery's wait started at the whole second
        (`encodeConsumerState` keeps `Timestamp / time.Second`, `decodeConsumerState` multiplies
        it back), and nothing runs out before the first `checkPending` (`applyState`)."""
        for at, seq, delivery in self.unflushed:
            if at > now - FLUSH_INTERVAL:
                self.pending[seq] = delivery
                self.acked.discard(seq)
        self.unflushed = []
        first_check = now + min(FIRST_CHECK, self.ack_wait)
        for delivery in self.pending.values():
            started = math.floor(delivery.due - self.ack_wait + 1e-9)  # 1e-9: float error
            delivery.due = max(started + self.ack_wait, first_check)
            delivery.queued = None
        for request in self.waiting:
            request.dropped = True
        self.waiting = []
        self.pinned = None

    def events(self) -> list[float]:
        """When serving may change: a waiting pull expires, or a message comes due for one."""
        waiting = [r.expires_at for r in self.waiting if r.live() and not r.no_wait]
        if not waiting:
            return []
        return waiting + [d.due for d in self.pending.values()]


def consumer_of(consumers: list[Consumer], message: Message) -> Consumer:
    """The consumer whose subjects `message` is on."""
    return next(c for c in consumers if c.mine(message))


def deliveries_of(consumers: list[Consumer], message: Message) -> list[Delivery]:
    """Every delivery of `message`, in order, by the consumer whose subjects it is on."""
    return consumer_of(consumers, message).deliveries.get(message.seq, [])


def reply_of(consumer: str, message: Message, delivery: Delivery, pending: int) -> bytes:
    return b"$JS.ACK.%b.%b.%d.%d.%d.%d.%d" % (
        STREAM.encode(),
        consumer.encode(),
        delivery.delivered,
        message.seq,
        delivery.consumer_seq,
        int(message.time * NANOS),
        pending,
    )


class Server:
    """The stream and its consumers; `acked` hears of every ack that took a message off."""

    def __init__(self, sched: Scheduler, consumers: list[Consumer], stream: Stream) -> None:
        self.sched = sched
        self.stream = stream
        self.consumers = {c.name: c for c in consumers}
        self.on_ack: list[Any] = []
        self.after_acks: Callable[[], None] = lambda: None  # a round of acks was taken

    def now(self) -> float:
        return self.sched.now

    def serve(self) -> None:
        for consumer in self.consumers.values():
            consumer.serve(self.now())

    async def run(self, until: asyncio.Event) -> None:
        """Ack waits run out and waiting pulls expire as time passes: serve at those times."""
        while not until.is_set():
            now = self.now()
            events = [e for c in self.consumers.values() for e in c.events() if e > now]
            await self.sched.sleep(min(min(events, default=now + 5.0) - now, 5.0) + 0.001)
            self.serve()

    def publish_commands(self, command: bytes, sender: Participant | None = None) -> None:
        lines, acked = command.split(b"\r\n"), False
        for header, body in zip(lines[0::2], lines[1::2], strict=False):
            if not header.startswith(b"PUB "):
                continue
            tokens = header.split(b" ")[1].split(b".")
            consumer = self.consumers[tokens[3].decode()]
            seq, now = int(tokens[5]), self.now()
            if body == b"+ACK":
                if consumer.ack(seq, now):
                    acked = True
                    for hear in self.on_ack:
                        hear(consumer.name, seq)
            elif body == b"+WPI":
                consumer.in_progress(seq, now)
            elif body == b"-NAK":
                consumer.give_back(seq, int(tokens[6]), now, sender)
        self.serve()
        if acked:
            self.after_acks()

    def restart(self) -> None:
        """A restart (or a leader change): every consumer comes back from its store."""
        for consumer in self.consumers.values():
            consumer.restart(self.now())

    def purge_acked(self, keep_from: int) -> int:
        """Remove the messages every consumer has acked (a purge through the lowest ack floor,
        as an operator or a work-queue stream's retention would) below `keep_from`; the new
        first sequence."""
        floor = min([keep_from - 1, *(c.ack_floor() for c in self.consumers.values())])
        self.stream.first_seq = max(self.stream.first_seq, floor + 1)
        self.serve()
        return self.stream.first_seq


class SimNc:
    """What the ack publishing (`publish_acks`) uses of a nats-py connection."""

    def __init__(self, client: SimClient) -> None:
        self.client = client
        self.is_closed = False

    async def _send_command(self, command: bytes) -> None:
        await self.client.sched.point("publish acks")
        self.client.server.publish_commands(command, self.client.sched.current())

    async def _flush_pending(self, force_flush: bool = False) -> None:
        return None

    async def flush(self, timeout: float = 0) -> None:
        await self.client.sched.point("flush")


class SimApi:
    def __init__(self, client: SimClient) -> None:
        self.client = client

    async def stream_info(self, stream: str) -> StreamInfo:
        await self.client.sched.point("stream info")
        stream = self.client.server.stream
        state = {"first_seq": stream.first_seq, "last_seq": stream.last_seq}
        return StreamInfo({"state": state, "config": {}})

    async def consumer_info(self, stream: str, consumer: str) -> ConsumerInfo:
        server = self.client.server
        await self.client.sched.point(f"consumer info {consumer}")
        return ConsumerInfo(server.consumers[consumer].info(server.now()))

    async def unpin(self, stream: str, consumer: str, group: str) -> None:
        server = self.client.server
        await self.client.sched.point(f"unpin {consumer}")
        server.consumers[consumer].unpin(server.now())

    async def get_message(
        self, stream: str, seq: int, next_by_subject: str | None = None
    ) -> StoredMessage:
        """`STREAM.MSG.GET` by sequence, or with `next_by_subject` the first stored message at
        or after it on that filter (nats-server's `getMsg` with `NextFor`: `LoadNextMsg`); a
        message removed (limits, purge), or none on the filter, is not found."""
        await self.client.sched.point(f"get message {seq} {next_by_subject or ''}".rstrip())
        stored = self.client.server.stream
        if next_by_subject is not None:
            message = next(
                (
                    m
                    for m in stored.stored()
                    if m.seq >= seq and subject_matches(next_by_subject, m.subject)
                ),
                None,
            )
        else:
            message = stored.messages[seq - 1] if seq >= stored.first_seq else None
        if message is None:
            raise NotFound(f"$JS.API.STREAM.MSG.GET.{stream}", 404, 10037, "no message found")
        return StoredMessage(message.subject, message.seq, b"", None, _rfc3339(message.time))


def _rfc3339(at: float) -> str:
    nanos = int(at * NANOS)
    seconds, fraction = divmod(nanos, NANOS)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    return f"2026-01-01T{hours % 24:02d}:{minute:02d}:{second:02d}.{fraction:09d}Z"


class SimPullConsumer:
    """What a slot's task uses of `PullConsumer`."""

    def __init__(self, client: SimClient, consumer: Consumer, pin_id: str | None) -> None:
        self.client = client
        self.consumer = consumer
        self.pin_id = pin_id
        self.requests: list[PullRequest] = []
        self.cut_off = Deliveries()  # as `PullConsumer.cut_off`

    async def pull(
        self,
        batch: int,
        *,
        expires: float = 5.0,
        no_wait: bool = False,
        whole: bool = False,
        min_pending: int = 0,
        min_ack_pending: int = 0,
        grace: float = CLIENT_GRACE,
        **_: Any,
    ) -> SimPull:
        sched = self.client.sched
        refused = bool(self.requests) and self.requests[-1].status is PullStatus.PIN_MISMATCH
        late = self.client.late_after_refusal() if refused else 0.0
        if late:  # it reaches the server late (`World.late_after_refusal`)
            sched.note(f"this pull, after a refused pin, reaches the server {late:.1f}s late")
            await sched.sleep(late)
        await sched.point(f"pull {batch} from {self.consumer.name}")
        now = self.client.server.now()
        request = PullRequest(
            sched.current(),
            batch,
            no_wait,
            now + expires,
            self.pin_id,
            self,
            min_pending,
            min_ack_pending,
            made=clock.monotonic(),  # the task's clock (the loop's), not the server's
        )
        self.requests.append(request)
        self.consumer.request(request, self.client.server.now())
        return SimPull(self, request, self.client.server.now() + expires + grace, whole)

    def take(self, request: PullRequest) -> Deliveries:
        """What the request delivered since last taken, as the connection's parser hands it."""
        chunk = Deliveries()
        pending = len(self.consumer.pending)
        for message, delivery in request.delivered:
            chunk.subjects.append(message.subject.encode())
            chunk.replies.append(reply_of(self.consumer.name, message, delivery, pending))
            chunk.data.append(b"")
            chunk.headers.append(None)
        if request.delivered and request.pin_id:
            self.pin_id = request.pin_id
        request.delivered = []
        request.arrived.clear()
        return chunk

    def drained(self) -> bool:
        """As `PullConsumer.drained`: every request ended, and what each delivered was taken."""
        return not self.cut_off and all(
            r.status is not None and not r.delivered for r in self.requests
        )

    def requested_since(self) -> float:
        """As `PullInbox.requested_since`: a request a restart forgot counts until what it
        delivered was taken (the client sees the standalone server's new id on reconnecting;
        requests reach the server at once here, none is left unwritten at the loss)."""
        unended = [
            r.made for r in self.requests if (r.status is None and not r.dropped) or r.delivered
        ]
        return min(unended, default=clock.monotonic())

    async def collect_late(self, patience: float) -> Deliveries:
        late, self.cut_off = self.cut_off, Deliveries()
        for request in self.requests:
            if request.status is None and not request.closed:
                await _until_arrival(request, self.client.server.now() + patience)
            late.extend(self.take(request))
        self.client.server.serve()
        return late

    async def close(self) -> None:
        for request in self.requests:
            request.closed = True


async def _until_arrival(request: PullRequest, deadline: float) -> bool:
    """Wait for the request's next deliveries or its end; False when `deadline` came first."""
    server = request.consumer.client.server
    wait = deadline - server.now()
    if wait <= 0:
        return False
    try:
        await asyncio.wait_for(request.arrived.wait(), wait)
    except TimeoutError:
        return False
    return True


class SimPull:
    """What a slot's task uses of `Pull`: an async iterator of chunks of deliveries (`whole`:
    one, once the request has ended), then why it ended."""

    def __init__(
        self, consumer: SimPullConsumer, request: PullRequest, deadline: float, whole: bool
    ) -> None:
        self.consumer = consumer
        self.request = request
        self.deadline = deadline
        self.whole = whole
        self.sent = clock.monotonic()
        self.received = 0
        self.done = False
        self.status = PullStatus.BATCH_COMPLETE
        self._arriving = self._chunks()

    def __aiter__(self) -> SimPull:
        return self

    async def __anext__(self) -> Deliveries:
        return await anext(self._arriving)

    async def _chunks(self) -> AsyncIterator[Deliveries]:
        request, sched, gathered = self.request, self.consumer.client.sched, Deliveries()
        try:
            while not self.done:
                if request.delivered:
                    chunk = self.consumer.take(request)
                    self.received += len(chunk)
                    self._end_if_over()
                    if self.whole:
                        gathered.extend(chunk)
                    await sched.point("deliveries arrive")
                    if not self.whole:
                        yield chunk
                        continue
                    if self.done:
                        break
                    continue
                if self._end_if_over():
                    break
                if not await _until_arrival(request, self.deadline):
                    self.status, self.done = PullStatus.CLIENT_TIMEOUT, True
                await sched.point("pull wakes")
        except asyncio.CancelledError:  # as `Pull.__anext__`
            self.consumer.cut_off.extend(gathered)
            raise
        if gathered:
            yield gathered

    def _end_if_over(self) -> bool:
        request = self.request
        if request.status is not None and not request.delivered:
            self.status, self.done = request.status, True
            if request.status is PullStatus.PIN_MISMATCH:
                self.consumer.pin_id = None
        return self.done


class SimClient:
    """What the driver and the tasks use of `NatsClient`, for one participant."""

    def __init__(self, sched: Scheduler, server: Server) -> None:
        self.sched = sched
        self.server = server
        self.nc = SimNc(self)
        self.api = SimApi(self)
        self.denied: list[str] = []
        self.usable = True
        # How late a task's pull sent after one refused for a stale pin reaches the server (its
        # world's `late_after_refusal`; a driver's never is).
        self.late_after_refusal: Callable[[], float] = lambda: 0.0

    def pull_consumer(
        self, stream: str, consumer: str, group: str | None = None, pin_id: str | None = None
    ) -> SimPullConsumer:
        return SimPullConsumer(self, self.server.consumers[consumer], pin_id)

    async def close(self) -> None:
        self.usable = False

    async def discard(self) -> None:
        self.usable = False
