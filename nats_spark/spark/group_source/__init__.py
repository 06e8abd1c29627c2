"""The `nats-pcg` source: partitioned consumer groups and priority-group consumers, acked after
commit. `driver/` runs on the driver (targets, offsets, the planner, the batch coordinator, the
ledger as the driver keeps it); `task/` runs in the tasks that read slots. Here: the format's
entry points and options (`source.py`, `options.py`) and what both sides share: the input
partition (`slot_partition.py`) and the ack ledger (`ledger.py`: its stored form;
`ledger_protocol.py`: its states, moves and verdicts)."""
