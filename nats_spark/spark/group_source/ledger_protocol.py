"""The ack ledger's protocol: the states of an entry, who moves an entry out of each, and what
the driver may conclude from each. Both sides move entries and judge heads only here: the driver
(`driver_ledger`, `sealed_keeper`) and a slot's task (`slot_entry`, `slot_history`), neither of
which imports the other's module; `ledger` is the stored form (keys, a head's and a chunk's
bytes, reading heads and writing them by compare-and-set, the pointer).

An entry is what one slot took in one batch, (lineage, gen, slot): a head and chunks of
deliveries. To record is to write deliveries to the entry before their rows leave the task.

absent
    Moved out by a task attempt of the batch: `create` (to OPEN), then `check_fence` (a create
    whose answer was lost is retried, finds the key, and goes on as a take-over, fenced too).
    The driver concludes: nothing taken yet. It never takes a listing's silence for absence:
    it expects the entries of the batches it plans (`DriverLedger.expect`) and lists heads from
    the bucket stream's subject index, which does not come back short.
OPEN (recording)
    Moved out by the attempt recording it: `seal` (to SEALED), or its last `record` when it
    knows the record is its last and has nothing to check after it (`sealing`); or by a later
    attempt of the same task after this one died mid-way or gave it up: `take_over` (still
    OPEN, under the new attempt, which keeps what was recorded and goes on), then
    `check_fence` when it is the attempt's
    own create whose answer was lost. The holder writes its head at least every
    `HOLD_RENEWAL` while it pulls (`SlotEntry.hold`), and marks it `released` when it fails or
    is closed before it seals (`release`). Another attempt (Spark's speculative copy, a retry
    beside a zombie) that finds it OPEN, not released and not its own stands by
    (`await_holder`): it replays the entry once sealed, and takes it over once released or
    once the head has stood still for `HOLD_QUIET` (the holder was killed -9, or stalls). A
    holder taken over while alive finds it at its next head write (`TakenOver`): it gives back
    what it took and did not record, waits for the seal (`await_sealed`) and hands out the
    rest of the sealed entry, so that both attempts end with its rows.
    The driver concludes: its messages are the query's own, unacked (`unacked`: capacity, not
    another client's); never ack it (a committed batch has no open entry) nor settle it; for
    dedupe, its batch emitted nothing of it yet (`emitted`).
SEALED
    Moved out by the slot's task of a later batch, once this batch is committed: `ack` (to
    ACKED); by the driver in the same way at stop and for slots the query no longer reads
    (`DriverLedger.ack_through`). A re-run of the batch replays it as it is (`content_fixed`);
    the driver's `SealedKeeper` restarts its messages' ack wait, which moves nothing.
    The driver concludes: it is exactly what the batch emitted. Committed (gen <= committed):
    its acks are due (`ack_due`, `acked_by_next_task`); not committed: keep it for a re-run.
    Its messages' redeliveries are dropped (dedupe). Empty and committed: settled at once.
ACKED
    Moved out by the driver while planning: `remove_settled` (to settled), once no redelivery
    can reach its messages (`settles`: the consumer's ack floor or the stream's first sequence
    is past them, and has held for `SETTLE_SECONDS`).
    The driver concludes: nothing to ack; its messages' redeliveries are still dropped.
given back (removed)
    Any state of an earlier checkpoint's entry, moved by the driver at a new checkpoint's
    first batch: `give_back` (fenced first when of the same lineage). The new query never
    emitted it: its messages are NAKed, to come back at once and ahead of newer messages of
    their keys, and are read again. Final. An attempt of the earlier query that takes an entry
    holding deliveries over after the fence stops there and leaves it to the give-back, which
    lists the entries after its fence (`check_fence`).
settled (removed)
    Final. The pointer's `settled` (written before the removal) fences the batch: an attempt
    that outlived it and creates the entry again removes it and stops (`check_fence`).
    The driver concludes: forgotten, neither acked nor deduped.
created again (OPEN, fenced)
    An attempt killed between such a create and its `check_fence` (its executor killed,
    as a lost one often is) leaves an OPEN entry of a fenced gen, or of a retired lineage,
    that holds nothing. Moved out by the lineage's next driver, when it adopts a lineage:
    `give_back` (`outlived`; of a retired lineage, any entry). No batch reads it: an attempt
    of its batch stops at the fence, and a committed batch has no open entry.

An attempt writes the head by compare-and-set on its revision (`write_head`): one that finds it
written by another attempt records no more (`TakenOver`), unless the write it finds is its own,
retried after its answer was lost; it stops (`LedgerConflict`) unless the entry is then sealed
starting with what it handed out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence, Set
from dataclasses import dataclass
from enum import Enum

from nats_spark import clock
from nats_spark.client import NatsClient
from nats_spark.errors import PERMISSIONS_DOC, ConfigurationError, NotFound
from nats_spark.jetstream.acks import NAK, send_acks
from nats_spark.spark.group_source.ledger import (
    LEDGER_FORMAT,
    ChunkMissing,
    EntryDeliveries,
    EntryHead,
    EntryState,
    Ledger,
    LedgerConflict,
    PointerReads,
    TakenOver,
    keep_inline,
    own_write_or_taken_over,
    read_deliveries,
    read_head,
    read_heads,
    write_head,
)

log = logging.getLogger(__name__)

# A consumer's ack floor is in the server's memory before it is on disk: a server crash right
# after the acks can take it back and redeliver. An entry is forgotten (and with it the dedupe
# of its messages) only once the floor has held this long.
SETTLE_SECONDS = 10.0
# An attempt holding an OPEN entry writes its head at least every HOLD_RENEWAL while it pulls
# (`SlotEntry.hold`); another attempt that finds the head of a live holder stands by (for the
# seal, or for the holder to release it or go quiet) and takes it for dead once the head has
# stood still for HOLD_QUIET, measured on its own clock (no clocks compared across hosts).
HOLD_RENEWAL = 1.0
HOLD_QUIET = 5 * HOLD_RENEWAL
# How often an attempt waiting for another's entry reads its head: the first wait, doubling up
# to the last.
HOLD_POLL = (0.05, 1.0)
# The holder an OPEN entry's head names once a give-back took it from its attempt: no attempt's
# id (those are hex), so that no attempt takes that head for one it wrote.
GIVEN_BACK = "given-back"


# A task attempt's moves: absent -> OPEN (create, or take over), OPEN -> SEALED.


async def create(
    ledger: Ledger, gen: int, slot: str, head: EntryHead, pin: str | None
) -> int | None:
    """absent -> OPEN: the head's revision; None when another attempt created it first. The
    head then holds `pin`, the one the driver handed the slot, which the attempt pulls with
    (written with its first record)."""
    revision = await ledger.create_head(gen, slot, head.to_bytes())
    if revision is not None:
        head.pin = pin
    return revision


async def check_fence(
    ledger: Ledger, pointer_reads: PointerReads, gen: int, slot: str, attempt: str
) -> None:
    """After `create` or `take_over` (`pointer_reads`: the target's pointer, read after it): fail
    when the batch's entries were settled, or its lineage's given back (the driver raises the fence
    before it removes, so a create after the removal finds the fence). This attempt outlived its
    committed batch, whose messages would be acked as committed, or its query, whose entry nothing
    would remove: the entry goes again while it is still `attempt`'s. So does every take-over: of
    the attempt's own create, whose answer was lost (the retry finds the key, and the attempt its
    own open head), or of an entry another attempt that outlived the batch created again. An entry
    another attempt took over meanwhile stays: the fence is the newest settled gen, and an older
    entry of a retry may still be kept, its acks lost (a server restart), for the dedupe of their
    redeliveries. So does a take-over of an entry that holds deliveries: an earlier attempt
    recorded them before the fence (its own check passed), in a batch never committed that a new
    checkpoint's query gives back (a committed batch has no open entry); that give-back lists the
    entries after its fence and NAKs what they hold. Removed here, nothing would name those
    deliveries: they would wait out their ack wait behind newer messages of their keys."""
    pointer = await pointer_reads.read()
    if pointer is None:
        return
    if pointer.lineage == ledger.lineage and pointer.settled >= gen:
        # a new checkpoint's first batch fences the gens it gives back the same way
        outlived = "its batch was settled, or given back to a query on a new checkpoint"
    elif ledger.lineage in pointer.retired:
        outlived = "its query was replaced by one on a new checkpoint, which gave it back"
    else:
        return
    found = await read_head(ledger, gen, slot)
    if found is not None and found[0].attempt == attempt and not found[0].count:
        await ledger.delete_entry(gen, slot)
    raise LedgerConflict(
        f"ledger entry {ledger.head_key(gen, slot)}: {outlived}; this task attempt outlived it"
    )


def take_over(previous: EntryHead, pin: str | None, attempt: str) -> EntryHead:
    """OPEN -> OPEN under a new attempt: what an attempt that died mid-way (or released it)
    recorded, adopted by the next one (written with `write_head` on `previous`'s revision)."""
    return EntryHead(
        attempt=attempt,
        chunks=previous.chunks,
        count=previous.count,
        max_seq=previous.max_seq,
        pin=previous.pin or pin,
        prefix=previous.prefix,
        format=previous.format,
        inline=previous.inline,
    )


def outlived(head: EntryHead, gen: int, fenced: int) -> bool:
    """Whether the entry of the live lineage is OPEN in a gen the pointer fences (`settled`):
    created again by an attempt that outlived its batch and was killed before `check_fence`
    removed it (a committed batch has no open entry)."""
    return head.state is EntryState.OPEN and gen <= fenced


def came_back(head: EntryHead, gen: int, fenced: int, kept_from: int, listed: Set[str]) -> bool:
    """Whether an entry of the live lineage, as an adopting driver finds it, can only be one a
    server restarted uncleanly brought back after its removal (a lost tombstone): of a gen the
    pointer fences (`settled`), and naming chunks the listing (`listed`) did not find (only a
    removal leaves an entry without them), or SEALED with messages in a gen below `kept_from`,
    the second newest gen that has entries: a batch's tasks ack the batch before theirs before
    they commit, so only the newest committed batch and the logged one after it can hold sealed
    entries waiting for their acks (gens planned and never logged, a driver killed between its
    pointer and Spark's offset log, have no entries). Acked or given back before its removal,
    it is removed again, unread. One whose record is in its head (`inline`) names no chunk and
    comes back whole: readable, it settles or is given back again as any entry does."""
    if gen > fenced:
        return False
    return any(chunk not in listed for chunk in head.chunks) or (
        awaits_acks(head) and gen < kept_from
    )


def content_fixed(head: EntryHead) -> bool:
    """Whether the entry's batch content is fixed (SEALED or ACKED): a later attempt replays
    exactly it and takes nothing more; else (OPEN) it takes the entry over."""
    return head.state is not EntryState.OPEN


def held_by_another(head: EntryHead, attempt: str) -> bool:
    """Whether `head` is an OPEN entry another attempt holds, not given up: stand by for it
    (`await_holder`)."""
    return not content_fixed(head) and not own_create(head, attempt) and not head.released


def kept_by_its_taker(taken: TakenOver) -> bool:
    """Whether the entry an attempt lost (`taken`) is held by another task attempt of the query,
    whose keeper restarts the ack wait of every message it records, by stream sequence: a
    delivery of one that came again to the attempt that lost it is kept with them (and acked
    with the batch), not given back. Not when a give-back took it (`GIVEN_BACK`) or it was
    removed."""
    return taken.holder is not None and taken.holder != GIVEN_BACK


def own_create(head: EntryHead, attempt: str) -> bool:
    """Whether the OPEN `head` is `attempt`'s own create, whose answer was lost: the attempt
    takes it over at once instead of standing by for its holder."""
    return head.attempt == attempt


def outdated(head: EntryHead) -> bool:
    """Whether the entry's chunks are of an older format than this release writes: a take-over
    records them anew (`record_anew`), since the chunks of one entry share a format."""
    return head.format != LEDGER_FORMAT


async def await_holder(ledger: Ledger, gen: int, slot: str, quiet: float) -> tuple[EntryHead, int]:
    """The head of an OPEN entry another attempt holds, read again and again until its content
    is fixed, the holder releases it, or it has stood still for `quiet` seconds (its holder
    died, or stalls): whichever comes first, with its revision. `LedgerConflict` when the entry
    is removed meanwhile (settled, or given back to a query on a new checkpoint): the waiting
    attempt outlived it, and must not create it again."""
    poll, moved, seen = HOLD_POLL[0], clock.monotonic(), -1
    while True:
        found = await read_head(ledger, gen, slot)
        if found is None:
            raise LedgerConflict(
                f"ledger entry {ledger.head_key(gen, slot)} was removed (settled, or given back "
                "to a query on a new checkpoint) while this task attempt waited for the attempt "
                "holding it"
            )
        head, revision = found
        if content_fixed(head) or head.released:
            return found
        if revision != seen:
            moved, seen = clock.monotonic(), revision
        elif clock.monotonic() - moved > quiet:
            return found
        await asyncio.sleep(poll)
        poll = min(poll * 2, HOLD_POLL[1])


async def await_sealed(ledger: Ledger, gen: int, slot: str, quiet: float) -> EntryHead:
    """The head once its content is fixed, awaited by an attempt that another one took the
    entry from (`TakenOver`) while it was alive: it ends with the sealed content too.
    `LedgerConflict` when the entry is removed, released, or its head stands still for
    `quiet`."""
    head, _ = await await_holder(ledger, gen, slot, quiet)
    if not content_fixed(head):
        raise LedgerConflict(
            f"ledger entry {ledger.head_key(gen, slot)} was taken over by another task attempt, "
            f"which {'released it' if head.released else 'stood still'} before sealing it"
        )
    return head


async def release(ledger: Ledger, gen: int, slot: str, head: EntryHead, revision: int) -> bool:
    """OPEN -> OPEN, released: the holder fails (or is closed) before it seals; another attempt
    takes the entry over at once instead of standing by. Nothing when it is no longer the
    holder's; whether it released it."""
    head.released = True
    try:
        await write_head(ledger, gen, slot, head, revision)
    except LedgerConflict:
        return False
    return True


async def record(
    ledger: Ledger,
    gen: int,
    slot: str,
    head: EntryHead,
    revision: int,
    kept: tuple[str, list[str]],
    taken: EntryDeliveries,
    pin: str | None,
    replacing: int = 0,
    sealing: bool = False,
) -> int:
    """Record `taken` in the OPEN entry: after `kept` (what the head keeps of what was
    recorded before: `EntryHead.recorded`), in the head itself when it is the first record and
    small (`keep_inline`), else in chunks, then the head is updated to name them; the new
    revision. `replacing`: deliveries the head counts past `kept`, of the write that this one
    does again (without what a sibling recorded too). `sealing`: the attempt takes nothing
    after `taken`, and the head write seals the entry too (OPEN -> SEALED, as `seal`): one write
    fewer per slot and batch. The attempt must have nothing more to look at before it seals
    (slots with siblings check theirs after their record), and what it recorded must be all it
    holds (nothing can still come to its requests). A write that did not land as this
    attempt's leaves the head OPEN, as `seal` does, so that the attempt releases it.

    Once its chunks are being written, a record runs to its end however its attempt is
    cancelled meanwhile (a packed task cancels its other slots when one fails): cut short
    between its writes, it would leave chunks no head names, which only the next start's
    adoption removes, under a removed entry (seeds 1893, 1861 of the worlds with packed tasks
    and pauses). Its end: the head names them, or they are removed (`_settle_failed_write`)."""
    head.inline, head.chunks = kept
    head.count -= replacing
    if taken.prefix:
        head.prefix = taken.prefix.decode()
    if sealing:
        head.state = EntryState.SEALED
    writing = asyncio.ensure_future(_write_record(ledger, gen, slot, head, revision, taken, pin))
    try:
        written = await asyncio.shield(writing)
    except asyncio.CancelledError:
        await asyncio.wait([writing])
        if _revision_of(writing) is None:
            head.state = EntryState.OPEN
        raise
    except Exception:
        head.state = EntryState.OPEN
        raise
    if isinstance(written, LedgerConflict):
        head.state = EntryState.OPEN
        raise written
    return written


def _revision_of(writing: asyncio.Future[int | LedgerConflict]) -> int | None:
    """The revision `_write_record` wrote, once done; None when it did not land as this
    attempt's (its failure retrieved: the attempt is cancelled, which is what it raises)."""
    if writing.cancelled() or writing.exception() is not None:
        return None
    written = writing.result()
    return None if isinstance(written, LedgerConflict) else written


async def _write_record(
    ledger: Ledger,
    gen: int,
    slot: str,
    head: EntryHead,
    revision: int,
    taken: EntryDeliveries,
    pin: str | None,
) -> int | LedgerConflict:
    """`record`'s writes: the chunks (none when the head keeps `taken`), then the head naming
    them; the head's revision, or the conflict (returned rather than raised: a task its
    cancelled attempt no longer awaits would log it)."""
    if keep_inline(head, taken):
        keys = []
    else:
        keys = await ledger.write_chunks(gen, slot, head.attempt, len(head.chunks), taken)
    head.chunks = [*head.chunks, *keys]
    head.count += len(taken)
    head.max_seq = max(head.max_seq, max(taken.stream_seq, default=0))
    head.pin = pin
    written = await ledger.update_head(gen, slot, head.to_bytes(), revision)
    if written is not None:
        return written
    return await _settle_failed_write(ledger, gen, slot, head, keys)


async def _settle_failed_write(
    ledger: Ledger, gen: int, slot: str, head: EntryHead, keys: list[str]
) -> int | LedgerConflict:
    """After the head write of `record` failed: the head's revision when the write was this
    one's, retried; otherwise the conflict (returned, as `_write_record` returns it), once the
    chunks no head names are removed."""
    try:
        return await own_write_or_taken_over(ledger, gen, slot, head)
    except LedgerConflict as conflict:
        # Taken over or removed meanwhile: no head names these chunks now, nor will (a head
        # adopts only the chunks its predecessor named). Under a removed entry nothing else
        # would remove them.
        found = await read_head(ledger, gen, slot)
        named = set(found[0].chunks) if found else set()
        await ledger.remove_chunks(key for key in keys if key not in named)
        return conflict


async def record_anew(
    ledger: Ledger, gen: int, slot: str, head: EntryHead, revision: int, taken: EntryDeliveries
) -> int:
    """Record `taken` as all the OPEN entry holds, under the attempt that took it over (what it
    adopted, without what a sibling recorded too), in this release's format (`outdated`); the
    chunks the head named before go when the entry is removed."""
    head.count = 0
    head.format = LEDGER_FORMAT
    return await record(ledger, gen, slot, head, revision, ("", []), taken, head.pin)


async def seal(ledger: Ledger, gen: int, slot: str, head: EntryHead, revision: int) -> int:
    """OPEN -> SEALED: the attempt has taken all it will. An attempt whose write failed, or
    that was cut off from it (a packed task that Spark stops early cancels its slots), takes
    its head for OPEN again: the write may never have landed, and it releases the entry (its
    head said SEALED, so the release was skipped, and the entry left OPEN and held made the
    batch's next read stand by `HOLD_QUIET` for it); a write that landed refuses the release.
    Not after a conflict: the entry is another's then, and no release of this attempt's lands."""
    if head.state is not EntryState.OPEN:
        return revision
    head.state = EntryState.SEALED
    try:
        return await write_head(ledger, gen, slot, head, revision)
    except LedgerConflict:
        raise
    except BaseException:
        head.state = EntryState.OPEN
        raise


# After commit: SEALED -> ACKED, by the slot's next task, or by the driver.


async def ack(
    client: NatsClient, ledger: Ledger, gen: int, slot: str, stream: str
) -> EntryDeliveries | None:
    """SEALED -> ACKED: ack the entry of a committed batch (explicit acks, rebuilt from its
    numbers) and mark it acked; what it acked, or None (missing, open, or acked already). Two
    may ack one entry (a zombie attempt beside its retry, the driver at stop): the server
    ignores the second acks."""
    due = await ack_due_of(ledger, gen, slot)
    if due is None:
        return None
    await send_entry_acks(client, [due.deliveries], stream)
    await mark_acked(ledger, due)
    return due.deliveries


@dataclass
class DueAcks:
    """A SEALED entry of a committed batch as read for its acks (`ack`'s steps, which a task of
    packed slots runs for all its slots together: one flush for all their acks)."""

    gen: int
    slot: str
    head: EntryHead
    revision: int
    deliveries: EntryDeliveries


async def ack_due_of(ledger: Ledger, gen: int, slot: str) -> DueAcks | None:
    """The entry's head and deliveries when its acks are due; None when it is missing, open
    (logged: a committed batch has none) or acked already."""
    found = await read_head(ledger, gen, slot)
    if found is None:
        return None
    head, revision = found
    if head.state is EntryState.OPEN:
        log.warning(
            "ledger entry %s of a committed batch is not sealed; not acked",
            ledger.head_key(gen, slot),
        )
        return None
    if head.state is EntryState.ACKED:
        return None
    return DueAcks(gen, slot, head, revision, await read_deliveries(ledger, head))


async def send_entry_acks(
    client: NatsClient, entries: Iterable[EntryDeliveries], stream: str
) -> None:
    """Ack the deliveries of `entries` (of one stream) with one flush; fail when the server
    refused any."""
    commands: list[bytes] = []
    count = 0
    for deliveries in entries:
        commands += deliveries.ack_commands()
        count += len(deliveries)
    before = len(client.denied)
    await send_acks(client.nc, commands, count)
    _refused_acks(client, before, stream)


async def mark_acked(ledger: Ledger, due: DueAcks) -> None:
    """After its acks went out: the entry is ACKED."""
    due.head.state = EntryState.ACKED
    try:
        await write_head(ledger, due.gen, due.slot, due.head, due.revision)
    except LedgerConflict:
        # Another attempt (or the driver at stop) marked it first: it can only have acked it.
        log.debug(
            "ledger entry %s was marked acked by another attempt",
            ledger.head_key(due.gen, due.slot),
        )


def _refused_acks(client: NatsClient, before: int, stream: str) -> None:
    """Fail when the server refused acks published since `client.denied` had `before` entries:
    marking their entries acked would hide messages that stay pending for good."""
    refused = [e for e in client.denied[before:] if "$js.ack" in e.lower()]
    if refused:
        raise ConfigurationError(
            f"the server refused the acks of committed batches ({refused[0]}); allow the "
            f"user to publish to $JS.ACK.{stream}.> ({PERMISSIONS_DOC})"
        )


async def emitted(ledger: Ledger, gen: int, slot: str) -> tuple[int, ...] | None:
    """The stream sequences an earlier batch's entry emitted, for the dedupe of their
    redeliveries: none for a missing entry; None for an OPEN one (not of a committed batch: it
    emitted nothing yet, and may still record: read it again when named)."""
    found = await read_head(ledger, gen, slot)
    if found is None:
        return ()
    if found[0].state is EntryState.OPEN:
        return None
    return tuple((await read_deliveries(ledger, found[0])).stream_seq)


# What the driver concludes from a head (None: not read yet).


def unacked(head: EntryHead) -> int:
    """Messages of the entry that the query holds and has not acked: they count against its
    consumer's capacity as the query's own, not another client's."""
    return 0 if head.state is EntryState.ACKED else head.count


def known_acked(head: EntryHead | None) -> bool:
    """Whether the entry is known to be ACKED: else (not read yet, or not ACKED when last read)
    the driver reads its head again, since tasks seal and ack it meanwhile."""
    return head is not None and head.state is EntryState.ACKED


def ack_due(head: EntryHead | None, gen: int, committed: int) -> bool:
    """Whether a task (or the driver) must ack the entry: its batch is committed and it is not
    known to be acked (an unread head may be anything)."""
    return gen <= committed and (
        head is None or (head.state is not EntryState.ACKED and head.count > 0)
    )


def acked_by_next_task(head: EntryHead, gen: int, committed: int) -> bool:
    """Whether the slot's next task acks the entry before it pulls (its messages are free
    capacity for that task's batch)."""
    return gen <= committed and head.state is EntryState.SEALED


def holds_committed(head: EntryHead, gen: int, committed: int) -> bool:
    """Whether the entry holds what a committed batch emitted: acked (only a committed batch's
    entry is), or sealed in a batch known committed (an entry of a batch not committed yet is
    replayed only if the batch runs again: a new checkpoint gives it back)."""
    return head.count > 0 and (
        head.state is EntryState.ACKED or acked_by_next_task(head, gen, committed)
    )


def replayed(head: EntryHead, gen: int, committed: int, logged: int) -> bool:
    """Whether the entry holds what a batch logged and not committed yet replays as it runs
    again now: every record of a batch after `committed` up to `logged`, the batch run again
    (0: none), sealed or open (a retry takes an open one over and replays what it holds)."""
    return committed < gen <= logged and head.count > 0


def awaits_acks(head: EntryHead) -> bool:
    """A finished batch's messages wait for their acks: the `SealedKeeper` keeps them from
    redelivery meanwhile."""
    return head.state is EntryState.SEALED and head.count > 0


def awaits_taker(head: EntryHead) -> bool:
    """An entry its holder released holding what it recorded: those messages wait for the
    attempt that takes it over, which may start late (the full read of a batch that a job of the
    user's read first starts only once that job has ended), and the `SealedKeeper` keeps them
    from redelivery meanwhile."""
    return head.state is EntryState.OPEN and head.released and head.count > 0


@dataclass(frozen=True)
class Horizon:
    """How far a slot's consumer and stream have moved: entries below both are settled."""

    ack_floor: int  # 0 where the consumer's floor says nothing (not durable, unknown)
    first_seq: int  # the stream's first sequence


class Settling(Enum):
    NEVER = "never"  # open, or sealed and to be acked or replayed: kept as it is
    NOT_YET = "not yet"  # acked, but a redelivery could still reach its messages
    PAST = "past"  # no redelivery can reach it: settled once that has held `SETTLE_SECONDS`
    NOW = "now"  # holds nothing: settled at once


def settles(head: EntryHead | None, gen: int, committed: int, horizon: Horizon) -> Settling:
    """Whether the entry may be forgotten: acked (or empty, of a committed batch: a re-run of an
    uncommitted one must find it, it replays nothing) and below its slot's horizon."""
    if head is None or head.state is EntryState.OPEN:
        return Settling.NEVER
    if head.state is EntryState.SEALED and (head.count or gen > committed):
        return Settling.NEVER
    if not head.count:
        return Settling.NOW
    if head.max_seq > horizon.ack_floor and head.max_seq >= horizon.first_seq:
        return Settling.NOT_YET
    return Settling.PAST


async def remove_settled(
    ledger: Ledger,
    settled: list[tuple[int, str]],
    whole: Collection[int],
    fenced: int,
    raise_fence: Callable[[int], Awaitable[None]],
    forget: Callable[[tuple[int, str]], None],
) -> None:
    """ACKED (or empty) -> settled: the fence goes out before the entries (`raise_fence`
    writes the pointer's `settled`, when the newest gen is past `fenced`), so a task attempt
    that outlived its committed batch and creates an entry again after its removal finds it;
    `forget` each entry once it is removed. The batches of `whole`, all of whose entries
    settle, go in one removal each instead of one per slot (past the fence, any entry of theirs
    is settled or created again by an attempt that outlived it, which holds nothing)."""
    newest = max(gen for gen, _ in settled)
    if newest > fenced:
        await raise_fence(newest)
    for gen in sorted(whole):
        log.debug("forgetting the settled ledger entries of batch %d", gen)
        await ledger.delete_batch(gen)
    for gen, slot in settled:
        if gen not in whole:
            log.debug("forgetting settled ledger entry %s", ledger.head_key(gen, slot))
            await ledger.delete_entry(gen, slot)
        forget((gen, slot))


Marks = dict[tuple[str, str], dict[int, int]]
"""By consumer ((stream, name), from the entries' ack prefix): the stream sequences a give-back's
ACKED entries held, each with the ledger revision its entry's head was read at (that of the ACKED
write, or of a later one; a packed key's last write). Once they are removed, what those entries
acked is in no ledger: a consumer created again that starts below one delivers it again, and
nothing would drop it (`SeenConsumers.acked_earlier`). The revision tells whether the acks are
known to have reached the consumer that delivered them: the server ignores an ack of what the
consumer it reaches never delivered, one created again an instant before it (seed 1586 of the
simulation's worlds whose operator follows the advice), and the task marks the entry ACKED
anyway (`DriverLedger.marks_known_taken`)."""


async def give_back(
    client: NatsClient,
    ledger: Ledger,
    keys: list[tuple[int, str]],
    keep_marks: Callable[[Marks], Awaitable[None]],
) -> int:
    """Any state -> given back: remove the entries `keys` of an earlier checkpoint and NAK what
    they hold (read first: once removed, nothing names those deliveries); returns how many
    messages it NAKed. `keep_marks` keeps what the ACKED ones held (`Marks`) before any is
    removed: kept after, a driver that dies between the removal and its keeping loses them
    (seeds 150 and 247 of the simulation, as 5265 did before the pointer was written at stop).
    Acked entries too: a server restart loses the acks its consumer store had not written yet
    (the last 100 ms), and the server ignores the NAK of a message no longer pending, so only
    what came back is given back, at once, ahead of newer messages of its key."""
    held: list[EntryDeliveries] = []
    acked: Marks = {}
    for gen, slot in keys:
        taken = await _taken_from_its_attempt(ledger, gen, slot)
        if taken is None:
            continue
        head, revision = taken
        try:
            deliveries = await read_deliveries(ledger, head)
        except ChunkMissing:
            # Removed before and brought back by a server restarted uncleanly (a lost
            # tombstone) without its chunks: what it held was settled or given back then.
            log.warning(
                "ledger entry %s came back without its chunks; removing it with nothing to NAK",
                ledger.head_key(gen, slot),
            )
            continue
        held.append(deliveries)
        _mark(acked, head, deliveries, revision)
    await keep_marks(acked)
    for gen, slot in keys:
        await ledger.delete_entry(gen, slot)
    returned = 0
    for deliveries in held:
        if not deliveries:  # an entry created that took nothing yet: no consumer to ask
            continue
        current = await _as_last_delivered(client, deliveries)
        if current is not None:
            returned += await send_acks(client.nc, current.ack_commands(NAK), len(current))
    return returned


async def marks_of(ledger: Ledger, keys: Sequence[tuple[int, str]]) -> Marks:
    """What the ACKED ones of the entries `keys` hold (`Marks`), as a give-back of them keeps
    it: read before that give-back, by a driver that knows it comes
    (`DriverLedger.earlier_checkpoint_left`)."""
    acked: Marks = {}
    for found in await read_heads(ledger, keys):
        if found is None or found[0].state is not EntryState.ACKED or not found[0].count:
            continue
        head, revision = found
        try:
            deliveries = await read_deliveries(ledger, head)
        except ChunkMissing:  # brought back without its chunks: as `give_back` passes it over
            continue
        _mark(acked, head, deliveries, revision)
    return acked


def _mark(acked: Marks, head: EntryHead, held: EntryDeliveries, revision: int) -> None:
    """Add what an ACKED entry `head`, read at `revision`, holds (`held`) to `acked`, by
    consumer (`Marks`)."""
    if head.state is EntryState.ACKED and held:
        marks = acked.setdefault(_consumer_of(held), {})
        marks.update(dict.fromkeys(held.stream_seq, revision))


def _consumer_of(deliveries: EntryDeliveries) -> tuple[str, str]:
    """(stream, consumer) of the deliveries, from their ack prefix `$JS.ACK.<stream>.<name>`."""
    stream, consumer = (token.decode() for token in deliveries.prefix.split(b".")[-2:])
    return stream, consumer


async def _as_last_delivered(
    client: NatsClient, deliveries: EntryDeliveries
) -> EntryDeliveries | None:
    """`deliveries` with the consumer sequence of the consumer's last delivery, or None when
    the consumer is gone. The server looks a `-NAK`'s message up by its stream sequence, but
    ignores one whose consumer sequence is at or below the ack floor's (`processNak`): an entry
    names the delivery it recorded, which the ack floor may have passed since the message was
    delivered again, and the message would then wait out its ack wait behind newer ones of its
    key. The last delivery's sequence is inside the window whenever anything is pending."""
    try:
        info = await client.api.consumer_info(*_consumer_of(deliveries))
    except NotFound:
        return None
    last = info.delivered_consumer_seq
    return EntryDeliveries(
        deliveries.prefix, deliveries.stream_seq, [last] * len(deliveries), deliveries.delivered
    )


async def _taken_from_its_attempt(
    ledger: Ledger, gen: int, slot: str
) -> tuple[EntryHead, int] | None:
    """The entry's head and the revision it was read at, rewritten under `GIVEN_BACK` when OPEN
    (compare-and-set on its revision): an attempt of the earlier query still recording in it
    fails its next write, instead of recording deliveries after the give-back read what to NAK
    (they would wait out their ack wait, behind newer messages of their keys). Not as it is: an
    attempt whose write answered as a conflict reads the head back and takes one equal to what
    it wrote for its own write (`write_head`), and it would go on recording on the give-back's
    revision (seed 13576)."""
    while True:
        found = await read_head(ledger, gen, slot)
        if found is None or found[0].state is not EntryState.OPEN:
            return found
        head, revision = found
        try:
            await write_head(ledger, gen, slot, take_over(head, head.pin, GIVEN_BACK), revision)
        except LedgerConflict:
            continue  # the attempt wrote meanwhile: read what it recorded
        return head, revision
