"""The load of a latency run, in a process of its own (so that neither its CPU nor its event
loop mixes with the reader's being measured): publish RATE messages a second of SIZE bytes over
KEYS subjects of STREAM for SECONDS, each confirmed by JetStream. Prints a JSON line with the
time it starts publishing, and one with the count and the rate reached when it ends.
`bench/common.py`'s ProcessSampler names it `publisher`.

    python bench/steady_publisher.py URL STREAM RATE SECONDS KEYS SIZE
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.connector import publish_steadily  # noqa: E402


def main() -> None:
    url, stream, rate, seconds, keys, size = sys.argv[1:]
    print(json.dumps({"started": time.time()}), flush=True)  # a loopback connect after it
    reached = publish_steadily(url, stream, int(rate), float(seconds), int(size), int(keys))
    published = round(int(rate) * float(seconds))
    print(json.dumps({"published": published, "msgs_per_s": round(reached)}), flush=True)


if __name__ == "__main__":
    main()
