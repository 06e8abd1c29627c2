"""What the `nats-pcg` source runs in a task, for one slot of one batch: `partition_reader.py`
and the steps of its pipeline, pull -> accept -> columns -> record -> emit."""
