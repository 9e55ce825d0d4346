"""A server speaking PostgreSQL's protocol that asks for a password and echoes it back.

For tests that a server's message quoting the password it was sent (a
careless proxy, a hostile server) never reaches any text Combined shows.
"""

from __future__ import annotations

import socket
import struct
import threading


def echoing_postgres(connections: int = 4) -> tuple[int, threading.Thread]:
    """A server speaking PostgreSQL's protocol that asks for the password and echoes it.

    It answers the SSL request with ``N``, asks for a cleartext password,
    then fails the login with a message quoting the password it got, as a
    careless proxy does.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(20)

    def read(conn: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def serve() -> None:
        with listener:
            for _ in range(connections):
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    try:
                        while True:
                            (length,) = struct.unpack("!I", read(conn, 4))
                            body = read(conn, length - 4)
                            if body[:4] in (b"\x04\xd2\x16\x2f", b"\x04\xd2\x16\x30"):
                                conn.sendall(b"N")  # no SSL, no GSS
                                continue
                            break
                        conn.sendall(b"R" + struct.pack("!II", 8, 3))  # cleartext password
                        kind = read(conn, 1)
                        (length,) = struct.unpack("!I", read(conn, 4))
                        password = read(conn, length - 4).rstrip(b"\0").decode()
                        assert kind == b"p"
                        fields = (
                            b"SFATAL\0C28P01\0M"
                            + f"password {password} is not the right one".encode()
                            + b"\0\0"
                        )
                        conn.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)
                    except (ConnectionError, OSError):
                        continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread
