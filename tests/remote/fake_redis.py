#!/usr/bin/env python3
"""fake_redis.py -- a server that speaks Redis's protocol on 127.0.0.1
and, but for one mode, misbehaves on purpose: what hostile.sh points the
remote compile cache at.

Usage: fake_redis.py MODE PORTFILE [LIFETIME]
Listens on a free port of 127.0.0.1 only (written to PORTFILE once it
listens), serves each connection by MODE, and exits by itself after
LIFETIME seconds (default 60), whatever its clients do.

Modes (what the first command of a connection gets):
  honest   a tiny Redis: SET (EX ignored), GETRANGE, AUTH, SELECT, PING
  trickle  a 30-byte bulk string, one byte every 0.5 s
  huge     a bulk string announced as 300 MB, then sent as fast as it goes
  endless  a status line that never ends: '+', then 300 MB of 'a'
  array    an array of 2^31 - 1 elements
  error    an error whose text holds terminal commands (ESC, BEL, OSC)
  extra    an empty bulk string, then bytes no command asked for
"""
import os
import socket
import sys
import threading
import time

MB = 1 << 20
ERROR = (b"-ERR \x1b[2J\x1b]0;pwned\x07 \x9b31m bad\r\n")


def read_command(f):
    """One command (a list of bytes) from the client, or None at its end."""
    head = f.readline()
    if not head:
        return None
    if not head.startswith(b"*"):
        return [head.strip()]          # an inline command
    args = []
    for _ in range(int(head[1:])):
        size = f.readline()
        if not size.startswith(b"$"):
            return None
        n = int(size[1:])
        args.append(f.read(n))
        f.read(2)
    return args


def honest(conn, f, store):
    while True:
        cmd = read_command(f)
        if cmd is None:
            return
        name = cmd[0].upper()
        if name == b"SET":
            store[cmd[1]] = cmd[2]
            conn.sendall(b"+OK\r\n")
        elif name == b"GETRANGE":
            v = store.get(cmd[1], b"")
            a, b = int(cmd[2]), int(cmd[3])
            v = v[a:b + 1]
            conn.sendall(b"$%d\r\n%s\r\n" % (len(v), v))
        elif name in (b"AUTH", b"SELECT"):
            conn.sendall(b"+OK\r\n")
        elif name == b"PING":
            conn.sendall(b"+PONG\r\n")
        else:
            conn.sendall(b"-ERR unknown command\r\n")


def flood(conn, head, byte, total):
    conn.sendall(head)
    chunk = byte * MB
    for _ in range(total // MB):
        conn.sendall(chunk)


def serve(conn, mode, store):
    f = conn.makefile("rb")
    try:
        if mode == "honest":
            honest(conn, f, store)
            return
        if read_command(f) is None:
            return
        if mode == "trickle":
            conn.sendall(b"$30\r\n")
            for i in range(32):
                time.sleep(0.5)
                conn.sendall(b"x" if i < 30 else b"\r\n"[i - 30:i - 29])
        elif mode == "huge":
            flood(conn, b"$%d\r\n" % (300 * MB), b"\0", 300 * MB)
        elif mode == "endless":
            flood(conn, b"+", b"a", 300 * MB)
        elif mode == "array":
            conn.sendall(b"*2147483647\r\n" + b":1\r\n" * 1000)
        elif mode == "error":
            conn.sendall(ERROR)
        elif mode == "extra":
            conn.sendall(b"$0\r\n\r\n+OK\r\n+OK\r\n")
        # hold the connection until the client gives up
        while conn.recv(65536):
            pass
    except OSError:
        pass                            # the client went away: as it should
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    mode, portfile = sys.argv[1], sys.argv[2]
    lifetime = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    end = time.monotonic() + lifetime
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    tmp = portfile + ".tmp"
    with open(tmp, "w") as p:
        p.write("%d\n" % srv.getsockname()[1])
    os.rename(tmp, portfile)
    store = {}
    while time.monotonic() < end:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        conn.settimeout(max(0.1, end - time.monotonic()))
        threading.Thread(target=serve, args=(conn, mode, store), daemon=True).start()
    os._exit(0)


if __name__ == "__main__":
    main()
