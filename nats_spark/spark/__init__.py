"""The `nats-pcg` Spark source: options, offsets, ledger, driver planning and executor reading."""
