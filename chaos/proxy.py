"""A TCP proxy on loopback that can play a network partition between clients and a server.

`blackhole()` keeps every connection open but stops relaying bytes both ways (a dropped route:
nothing arrives, nothing fails; the kernel's buffers fill and senders block, as TCP does while it
retransmits); `heal()` relays again, from where it stopped. `cut()` closes every connection at
once (a reset link). New connections during a blackhole are accepted and hang like the others.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.relaying = asyncio.Event()
        self.writers: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.relaying.set()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        started.set()
        self.loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:  # the server is down: the client sees a closed connection
            writer.close()
            return
        self.writers |= {writer, upstream_writer}
        await asyncio.gather(
            self._pipe(reader, upstream_writer),
            self._pipe(upstream_reader, writer),
            return_exceptions=True,
        )
        for end in (writer, upstream_writer):
            self.writers.discard(end)
            end.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            await self.relaying.wait()
            data = await source.read(65536)
            if not data:
                break
            await self.relaying.wait()  # bytes read as the blackhole began wait for its end
            sink.write(data)
            await sink.drain()
        sink.close()

    def _call(self, action: Callable[[], None]) -> None:
        self.loop.call_soon_threadsafe(action)

    def blackhole(self) -> None:
        self._call(self.relaying.clear)

    def heal(self) -> None:
        self._call(self.relaying.set)

    def cut(self) -> None:
        def close_all() -> None:
            for writer in list(self.writers):
                writer.transport.abort()

        self._call(close_all)

    async def _shutdown(self) -> None:
        """Close everything and let the relaying tasks end on their own (cancelling them trips
        asyncio's stream callbacks on Python 3.11)."""
        self.server.close()
        self.relaying.set()
        for writer in list(self.writers):
            writer.transport.abort()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self._call(self.loop.stop)
        self.thread.join(10)
