"""Issue 38 item 16: a trainer killed while sending its report is an expected event, one quiet line.

In a 14-fault soak the operator logged an ERROR with a traceback for each report whose sender was killed
mid-body (ConnectionResetError). Through the real endpoint over loopback, the peer really resets the
connection (SO_LINGER 0: an RST, not a FIN) after the headers and half the body, or stops sending until the
body timeout: no record at WARNING or above, no traceback, one line at INFO or below, no stall clock held,
and the endpoint serves the next report."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest

from .test_progress_hardening import JOB_URL, Endpoint, review_workers

pytestmark = pytest.mark.timeout(60)

BODY = b'{"step": 12, "total_steps": 100, "loss": 0.25}'


def request_head(length: int) -> bytes:
    return (f"POST {JOB_URL} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer w-0\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


async def reset_mid_body(port: int) -> None:
    """Headers and half the body, then an RST, as the kernel sends for a killed process's unread socket."""
    peer = socket.create_connection(("127.0.0.1", port))
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.sendall(request_head(len(BODY)) + BODY[: len(BODY) // 2])
    await asyncio.sleep(0.3)  # the handler is reading the body
    peer.close()


async def stall_mid_body(port: int) -> None:
    """Half the body, then nothing until the server's body timeout answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_head(len(BODY)) + BODY[: len(BODY) // 2])
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), 20)).split()[1] == b"408"
    writer.close()


async def close_mid_body(port: int) -> None:
    """Half the body, then an orderly close (FIN): the body ends short."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_head(len(BODY)) + BODY[: len(BODY) // 2])
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()


async def close_mid_chunk(port: int) -> None:
    """A chunked body whose chunk ends short, then an orderly close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = request_head(0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    writer.write(head + f"{len(BODY):x}\r\n".encode() + BODY[: len(BODY) // 2])
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()


@pytest.mark.parametrize("drop", [reset_mid_body, stall_mid_body, close_mid_body, close_mid_chunk],
                         ids=["reset (RST)", "silent until the body timeout", "closed (FIN)", "closed mid-chunk"])
async def test_a_peer_dropping_its_report_mid_body_is_one_quiet_line(drop, caplog):
    caplog.set_level(logging.DEBUG)
    async with Endpoint(review_workers, body_seconds=1.0) as endpoint:
        await drop(endpoint.server.port)
        await asyncio.sleep(0.5)  # whatever the server logs of it, it has logged
        logged = [r for r in caplog.records if r.name.startswith(("ddpjob_operator", "aiohttp", "asyncio"))]
        loud = [r for r in logged if r.levelno >= logging.WARNING or r.exc_info]
        assert loud == [], [r.getMessage() for r in loud]
        assert "Traceback" not in caplog.text
        ours = [r for r in logged if r.name.startswith("ddpjob_operator")]
        assert len(ours) == 1 and "pod ns/w-0" in ours[0].getMessage(), caplog.text
        assert endpoint.refusals == [] and endpoint.tracker.jobs == {}
        assert (await endpoint.post("w-0"))[0] == 204
