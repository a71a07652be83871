"""The HELLO exchange that opens every connection (control or wire plane).

The daemon speaks first, so a client learns the protocol version and whether
a token is needed before it says anything::

    daemon -> client  {"t": "challenge", "version": 1, "nonce": <32 bytes>, "auth": bool}
    client -> daemon  {"t": "hello", "version": 1, "role": "control" | "wire",
                       "proof": HMAC-SHA256(token, b"softhca-hello-v1" + nonce + role
                                                   [+ b"\\0" + src]),
                       "src": "HOST:PORT"}       (wire links from a daemon only)

The proof shows knowledge of the shared token without sending it, and binds
the role and this connection's fresh nonce: a hello recorded on another
connection (another nonce) or replayed with another role does not verify.
``proof`` is absent when the client has no token.

A daemon's wire link names, in ``src``, the address its own daemon listens on: the
QPs there are the ones its packets may come from. The proof binds it too, so a hello
cannot be given another daemon's name on the way. A wire hello is checked against the
daemon's peer token (``serve --peer-token-file``; without it a daemon makes one at
start), never the clients' token unless a deployment gives the same one: a client's
token opens no wire link. ``auth`` in the challenge says whether a *control* hello
needs a proof; a wire hello always proves the peer token.

These functions only build and check headers; sending them, and the error
frame plus close on failure, is the caller's business.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from .errors import RDMAError
from .frames import field
from .kinds import FrameKind

__all__ = [
    "NONCE_LEN",
    "PROTOCOL_VERSION",
    "ROLES",
    "HandshakeError",
    "compute_proof",
    "hello_credential",
    "hello_src",
    "make_challenge",
    "make_hello",
    "verify_hello",
]

PROTOCOL_VERSION = 1
ROLES = ("control", "wire")
NONCE_LEN = 32
# Domain separation: a MAC made for this message can never be mistaken for one
# computed with the same token for another purpose (or another protocol version).
_PROOF_CONTEXT = b"softhca-hello-v1"


class HandshakeError(RDMAError):
    """The HELLO exchange failed: ``errno_name`` ("EPROTO", "EACCES", "EINVAL") and a sentence."""


def compute_proof(token: bytes, nonce: bytes, role: str, src: str | None = None) -> bytes:
    """HMAC-SHA256(token, b"softhca-hello-v1" + nonce + role [+ b"\\0" + src])."""
    msg = _PROOF_CONTEXT + nonce + role.encode()
    if src is not None:
        msg += b"\0" + src.encode()
    return hmac.new(token, msg, hashlib.sha256).digest()


def make_challenge(auth: bool) -> tuple[dict, bytes]:
    """The daemon's first frame header and the nonce to keep for verify_hello."""
    nonce = secrets.token_bytes(NONCE_LEN)
    header = {"t": FrameKind.CHALLENGE, "version": PROTOCOL_VERSION, "nonce": nonce, "auth": bool(auth)}
    return header, nonce


def _check_version(version: int, speaker: str) -> None:
    if version != PROTOCOL_VERSION:
        raise HandshakeError("EPROTO", f"protocol version {version}, this {speaker} speaks "
                                       f"{PROTOCOL_VERSION}")


def make_hello(challenge_header: dict, role: str, token: bytes | None,
               src: str | None = None) -> dict:
    """The client's answer to a challenge header; ``src`` is a daemon's own address
    on its wire links.

    Raises HandshakeError: EPROTO if the challenge is malformed or of another
    version, EINVAL for an unknown role, EACCES if the daemon wants a token
    and the client has none (better said here than as a refused hello).
    """
    if challenge_header.get("t") != FrameKind.CHALLENGE:
        raise HandshakeError("EPROTO", f"expected a 'challenge' frame, got "
                                       f"{challenge_header.get('t')!r}")
    _check_version(_field(challenge_header, "version", int), "client")
    nonce = _field(challenge_header, "nonce", bytes, min=NONCE_LEN, max=NONCE_LEN)
    auth = _field(challenge_header, "auth", bool)
    if role not in ROLES:
        raise HandshakeError("EINVAL", f"role {role!r} is not one of {', '.join(ROLES)}")
    hello = {"t": FrameKind.HELLO, "version": PROTOCOL_VERSION, "role": role}
    if src is not None:
        hello["src"] = src
    if token is not None:
        # Sent even when the daemon does not ask: it costs nothing and reveals nothing.
        hello["proof"] = compute_proof(token, nonce, role, src)
    elif auth:
        raise HandshakeError("EACCES", "the daemon requires a token and none was given")
    return hello


_SAME = object()


def verify_hello(header: dict, nonce: bytes, token: bytes | tuple[bytes, ...] | None,
                 peer_token: bytes | None | object = _SAME) -> str:
    """Check a client's hello against this connection's nonce; return its role.

    A control hello is checked against ``token`` (or any of a tuple of tokens, one per
    tenant: ``hello_credential`` says which), a wire hello against ``peer_token`` (by
    default the same). None means that role needs no authentication and any proof is
    ignored. The version is checked first so that a client of another
    version gets the version message, not a complaint about a field it
    spells differently.
    """
    if header.get("t") != FrameKind.HELLO:
        raise HandshakeError("EPROTO", f"expected a 'hello' frame, got {header.get('t')!r}")
    _check_version(_field(header, "version", int), "daemon")
    role = _field(header, "role", str)
    if role not in ROLES:
        raise HandshakeError("EPROTO", f"role {role!r} is not one of {', '.join(ROLES)}")
    if role == "wire" and peer_token is not _SAME:
        token = peer_token
    hello_src(header)       # a malformed src is refused even where no token is checked
    if token is not None:
        proof = header.get("proof")
        if not isinstance(proof, bytes):
            raise HandshakeError("EACCES", "this daemon requires a token: the hello carries "
                                           "no proof")
        # Constant-time: a timing difference would let a peer find the MAC byte by byte.
        if hello_credential(header, nonce, token, role) is None:
            raise HandshakeError("EACCES", f"the hello's proof does not match this daemon's "
                                           f"{'peer ' if role == 'wire' else ''}token and "
                                           "this connection's nonce")
    return role


def hello_credential(header: dict, nonce: bytes, tokens: bytes | tuple[bytes, ...],
                     role: str | None = None) -> int | None:
    """Which of ``tokens`` (one token: index 0) the hello's proof was made with, every
    one compared in constant time; None when none."""
    if isinstance(tokens, bytes):
        tokens = (tokens,)
    proof = header.get("proof")
    if not isinstance(proof, bytes):
        return None
    role = role or header.get("role")
    src = hello_src(header)
    found = None
    for i, tok in enumerate(tokens):
        if hmac.compare_digest(proof, compute_proof(tok, nonce, role, src)) and found is None:
            found = i
    return found


def hello_src(header: dict) -> str | None:
    """A wire hello's ``src``, checked to be HOST:PORT; None when absent."""
    src = header.get("src")
    if src is None:
        return None
    src = _field(header, "src", str, min=3, max=300)
    host, sep, port = src.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise HandshakeError("EPROTO", f"src {src!r} of the hello is not HOST:PORT"[:160])
    return src


def _field(header: dict, name: str, typ: type, **bounds) -> object:
    # frames.field raises FrameError; callers of this module expect HandshakeError only.
    try:
        return field(header, name, typ, **bounds)
    except RDMAError as exc:
        raise HandshakeError(exc.errno_name, exc.message) from None
