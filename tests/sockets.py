"""The addresses a process tree listens on (not a test module): what the tests of a Ray
ortgen starts itself check is loopback only."""

from __future__ import annotations

import psutil

#: the addresses that are loopback (IPv4, and IPv4 mapped into IPv6)
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


def listening_addresses(pid: int) -> set[str]:
    """Every IP address process ``pid`` or one of its descendants listens on."""
    listening: set[str] = set()
    me = psutil.Process(pid)
    for process in [me, *me.children(recursive=True)]:
        try:
            sockets = process.net_connections(kind="inet")
        except psutil.Error:  # gone, or not ours to read
            continue
        listening |= {s.laddr.ip for s in sockets if s.status == psutil.CONN_LISTEN}
    return listening
