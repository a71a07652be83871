"""The UNIX-socket control listener (``softhca serve --unix PATH``): local programs'
verbs calls, above all the libibverbs provider's (provider/).

Authentication is the kernel's, not a token: the socket file is created owner-only
(mode 0600, under a umask of 0177, so there is no moment when others may connect), and
each connection's SO_PEERCRED must name the daemon's own user or root; any other is
refused with EACCES before its HELLO. The socket's name is never touched after bind (no
chmod; unlinked at close only while it is still this socket): in a directory others may
write, it may be a symlink by then. The HELLO is the TCP one (docs/protocol.md)
without a token; only the ``control`` role is served here. The welcome also names the
daemon's wire address, the one a program's GID carries.

The peer's credentials stay with its session: the pid is how the daemon reaches the
memfds that back the program's registrations (server/shared_mr.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct

from ..protocol.errors import RDMAError
from ..protocol.frames import REQUEST_LIMITS, FrameDecoder, encode_frame
from ..protocol.handshake import HandshakeError, make_challenge, verify_hello
from ..protocol.kinds import FrameKind
from .link import READ_CHUNK, read_frames
from .logs import kv, log
from .session import ControlSession, send_error
from .shares import Watchdog

_CRED = struct.Struct("3i")


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a UNIX stream."""
    sock = writer.get_extra_info("socket")
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return pid, uid, gid


class UnixListener:
    """Control sessions on a UNIX socket, served by ``daemon`` (server/daemon.py)."""

    def __init__(self, daemon, path: str) -> None:
        self.daemon = daemon
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        # The socket's directory (an O_PATH descriptor) and its (st_dev, st_ino).
        self._dir: int | None = None
        self._name = ""
        self._ours = (0, 0)
        self.refused = 0
        # Its connections that have not said HELLO yet, oldest first (Daemon.pre_hello).
        self._pre_hello: dict[asyncio.StreamWriter, None] = {}

    async def start(self) -> None:
        # Everything through the socket's name happens in the directory as opened here,
        # once: a directory of the path swapped for a symlink later moves none of it.
        parent, name = os.path.split(os.path.abspath(self.path))
        self._dir = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        sock = None
        try:
            with contextlib.suppress(FileNotFoundError):
                # A socket left by a daemon that died is replaced; any other file is not.
                if stat.S_ISSOCK(os.lstat(name, dir_fd=self._dir).st_mode):
                    os.unlink(name, dir_fd=self._dir)
            # The mode is the umask's at bind, so the socket is owner-only from the
            # moment it has a name; the name is never chmod'ed after (it may be a
            # symlink by then, in a directory others may write).
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)
            try:
                # Bound in that directory through its descriptor where /proc is mounted.
                anchored = f"/proc/self/fd/{self._dir}"
                sock.bind(f"{anchored}/{name}" if os.path.isdir(anchored) else self.path)
            finally:
                os.umask(old)
            # Which file is ours: at close, the name is unlinked only if it still is.
            st = os.lstat(name, dir_fd=self._dir)
            self._ours = (st.st_dev, st.st_ino)
            self._name = name
            self._server = await asyncio.start_unix_server(self._on_connection, sock=sock,
                                                           limit=READ_CHUNK)
        except BaseException:
            if sock is not None:
                sock.close()
            os.close(self._dir)
            self._dir = None
            raise
        log.info("listening %s", kv(event="listen_unix", path=self.path,
                                     uid=os.geteuid()))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        if self._dir is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(self._name, dir_fd=self._dir)
                if (st.st_dev, st.st_ino) == self._ours:
                    os.unlink(self._name, dir_fd=self._dir)
            os.close(self._dir)
            self._dir = None

    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        d = self.daemon
        # The daemon's close cancels it with the TCP connections.
        d.track_connection()
        try:
            pid, uid, gid = peer_credentials(writer)
        except OSError:
            writer.close()
            return
        peer = f"unix:pid={pid},uid={uid}"
        if uid not in (os.geteuid(), 0):
            self.refused += 1
            d.counters["connections_refused"] += 1
            log.warning("refused %s", kv(event="refused", peer=peer, errno="EACCES",
                                          reason="another user's process"))
            send_error(writer, 0, RDMAError("EACCES", f"uid {uid} may not use this "
                                                      f"daemon (it serves uid {os.geteuid()})"))
            writer.close()
            return
        # Connections still in their HELLO are bounded as on the TCP port, in a pool of
        # this socket's own: past the bound the oldest is closed, so idle sockets cannot
        # exhaust the daemon's descriptors and stop it accepting.
        d.pre_hello(writer, self._pre_hello)
        try:
            await self._serve(reader, writer, peer, (pid, uid, gid))
        finally:
            d.hello_done(writer, self._pre_hello)

    async def _serve(self, reader, writer, peer: str, cred: tuple[int, int, int]) -> None:
        d = self.daemon
        # Headers unpacked under the same structural limits as on the TCP port.
        decoder = FrameDecoder(d.max_frame, REQUEST_LIMITS)
        # A local user is one credential, and each of its processes a share nested in
        # it (server/shares.py): one program cannot take what its neighbours need.
        credential = f"uid:{cred[1]}/pid:{cred[0]}"
        counted = False
        try:
            challenge, nonce = make_challenge(False)
            writer.writelines(encode_frame(challenge))
            frames = await asyncio.wait_for(read_frames(reader, decoder),
                                            d.limits.hello_timeout)
            if not frames:
                return
            role = verify_hello(frames[0].header, nonce, None, None)
            d.hello_done(writer, self._pre_hello)
            if role != "control":
                raise HandshakeError("EPROTO", f"role {role!r}: the UNIX socket serves "
                                               "control sessions only")
            if d.connections >= d.limits.max_connections:
                d.counters["connections_refused"] += 1
                send_error(writer, 0, RDMAError("EBUSY", "this daemon serves at most "
                                                         f"{d.limits.max_connections} "
                                                         "connections"))
                return
            d.shares.admit(credential)
            d.connections += 1
            counted = True
            writer.writelines(encode_frame({"t": FrameKind.WELCOME, "role": role,
                                            "devices": list(d.hcas),
                                            "max_frame": d.max_frame,
                                            "address": d.address}))
            session = ControlSession(d, reader, writer, decoder, peer, credential)
            session.peer_cred = cred

            def close(e: RDMAError) -> None:
                send_error(writer, 0, e)
                writer.transport.abort()

            watch = Watchdog(decoder, d.limits, close, lambda: not session.verbs.waits, peer)
            try:
                await session.run(frames[1:])
            finally:
                watch.stop()
        except RDMAError as e:      # the HELLO refused, a frame broken before it, a share
            log.warning("refused %s", kv(event="refused", peer=peer, errno=e.errno_name,
                                          reason=e.message))
            send_error(writer, 0, e)
        except asyncio.TimeoutError:
            send_error(writer, 0, RDMAError("ETIMEDOUT", "no hello within "
                                                          f"{d.limits.hello_timeout:g} s"))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            if counted:
                d.connections -= 1
                d.shares.leave(credential)
            with contextlib.suppress(Exception):
                writer.close()
