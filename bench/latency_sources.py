"""The two streaming sources `bench/latency.py` runs, in a module Spark's Python processes import
(the checkout is on their path):

- `nats-pcg-timed`: the connector itself, its reader's planning and tasks timed where they
  run. The planning calls (`latestOffset` and `partitions`, in the streaming source's runner
  process) note their milliseconds and the messages the driver's NATS connection sent meanwhile
  (requests to the JetStream API and the ledger bucket); each task notes when its read started
  and ended and the rows it gave. One JSON line per call, appended to a file per process in the
  directory named by `$NATS_SPARK_LATENCY_PROBE` (set before the session starts, so that Spark's
  processes inherit it); nothing is noted where it is unset.
- `latency_floor`: Spark's own floor, no NATS: every `latestOffset` is one more than the last,
  and each batch is `partitions` input partitions of `rows` rows, which stand for messages that
  arrived evenly since the previous `latestOffset` (`arrived`); once the file named by `halt`
  exists, `latestOffset` stays where it is, so that the query can go idle before it is stopped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from nats_spark.spark.group_source.source import NatsPcgDataSource, NatsPcgStreamReader

PROBE_DIR = "NATS_SPARK_LATENCY_PROBE"


def _note(kind: str, **figures: Any) -> None:
    folder = os.environ.get(PROBE_DIR)
    if folder:
        with open(os.path.join(folder, f"{kind}-{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(figures) + "\n")


class TimedStreamReader(NatsPcgStreamReader):
    """The connector's stream reader, timed (see the module's docstring)."""

    def _sent(self) -> int:
        """Messages the driver's connection has sent (0 before it connects)."""
        client = self._offsets.client if self._offsets is not None else None
        return client.nc.stats["out_msgs"] if client is not None else 0

    def _timed(self, call: str, gen: int, run: Any, *args: Any) -> Any:
        started, sent = time.time(), self._sent()
        result = run(*args)
        ended = time.time()
        gen = result["gen"] if call == "latestOffset" else gen
        _note("driver", call=call, gen=gen, started=started, ended=ended, sent=self._sent() - sent)
        return result

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict[str, Any]:
        return self._timed("latestOffset", 0, super().latestOffset, start, limit)

    def partitions(self, start: dict, end: dict) -> Any:
        return self._timed("partitions", end["gen"], super().partitions, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        started, rows = time.time(), 0
        try:
            for batch in super().read(partition):
                rows += batch.num_rows
                yield batch
        finally:
            slots = getattr(partition, "slots", None)  # a packed task: its first slot's batch
            first = slots[0] if slots else partition
            gen = getattr(first, "gen", None)
            slot = f"{len(slots)} slots" if slots else getattr(partition, "slot", None)
            _note("task", gen=gen, slot=slot, started=started, ended=time.time(), rows=rows)


class TimedNatsPcg(NatsPcgDataSource):
    @classmethod
    def name(cls) -> str:
        return "nats-pcg-timed"

    def streamReader(self, schema: Any) -> TimedStreamReader:
        reader = super().streamReader(schema)
        assert isinstance(reader, NatsPcgStreamReader)
        return TimedStreamReader(reader.options, reader.refused)


class _FloorReader(DataSourceStreamReader):
    """Each batch's rows stand for messages that arrived evenly between the previous
    `latestOffset` and this one (the column `arrived`): what a source that plans a batch from
    what has arrived when Spark asks for its latest offset would read, at no cost."""

    def __init__(self, partitions: int, rows: int, halt: str) -> None:
        self.count, self.rows, self.halt = partitions, rows, halt
        self.latest: dict[str, float] | None = None

    def initialOffset(self) -> dict[str, float]:
        return {"at": 0, "t": time.time()}

    def latestOffset(self) -> dict[str, float]:
        if self.latest is None or not os.path.exists(self.halt):
            at = self.latest["at"] + 1 if self.latest else 1
            self.latest = {"at": at, "t": time.time()}
        return self.latest

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition((i, start["t"], end["t"])) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, float]]:
        index, since, until = partition.value
        spread = (until - since) / (self.count * self.rows)
        for row in range(self.rows):
            yield index, row, since + (index * self.rows + row + 0.5) * spread

    def commit(self, end: dict) -> None:
        pass


class LatencyFloor(DataSource):
    @classmethod
    def name(cls) -> str:
        return "latency_floor"

    def schema(self) -> str:
        return "partition INT, row INT, arrived DOUBLE"

    def streamReader(self, schema: Any) -> _FloorReader:
        options = self.options
        return _FloorReader(int(options["partitions"]), int(options["rows"]), options["halt"])
