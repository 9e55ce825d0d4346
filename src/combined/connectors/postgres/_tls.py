"""Whether a PostgreSQL source's password can travel in clear text.

A server asks for the password in one of three ways: ``password`` (the
password itself), ``md5`` (a replayable digest) or SCRAM. Without TLS, a
server an attacker stands in for (a spoofed address, a poisoned DNS answer)
asks for ``password`` and libpq sends it. ``sslmode=prefer`` (libpq's
default) and ``allow`` fall back to no TLS when the server declines it, and
neither checks the server's certificate, so only ``require``, ``verify-ca``
and ``verify-full`` keep the password off the wire in clear; ``verify-full``
also proves who the server is. ``require_auth=scram-sha-256`` (libpq 16+)
refuses a server that asks for the password itself.
"""

from __future__ import annotations

import ipaddress
import os

from psycopg.conninfo import conninfo_to_dict

#: The ``sslmode`` values that never send a byte without TLS.
TLS_MODES = ("require", "verify-ca", "verify-full")

#: The ``require_auth`` methods that never send the password or its md5 digest.
_SAFE_AUTH = {"scram-sha-256", "none", "!password,!md5", "!md5,!password"}


def _loopback(host: str) -> bool:
    """``host`` is this machine: a Unix socket directory, ``localhost`` or a loopback address."""
    if not host or host.startswith(("/", "@")) or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cleartext_password_warning(dsn: str, password: str | None) -> str | None:
    """Why the password may cross the network in clear text; None when it cannot.

    A password (configured, or ``PGPASSWORD``) sent to a host that is not
    this machine, under an ``sslmode`` that allows a connection without TLS
    (``disable``, ``allow``, ``prefer``; libpq's default is ``prefer``), and
    no ``require_auth`` that refuses the cleartext and md5 methods.
    """
    if not (password or os.environ.get("PGPASSWORD")):
        return None
    parts = conninfo_to_dict(dsn)
    mode = str(parts.get("sslmode") or os.environ.get("PGSSLMODE") or "prefer")
    auth = str(parts.get("require_auth") or os.environ.get("PGREQUIREAUTH") or "").replace(" ", "")
    if mode in TLS_MODES or auth in _SAFE_AUTH:
        return None
    named = str(parts.get("host") or os.environ.get("PGHOST") or "")
    hosts = [h for h in named.split(",") if h]
    remote = [h for h in hosts if not _loopback(h)]
    if not remote:
        return None
    return (
        f"the password may be sent in clear text to {', '.join(remote)}: sslmode is {mode}, "
        "which connects without TLS when the server (or whoever answers in its place) "
        "declines it; add sslmode=verify-full (with sslrootcert) to the dsn, or at least "
        "require_auth=scram-sha-256 so that the password itself is never sent"
    )
