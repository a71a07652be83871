"""The synchronous bridge: pyverbs' blocking calls over the async client (softhca.client).

One event loop runs in a background thread of the process; every pyverbs call hands its
coroutine to that loop and waits for the result, as a C verb waits for its system call.
Each ``Context`` is one control session with the daemon (as each ibv_open_device is one
file descriptor): closing it destroys what it created, and two contexts of one device
are two sessions whose QPs connect to each other through the daemon.

The daemon is ``SOFTHCA_TARGET`` (``host:port``, with the token of ``SOFTHCA_TOKEN_FILE``
when it requires one); without it, an embedded daemon hosting ``mlx5_0`` starts in the
same background thread the first time a device is needed, once however many threads
ask at the same time.

A call waits for its coroutine as a blocking system call waits: Ctrl-C (KeyboardInterrupt)
or the call's timeout (``SOFTHCA_CALL_TIMEOUT`` seconds, unset: none) cancels the
coroutine on the loop before the exception reaches the caller. A call made on the loop's
own thread (a callback of the loop) would wait for itself: it is refused (EDEADLK). Once
the interpreter is exiting and the loop has stopped, calls are refused (EIO) and their
coroutines closed unrun, never left "never awaited".

fork(2) copies only the calling thread. A child starts the bridge afresh (its own loop,
thread and locks, at its first call) and opens its own contexts, which work as any: the
daemon's address is still good (the parent's embedded daemon goes on serving in the
parent, reached over TCP as before). What the parent opened is the parent's, as a verbs
object of a parent is not usable in a child of rdma-core without fork support: a call on
it raises EIO (client/connection.py refuses an inherited session before its socket is
touched), closing it or collecting it only forgets the child's copy, and the child's
exit leaves the parent's sessions, loop and embedded daemon alone. In-process MRs
(``MR(..., address=)``) need the embedded daemon in this very process: a child has none.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno as _errno
import os
import secrets
import threading
from typing import Any

from ...protocol.errors import RDMAError
from .. import api
from ..token_file import TokenFileError, read_token
from .pyverbs_error import PyverbsRDMAError

TARGET_ENV = "SOFTHCA_TARGET"
TOKEN_ENV = "SOFTHCA_TOKEN_FILE"
TIMEOUT_ENV = "SOFTHCA_CALL_TIMEOUT"
EMBEDDED_DEVICES = ("mlx5_0",)

_lock = threading.Lock()
# Held while the daemon's address is found (and the embedded daemon started): the
# first callers of many threads wait for one start, not one each.
_target_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_thread: threading.Thread | None = None
# Set once the loop has stopped at interpreter exit: no call may be handed to it.
_stopped = False
_embedded: Any = None           # the embedded daemon, when there is no SOFTHCA_TARGET
_address: str | None = None
_token: bytes | None = None
_sessions: set = set()
# What a fork child inherited from its parent (loop, embedded daemon, sessions): kept
# referenced and never touched. Collecting them would run their finalizers, which
# close sockets and unregister them from an epoll instance the parent shares.
_inherited: list = []


def _after_fork_in_child() -> None:
    """The child of fork(2): the parent's loop has no thread here and its locks may have
    been copied held. Start over, keeping the daemon's address (the parent's embedded
    daemon, or SOFTHCA_TARGET, answers the child over TCP as it answered the parent)."""
    global _lock, _target_lock, _loop, _loop_thread, _stopped, _embedded, _sessions
    _inherited.append((_loop, _loop_thread, _embedded, _sessions))
    _lock, _target_lock = threading.Lock(), threading.Lock()
    _loop = _loop_thread = _embedded = None
    _stopped = False
    _sessions = set()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_thread
    if _stopped:
        raise PyverbsRDMAError("softhca's pyverbs event loop has stopped: the interpreter "
                               "is exiting", _errno.EIO)
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="softhca-pyverbs", daemon=True)
            t.start()
            _loop, _loop_thread = loop, t
        return _loop


def inherited(node: api.Node) -> bool:
    """True in a fork child for a session its parent opened (no system call)."""
    return node._conn.inherited


def refuse_inherited(node: api.Node, what: str) -> None:
    """EIO for a fork child's call on its parent's session that would not reach the
    connection (and so its check): a wait for events, completions already received."""
    if node._conn.inherited:
        raise PyverbsRDMAError(f"{what}: {node._conn.inherited_error().message}", _errno.EIO)


def errno_of(e: RDMAError) -> int:
    return getattr(_errno, e.errno_name, _errno.EIO)


def call_timeout() -> float | None:
    """``SOFTHCA_CALL_TIMEOUT`` in seconds; None (wait as long as it takes) when unset."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else None
    except ValueError:
        raise PyverbsRDMAError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds",
                               _errno.EINVAL) from None
    return value if value is None or value > 0 else None


