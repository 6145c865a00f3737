"""A TCP proxy in front of Neo4j for outage tests: it forwards Bolt until told to go away,
then either drops every connection and refuses new ones (``refuse``) or accepts them and
never answers (``blackhole``: a host gone from the network)."""

from __future__ import annotations

import asyncio
import contextlib


class BoltProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "forward"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def uri(self) -> str:
        return f"bolt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            writer.close()
            return
        self._writers.add(writer)
        if self.mode == "blackhole":
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def go_away(self, mode: str) -> None:
        """Cut every open connection; new ones are refused or black-holed."""
        self.mode = mode
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def close(self) -> None:
        self.go_away("refuse")
        if self._server is not None:
            self._server.close()
