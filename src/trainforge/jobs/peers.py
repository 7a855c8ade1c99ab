"""Who sent a request: the Unix user owning a loopback client's socket, else the client's address.

    submitter(("127.0.0.1", 51234), ("127.0.0.1", 8765))   # "uid 1000": the user whose process holds port 51234
    submitter(("10.0.0.7", 51234), ("10.0.0.2", 8765))     # "10.0.0.7": another machine, known by its address
    socket_owner(("127.0.0.1", 51234), ("127.0.0.1", 8765))  # 1000, or None when no such connection exists

The admission gives each submitter a share of the check slots (`sizing.CheckSlots`), so it must tell the users of
this machine apart, and on loopback they all come from 127.0.0.1. The kernel knows better: its table of TCP
sockets (/proc/net/tcp, /proc/net/tcp6; readable by every user) lists each socket with its local and remote
address and the uid that created it. The client's socket is the one whose local address is the client's and whose
remote address is ours. A client cannot choose what the kernel writes there. On a table that cannot be read, or a
connection already gone, the address is the identity (every loopback user then shares one share).
"""
from __future__ import annotations

import ipaddress
import struct
from typing import Iterable, Optional, Sequence

PROC_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Address = tuple[str, int]


def submitter(client: Optional[Address], server: Optional[Address], tables: Sequence[str] = PROC_TABLES) -> str:
    """The identity a request's checks are counted under: "uid N" for a loopback client found in the kernel's
    tables, else the client's address (or "unknown" without one)."""
    if not client:
        return "unknown"
    host = client[0]
    ip = _ip(host)
    if ip is not None and ip.is_loopback and server:
        uid = socket_owner(client, server, tables)
        if uid is not None:
            return f"uid {uid}"
    return str(ip) if ip is not None else host


def socket_owner(local: Address, remote: Address, tables: Sequence[str] = PROC_TABLES) -> Optional[int]:
    """The uid owning the TCP socket bound to `local` and connected to `remote`, from the kernel's tables; None
    if there is none (or the tables cannot be read)."""
    want = (_ip(local[0]), int(local[1]), _ip(remote[0]), int(remote[1]))
    if want[0] is None or want[2] is None:
        return None
    for table in tables:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]  # a header line first
        except OSError:
            continue
        for local_addr, remote_addr, uid in _entries(rows):
            if (*local_addr, *remote_addr) == want:
                return uid
    return None


def _entries(rows: Iterable[str]):
    """(local (ip, port), remote (ip, port), uid) of each row: `sl local rem st queues tr retrnsmt uid ...`."""
    for row in rows:
        fields = row.split()
        if len(fields) < 8:
            continue
        try:
            yield _address(fields[1]), _address(fields[2]), int(fields[7])
        except ValueError:
            continue


def _address(field: str):
    """"0100007F:C350" -> (127.0.0.1, 50000). The kernel prints the address as 32-bit words in this machine's byte
    order (one for IPv4, four for IPv6) and the port as a number, all in hex."""
    hex_ip, hex_port = field.split(":")
    words = [int(hex_ip[i:i + 8], 16) for i in range(0, len(hex_ip), 8)]
    ip = ipaddress.ip_address(b"".join(struct.pack("=I", w) for w in words))
    return _unmapped(ip), int(hex_port, 16)


def _ip(host: str):
    try:
        return _unmapped(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def _unmapped(ip):
    """::ffff:127.0.0.1 (an IPv4 client of a dual-stack socket) is 127.0.0.1."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip
