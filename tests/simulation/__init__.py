"""A deterministic simulation of the ack-ledger protocol: the real driver and task code against a
simulated JetStream, ledger bucket and Spark, under a seeded scheduler (see world.py).

Real, the product's own code as it runs in a query:
- the driver: `BatchCoordinator` and all it plans with (`DriverLedger`, the planner, `Presence`,
  `SealedKeeper`, `SeenConsumers`' consumer checks), the options (`parse_options`);
- a task: `SlotReader` (`read_slot`'s and `read_packed`'s steps: `slot_batches`,
  `packed_batches`) and all it reads with (`SlotEntry`, `SlotHistory`, `Acceptance`,
  `Replayer`, `SlotPulls`, the in-progress keeper, the record batches' columns);
- the ledger: `Ledger`, its stored forms and every move of `ledger_protocol`.

Simulated, each a stand-in the product is handed, never a patch of its modules:
- the server (jetstream.py): a stream and its pull consumers as unkind as nats-server's, behind
  a `SimClient` set as the driver's `client` and passed to each `SlotReader`; every request, pull
  and ack is a scheduling point;
- the ledger bucket: `MemoryBucket` (tests/memory_bucket.py, held to a real bucket's
  compare-and-set by test_ledger_bucket.py) behind `SimBucket`, attached to the driver's
  `DriverLedger` and set as each task's `Ledger`; writes may lose their answers;
- the target: `Target` (world.py) set as the driver's `target`, fixed slots with a consumer each
  (or one shared), instead of resolving a group on the server;
- Spark (spark.py): the checkpoint (offset and commit logs), both call orders of the source's
  methods, tasks with retries, zombies and speculative copies, and the sink;
- the process (`nats_spark.spark.group_source.runtime.Runtime`, passed to `BatchCoordinator` and
  `SlotReader`): ids drawn from the seed (lineages, drivers, task attempts), a worker's memory
  of entries per world, and the driver's give-back wrapped to note what each removal leaves
  (lateness.py);
- time (scheduler.py): a virtual event loop, which `nats_spark.clock` reads while a schedule
  runs (`clock.use`), and crashes, stalls and delays at every scheduling point.
"""