def run(coro, what: str | None = None, timeout: float | None = None):
    """Run ``coro`` on the bridge's loop and return its result; a daemon error becomes
    PyverbsRDMAError carrying the errno, its message prefixed with ``what`` (pyverbs'
    own "Failed to ..." sentence) when given. ``timeout`` (default ``call_timeout()``):
    past it the coroutine is cancelled and ETIMEDOUT raised; Ctrl-C cancels it too."""
    try:
        loop = _start_loop()
        if threading.current_thread() is _loop_thread:
            raise PyverbsRDMAError(
                "a softhca pyverbs call was made on softhca's own event loop thread (from "
                "a callback of that loop): it would wait for itself forever; make the "
                "call from another thread, or await the softhca.client coroutine there",
                _errno.EDEADLK)
        if timeout is None:
            timeout = call_timeout()
    except PyverbsRDMAError:
        coro.close()
        raise
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except RDMAError as e:
        msg = f"{what}: {e.message}" if what else e.message
        raise PyverbsRDMAError(msg, errno_of(e)) from None
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise PyverbsRDMAError(f"{what + ': ' if what else ''}no answer within {timeout:g} s "
                               f"({TIMEOUT_ENV}); the call was cancelled",
                               _errno.ETIMEDOUT) from None
    except BaseException:
        # KeyboardInterrupt (Ctrl-C) and the like: the coroutine must not run on.
        fut.cancel()
        raise


def target() -> tuple[str, bytes | None]:
    """The daemon's address and token, starting the embedded daemon when needed."""
    global _address, _token, _embedded
    if _address is not None:
        return _address, _token
    with _target_lock:
        # Held while the embedded daemon starts: the threads that asked at the same
        # time find its address here once it is up.
        if _address is not None:
            return _address, _token
        env = os.environ.get(TARGET_ENV)
        if env:
            try:
                token = read_token(os.environ.get(TOKEN_ENV))
            except TokenFileError as e:
                raise PyverbsRDMAError(f"{TOKEN_ENV}: {e}", _errno.EACCES) from None
            _token, _address = token, env
            return env, token
        daemon = run(_start_embedded())
        _embedded, _token, _address = daemon, None, daemon.address
        return _address, None


async def _start_embedded():
    from ...server.crypto_config import crypto_config_from_env
    from ...server.daemon import Daemon

    try:
        crypto = crypto_config_from_env()       # SOFTHCA_CRYPTO_CONFIG, else plaintext
    except ValueError as e:
        raise RDMAError("EINVAL", str(e)) from None
    daemon = Daemon(EMBEDDED_DEVICES, "127.0.0.1", 0, None, crypto=crypto)
    # The in-process proof for MR(..., address=) (server/process_mr.py).
    daemon.process_secret = secrets.token_bytes(32)
    await daemon.start()
    return daemon


def process_secret() -> bytes | None:
    """The embedded daemon's proof that a session runs in its process, when the
    sessions go to it (no SOFTHCA_TARGET); None otherwise, and in a fork child (the
    daemon runs in the parent, whose memory is not the child's)."""
    return getattr(_embedded, "process_secret", None) if _address is not None else None


def open_session() -> api.Node:
    address, token = target()
    node = run(api.connect(address, token), f"Failed to reach the softhca daemon at {address}")
    _sessions.add(node)
    return node


def close_session(node: api.Node, wait: bool = True) -> None:
    """End a control session; ``wait=False`` from a finalizer, which may run on any
    thread (the loop's own included) and must not block."""
    _sessions.discard(node)
    loop = _loop
    if loop is None or loop.is_closed() or _stopped or inherited(node):
        return      # (no coroutine made: none is left unawaited; the parent's stays open)
    try:
        fut = asyncio.run_coroutine_threadsafe(node.close(), loop)
        if wait:
            fut.result(5)
    except Exception:       # noqa: BLE001 - the session is gone either way
        pass


@atexit.register
def _shutdown() -> None:
    """At exit, as a process's device files close: end the sessions still open, then the
    embedded daemon, then the loop."""
    loop = _loop
    if loop is None or loop.is_closed() or not loop.is_running():
        return      # (a fork child's loop is its own: the parent's sessions are not in it)

    async def close_all() -> None:
        for node in list(_sessions):
            with contextlib.suppress(Exception):
                await node.close()
        _sessions.clear()
        if _embedded is not None:
            with contextlib.suppress(Exception):
                await _embedded.close()

    global _stopped
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(10)
    # From here on, finalizers that run later (objects still alive at exit) make no
    # coroutine for a loop that will not run it.
    _stopped = True
    loop.call_soon_threadsafe(loop.stop)


def device_guids() -> list[tuple[str, int]]:
    """(name, node GUID) of each device of the daemon, as it reports them."""

    async def query(node: api.Node) -> list[tuple[str, int]]:
        out = []
        for name in node.devices:
            ctx = await node.open_device(name)
            out.append((name, (await ctx.query_device()).get("node_guid", 0)))
            await ctx.close()
        return out

    node = open_session()
    try:
        return run(query(node), "Failed to get the device list")
    finally:
        close_session(node)


def device_names(address: str | None = None) -> list[str]:
    """The devices of the daemon (of ``address``, when another daemon is named)."""
    if address is None:
        node = open_session()
    else:
        node = run(api.connect(address, target()[1]), f"Failed to reach the softhca daemon "
                                                      f"at {address}")
    try:
        return list(node.devices)
    finally:
        close_session(node)
