"""`python -m nats_spark.cli`: the `nats-pcg` command."""

import sys

from nats_spark.cli import main

sys.exit(main())
