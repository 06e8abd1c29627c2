"""What the `nats-pcg` source runs in a task, for one slot of one batch: `slot_reader.py`
and the steps of its pipeline, pull -> accept -> columns -> record -> emit."""
