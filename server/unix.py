"""The UNIX-socket control listener (``softhca serve --unix PATH``): local programs'
verbs calls, above all the libibverbs provider's (provider/).

Authentication is the kernel's, not a token: the socket file is created owner-only
(mode 0600, under a umask of 0177, so there is no moment when others may connect), and
each connection's SO_PEERCRED must name the daemon's own user or root; any other is
refused with EACCES before its HELLO. The socket's name is never touched after bind (no
chmod; unlinked at close only while it is still this socket): in a directory others may
write, it may be a symlink by then. The HELLO is the TCP one (docs/protocol.md)
without a token; the ``control`` role is served here, and ``memfd`` below. The welcome
also names the daemon's wire address, the one a program's GID carries, and the
session's ``memfd_key``.

Every connection's first frame is read here, with recvmsg, before it becomes a stream
(asyncio's streams read with recv, which drops the fds a message carries): a HELLO of
role ``memfd`` is a provider handing over the memfds of one registration with
``SCM_RIGHTS`` (server/shared_mr.py), filed in the session its key names and answered
at once (a welcome with ``keep``); the connection then takes that session's next memfd
HELLOs, one at a time, each read with recvmsg to its last byte, until a refusal or the
session's end. Any other first frame is a control session's, whose bytes go to its
stream reader as if they had been read there.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import secrets
import socket
import stat
import struct

from ..protocol.control import MAX_PIECES
from ..protocol.errors import RDMAError, einval
from ..protocol.frames import REQUEST_LIMITS, Frame, FrameDecoder, encode_frame
from ..protocol.handshake import HandshakeError, make_challenge, verify_hello
from ..protocol.kinds import FrameKind
from ..protocol.replies import err_frame, frame
from .cq_ring import supported as cq_ring_supported
from .link import READ_CHUNK, read_frames
from .logs import kv, log
from .session import ControlSession, send_error
from .shared_mr import MAX_HANDOFF_CONNS, MemfdInbox, close_all
from .shares import Watchdog

_CRED = struct.Struct("3i")
# The fds one memfd HELLO may carry (one registration's pieces): room for that many and
# no more is given to recvmsg, so more are cut (MSG_CTRUNC, closed by the kernel).
HANDOFF_FDS = MAX_PIECES
_FD_ROOM = socket.CMSG_SPACE(HANDOFF_FDS * array.array("i").itemsize)
KEY_HEX = 64
# A frame's length prefix, and the most a memfd HELLO after a connection's first may be
# (one is about 120 bytes).
_FRAME_LEN = struct.Struct(">I")
HANDOFF_FRAME = 4096


def peer_credentials(sock) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a UNIX stream socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return pid, uid, gid


def _fds_of(ancdata) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def _send_raw(sock: socket.socket, header: dict) -> None:
    """One small frame on a socket that is not a stream yet; a peer that does not read
    it loses it."""
    with contextlib.suppress(OSError):
        sock.send(b"".join(bytes(b) for b in encode_frame(header)))


async def _read_exact(sock: socket.socket, n: int, fds: list[int]
                      ) -> tuple[bytes, bool] | None:
    """``n`` bytes of the stream and no more (None at its end), and whether fds were cut;
    the fds received with them go into ``fds``."""
    data = bytearray()
    cut = False
    while len(data) < n:
        try:
            msg, anc, flags, _ = sock.recvmsg(n - len(data), _FD_ROOM)
        except (BlockingIOError, InterruptedError):
            await _readable(sock)
            continue
        except OSError:
            return None
        fds.extend(_fds_of(anc))
        cut |= bool(flags & socket.MSG_CTRUNC) or len(fds) > HANDOFF_FDS
        if not msg:
            return None
        data += msg
    return bytes(data), cut


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def _err(e: RDMAError) -> dict:
    return err_frame(0, e)


class _Waiting:
    """A connection still in its HELLO as the daemon's pre-HELLO pool holds one: its
    eviction (``transport.abort()``) cancels the task reading its first frame, which
    closes it."""

    def __init__(self, task: asyncio.Task) -> None:
        self.transport = self
        self.evicted = False
        self._task = task

    def abort(self) -> None:
        self.evicted = True
        self._task.cancel()


class UnixListener:
    """Control sessions on a UNIX socket, served by ``daemon`` (server/daemon.py)."""

    def __init__(self, daemon, path: str) -> None:
        self.daemon = daemon
        self.path = path
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Future | None = None
        # The socket's directory (an O_PATH descriptor) and its (st_dev, st_ino).
        self._dir: int | None = None
        self._name = ""
        self._ours: tuple[int, int] | None = None
        self.refused = 0
        # Its connections that have not said HELLO yet, oldest first (Daemon.pre_hello).
        self._pre_hello: dict[_Waiting, None] = {}
        # the sessions' memfd inboxes by key, and the fds all of them hold ([n]: shared)
        self._inboxes: dict[str, MemfdInbox] = {}
        self._pending_fds = [0]

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
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            old = os.umask(0o177)
            try:
                # Bound by its path, the name programs and getpeername(2) see.
                sock.bind(self.path)
            finally:
                os.umask(old)
            # Which file is ours: at close, the name is unlinked only if it still is. A
            # name that is no socket by now was swapped the moment bind made it: the
            # daemon serves on, and never touches that name.
            st = os.lstat(name, dir_fd=self._dir)
            self._name = name
            if stat.S_ISSOCK(st.st_mode):
                self._ours = (st.st_dev, st.st_ino)
            else:
                self._ours = None
                log.warning("socket name replaced %s", kv(event="listen_unix", path=self.path,
                                                          reason="not a socket after bind"))
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except BaseException:
            if sock is not None:
                sock.close()
            os.close(self._dir)
            self._dir = None
            raise
        self._sock = sock
        self._accepting = asyncio.ensure_future(self._accept())
        log.info("listening %s", kv(event="listen_unix", path=self.path,
                                     uid=os.geteuid()))

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
            self._accepting = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._dir is not None:
            with contextlib.suppress(OSError):
                st = os.lstat(self._name, dir_fd=self._dir)
                if (st.st_dev, st.st_ino) == self._ours:
                    os.unlink(self._name, dir_fd=self._dir)
            os.close(self._dir)
            self._dir = None

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as e:    # EMFILE and the like: said, and tried again soon
                log.warning("accept failed %s", kv(event="accept_unix", errno=e.errno,
                                                    reason=e.strerror))
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            asyncio.ensure_future(self._on_connection(conn))

    async def _first_frame(self, conn: socket.socket, fds: list[int]
                           ) -> tuple[bytes, Frame | None, bool]:
        """The bytes read up to the end of the first frame (or the end of the stream, or
        a frame the decoder refuses: the stream reader meets it again), that frame, and
        whether fds were cut; the fds received go into ``fds``."""
        dec = FrameDecoder(self.daemon.max_frame, REQUEST_LIMITS)
        data = bytearray()
        cut = False
        while True:
            try:
                msg, anc, flags, _ = conn.recvmsg(READ_CHUNK, _FD_ROOM)
            except (BlockingIOError, InterruptedError):
                await _readable(conn)
                continue
            fds.extend(_fds_of(anc))
            cut |= bool(flags & socket.MSG_CTRUNC) or len(fds) > HANDOFF_FDS
            if not msg or cut:
                return bytes(data), None, cut
            data += msg
            try:
                frames = dec.feed(msg)
            except RDMAError:
                return bytes(data), None, cut
            if frames:
                return bytes(data), frames[0], cut

    async def _on_connection(self, conn: socket.socket) -> None:
        d = self.daemon
        # The daemon's close cancels it with the TCP connections.
        d.track_connection()
        fds: list[int] = []
        try:
            try:
                pid, uid, gid = peer_credentials(conn)
            except OSError:
                return
            peer = f"unix:pid={pid},uid={uid}"
            if uid not in (os.geteuid(), 0):
                self.refused += 1
                d.counters["connections_refused"] += 1
                log.warning("refused %s", kv(event="refused", peer=peer, errno="EACCES",
                                              reason="another user's process"))
                _send_raw(conn, _err(RDMAError("EACCES", f"uid {uid} may not use this daemon "
                                                         f"(it serves uid {os.geteuid()})")))
                return
            challenge, nonce = make_challenge(False)
            # Connections still in their HELLO are bounded as on the TCP port, in a pool
            # of this socket's own: past the bound the oldest is closed, so idle sockets
            # cannot exhaust the daemon's descriptors and stop it accepting.
            waiting = _Waiting(asyncio.current_task())
            d.pre_hello(waiting, self._pre_hello)
            try:
                await asyncio.get_running_loop().sock_sendall(
                    conn, b"".join(bytes(b) for b in encode_frame(challenge)))
                data, first, cut = await asyncio.wait_for(self._first_frame(conn, fds),
                                                          d.limits.hello_timeout)
            except asyncio.TimeoutError:
                _send_raw(conn, _err(RDMAError("ETIMEDOUT", "no hello within "
                                                             f"{d.limits.hello_timeout:g} s")))
                return
            except OSError:
                return
            except asyncio.CancelledError:
                if waiting.evicted:     # made room for a newer connection: closed below
                    return
                raise
            finally:
                d.hello_done(waiting, self._pre_hello)
            if cut or (first is not None and first.header.get("t") == FrameKind.HELLO
                       and first.header.get("role") == "memfd"):
                await self._handoffs(conn, data, first.header if first else {}, fds, cut,
                                     peer, uid)
                return
            close_all(fds)
            fds = []
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=READ_CHUNK)
            if data:
                reader.feed_data(data)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.create_unix_connection(lambda: protocol, sock=conn)
            conn = None
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._serve(reader, writer, peer, (pid, uid, gid), nonce)
        finally:
            close_all(fds)
            if conn is not None:
                conn.close()

    async def _handoffs(self, conn: socket.socket, data: bytes, hello: dict,
                        fds: list[int], cut: bool, peer: str, uid: int) -> None:
        """A memfd connection: its first HELLO, then, while each is filed, the next ones
        on the same connection (the provider keeps one per device context), each read
        to its frame's last byte and no further, so that the fds read with its bytes
        are its own. It is bound to the session the first key names, which ends it;
        any refusal, and a frame that is not a memfd HELLO, end it too."""
        inbox = None
        # bytes past the first HELLO: a peer that did not wait for the answer, whose
        # connection ends with it
        keep = (len(data) >= _FRAME_LEN.size
                and len(data) == _FRAME_LEN.size + _FRAME_LEN.unpack_from(data)[0])
        try:
            while True:
                inbox = self._handoff(conn, hello, fds, cut, peer, uid, inbox)
                if inbox is None or not keep:
                    return
                hello, cut = await self._next_handoff(conn, fds)
                if hello is None:
                    return
        finally:
            if inbox is not None:
                inbox.handoffs.discard(conn)

    async def _next_handoff(self, conn: socket.socket, fds: list[int]
                            ) -> tuple[dict | None, bool]:
        """The next frame of a memfd connection, if it is a memfd HELLO (else None:
        the end of it), and whether fds were cut; the fds received go into ``fds``."""
        got = await _read_exact(conn, _FRAME_LEN.size, fds)
        if got is None:
            return None, False
        head, cut = got
        (length,) = _FRAME_LEN.unpack(head)
        if length > HANDOFF_FRAME:
            return None, cut
        got = await _read_exact(conn, length, fds)
        if got is None:
            return None, cut
        body, more = got
        try:
            frames = FrameDecoder(HANDOFF_FRAME, REQUEST_LIMITS).feed(head + body)
        except RDMAError:
            return None, cut
        if len(frames) != 1:
            return None, cut
        header = frames[0].header
        if header.get("t") != FrameKind.HELLO or header.get("role") != "memfd":
            return None, cut
        return header, cut or more

    def _handoff(self, conn: socket.socket, hello: dict, fds: list[int], cut: bool,
                 peer: str, uid: int, bound: MemfdInbox | None) -> MemfdInbox | None:
        """A memfd HELLO: its fds filed in the session its key names (``bound``'s, after
        the connection's first), or closed; the answer is a welcome naming how many
        were filed, or an err. The session's inbox when filed, else None."""
        try:
            if cut:
                raise einval(f"memfd handoff: at most {HANDOFF_FDS} fds per hello")
            if hello.get("version") != 1:
                raise RDMAError("EPROTO", f"memfd hello of version {hello.get('version')!r}, "
                                          "this daemon speaks 1")
            if not fds:
                raise einval("memfd handoff: the hello carries no fds (SCM_RIGHTS)")
            key, seq = hello.get("key"), hello.get("seq")
            if not (isinstance(key, str) and len(key) == KEY_HEX):
                raise RDMAError("EPROTO", f"memfd hello: key must be {KEY_HEX} hex digits")
            if not (isinstance(seq, int) and not isinstance(seq, bool)
                    and 0 <= seq < 1 << 32):
                raise RDMAError("EPROTO", "memfd hello: seq must be an unsigned 32-bit int")
            inbox = self._inboxes.get(key)
            if inbox is None or inbox.uid != uid or (bound is not None and inbox is not bound):
                raise RDMAError("EACCES", "memfd handoff: the key names no session of this "
                                          "process's user on this daemon"
                                + (", or another session than the connection's first"
                                   if bound is not None else ""))
            if bound is None and len(inbox.handoffs) >= MAX_HANDOFF_CONNS:
                raise RDMAError("EBUSY", f"memfd handoff: a session keeps at most "
                                         f"{MAX_HANDOFF_CONNS} memfd connections open")
            inbox.file(seq, list(fds))
            n = len(fds)
            fds.clear()                     # the inbox's now
            inbox.handoffs.add(conn)
            # keep: the connection takes the session's next handoffs too
            _send_raw(conn, frame("welcome", role="memfd", fds=n, keep=1))
            return inbox
        except RDMAError as e:
            log.warning("refused %s", kv(event="memfd_refused", peer=peer,
                                          errno=e.errno_name, reason=e.message))
            _send_raw(conn, _err(e))
            return None

    async def _serve(self, reader, writer, peer: str, cred: tuple[int, int, int],
                     nonce: bytes) -> None:
        d = self.daemon
        # Headers unpacked under the same structural limits as on the TCP port.
        decoder = FrameDecoder(d.max_frame, REQUEST_LIMITS)
        # A local user is one credential, and each of its processes a share nested in
        # it (server/shares.py): one program cannot take what its neighbours need.
        credential = f"uid:{cred[1]}/pid:{cred[0]}"
        counted = False
        inbox = None
        try:
            frames = await asyncio.wait_for(read_frames(reader, decoder),
                                            d.limits.hello_timeout)
            if not frames:
                return
            role = verify_hello(frames[0].header, nonce, None, None)
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
            # what this session's process proves when it hands over memfds
            inbox = MemfdInbox(secrets.token_hex(KEY_HEX // 2), self._pending_fds, cred[1])
            self._inboxes[inbox.key] = inbox
            writer.writelines(encode_frame(frame("welcome", role=role,
                                                 devices=list(d.hcas),
                                                 max_frame=d.max_frame,
                                                 address=d.address,
                                                 memfd_key=inbox.key,
                                                 # SysV segments named by shmid are
                                                 # attached here (server/shared_mr.py)
                                                 sysv_attach=1,
                                                 # CQs' completion rings are taken
                                                 # (server/cq_ring.py)
                                                 cq_ring=int(cq_ring_supported()),
                                                 # and QPs' send and receive rings
                                                 # (server/wq_ring.py)
                                                 wq_ring=int(cq_ring_supported()))))
            session = ControlSession(d, reader, writer, decoder, peer, credential)
            session.peer_cred = cred
            session.memfds = inbox

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
            if inbox is not None:
                del self._inboxes[inbox.key]
                inbox.close()
            if counted:
                d.connections -= 1
                d.shares.leave(credential)
            with contextlib.suppress(Exception):
                writer.close()
