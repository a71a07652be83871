"""protocol.frames (the frame codec) and protocol.handshake (HELLO).

The decoder's contract is checked against a hand-built reference encoding
(struct + msgpack.packb) as well as against encode_frame, so a symmetric bug
in both halves of the codec would still show.
"""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softhca.protocol.frames import (
    Frame,
    FrameDecoder,
    FrameError,
    encode_frame,
    field,
    frame_bytes,
)
from softhca.protocol.handshake import (
    PROTOCOL_VERSION,
    HandshakeError,
    compute_proof,
    make_challenge,
    make_hello,
    verify_hello,
)

EVERY_TYPE = {
    "t": "write",
    "nil": None,
    "yes": True,
    "no": False,
    "small": 7,
    "neg": -(2**63),
    "big": 2**64 - 1,
    "float": 1.5,
    "str": "héllo",
    "bytes": b"\x00\xff",
    "list": [1, "a", b"b", None, [2.5, {"k": False}]],
    "map": {"inner": {"x": [1, 2]}, "b": b""},
}


def raw_frame(header_bytes: bytes, payload: bytes = b"", *, length: int | None = None,
              hlen: int | None = None) -> bytes:
    """A frame built by hand, so malformed ones can be made on purpose."""
    hlen = len(header_bytes) if hlen is None else hlen
    length = 4 + len(header_bytes) + len(payload) if length is None else length
    return struct.pack(">II", length, hlen) + header_bytes + payload


def decode_all(data: bytes, chunks=None, **kw) -> list[Frame]:
    dec = FrameDecoder(**kw)
    if chunks is None:
        return dec.feed(data)
    out = []
    pos = 0
    for size in chunks:
        out += dec.feed(data[pos:pos + size])
        pos += size
    out += dec.feed(data[pos:])
    assert dec.buffered == 0
    return out


def expect_error(errno_name: str, data: bytes, **kw) -> FrameError:
    with pytest.raises(FrameError) as info:
        FrameDecoder(**kw).feed(data)
    assert info.value.errno_name == errno_name
    return info.value


# --- round trips --------------------------------------------------------------

def test_empty_payload_round_trip():
    data = frame_bytes({"t": "ping"})
    assert data == raw_frame(msgpack.packb({"t": "ping"}))
    (frame,) = FrameDecoder().feed(data)
    assert frame.kind == "ping"
    assert frame.header == {"t": "ping"}
    assert isinstance(frame.payload, memoryview) and frame.payload.nbytes == 0


def test_big_payload_round_trip_without_copy_on_encode():
    payload = bytes(range(256)) * 40000  # ~10 MiB
    bufs = encode_frame({"t": "write", "psn": 5}, payload)
    assert bufs[-1].obj is payload  # the payload buffer is the caller's, not a copy
    (frame,) = FrameDecoder().feed(b"".join(bufs))
    assert frame.header == {"t": "write", "psn": 5}
    assert frame.payload == payload


def test_every_allowed_type_round_trips():
    (frame,) = FrameDecoder().feed(frame_bytes(EVERY_TYPE, b"data"))
    assert frame.header == EVERY_TYPE
    assert type(frame.header["bytes"]) is bytes and type(frame.header["str"]) is str
    assert bytes(frame.payload) == b"data"


def test_memoryview_and_bytearray_payloads_count_bytes():
    words = memoryview(bytearray(16)).cast("I")  # 4 items, 16 bytes
    (frame,) = FrameDecoder().feed(frame_bytes({"t": "x"}, words))
    assert frame.payload.nbytes == 16


def test_several_frames_in_one_feed():
    data = b"".join(frame_bytes({"t": "p", "n": i}, bytes([i]) * i) for i in range(50))
    frames = FrameDecoder().feed(data)
    assert [f.header["n"] for f in frames] == list(range(50))
    assert [bytes(f.payload) for f in frames] == [bytes([i]) * i for i in range(50)]


def test_encoder_refuses_what_the_decoder_would():
    with pytest.raises(FrameError, match="'t'"):
        encode_frame({"kind": "x"})
    with pytest.raises(FrameError, match="ExtType"):
        encode_frame({"t": "x", "e": msgpack.ExtType(1, b"z")})


# --- incremental feeding -----------------------------------------------------

STREAM = b"".join([
    frame_bytes({"t": "a"}),
    frame_bytes(EVERY_TYPE, b"x" * 300),
    frame_bytes({"t": "c", "n": 3}, bytes(range(256))),
])


def test_byte_by_byte_gives_the_same_frames():
    assert decode_all(STREAM, chunks=[1] * len(STREAM)) == decode_all(STREAM)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), max_size=40))
def test_random_chunks_give_the_same_frames(chunks):
    assert decode_all(STREAM, chunks=chunks) == decode_all(STREAM)


def test_truncated_frame_waits():
    dec = FrameDecoder()
    data = frame_bytes({"t": "x"}, b"payload")
    for cut in range(len(data)):  # every proper prefix, fed to a fresh decoder
        assert FrameDecoder().feed(data[:cut]) == []
    assert dec.feed(data[:-1]) == []
    assert dec.buffered == len(data) - 1
    (frame,) = dec.feed(data[-1:])
    assert bytes(frame.payload) == b"payload"


# --- refusals ----------------------------------------------------------------

def test_too_big_prefix_refused_before_the_body_arrives():
    err = expect_error("EMSGSIZE", struct.pack(">I", 1025), max_frame=1024)
    assert "1025" in err.message and "1024" in err.message
    expect_error("EMSGSIZE", struct.pack(">I", 0xFFFFFFFF))  # default 16 MiB limit
    # Exactly max_frame is fine.
    data = frame_bytes({"t": "x"}, b"p" * 100)
    assert len(decode_all(data, max_frame=len(data) - 4)) == 1


def test_length_too_short_for_header_length():
    expect_error("EPROTO", struct.pack(">I", 3) + b"abc")


def test_header_length_beyond_frame_refused():
    hdr = msgpack.packb({"t": "x"})
    expect_error("EPROTO", raw_frame(hdr, hlen=len(hdr) + 1))
    expect_error("EPROTO", raw_frame(hdr, length=4 + len(hdr) - 1, hlen=len(hdr))[:-1])


@pytest.mark.parametrize("header_bytes", [
    b"",  # empty header
    b"\xc1",  # the reserved, never-used msgpack byte
    b"\x82\xa1t",  # truncated map
    msgpack.packb({"t": "x"}) + b"\x00",  # trailing garbage inside H
    b"\xdd\xff\xff\xff\xff",  # array32 announcing 4 G elements: limit, not allocation
    b"\x81\x91\x00\x00",  # {[0]: 0}: non-str key
    b"\x81\x01\x00",  # {1: 0}: int key
], ids=["empty", "reserved", "truncated", "trailing", "huge-array", "list-key", "int-key"])
def test_bad_msgpack_refused(header_bytes):
    expect_error("EPROTO", raw_frame(header_bytes))


@pytest.mark.parametrize("header", [[1, 2], "t", 5, None])
def test_header_not_a_map_refused(header):
    err = expect_error("EPROTO", raw_frame(msgpack.packb(header)))
    assert "map" in err.message


@pytest.mark.parametrize("header", [{}, {"kind": "x"}, {"t": 1}, {"t": b"x"}, {"t": None}])
def test_header_without_str_t_refused(header):
    err = expect_error("EPROTO", raw_frame(msgpack.packb(header, use_bin_type=True)))
    assert "'t'" in err.message


@pytest.mark.parametrize("ext", [
    msgpack.ExtType(5, b"abc"),
    msgpack.ExtType(5, b""),  # zero-length ext slips past max_ext_len=0
    msgpack.Timestamp(1, 0),  # ext type -1, decoded specially by msgpack
], ids=["ext", "empty-ext", "timestamp"])
def test_ext_types_refused(ext):
    hdr = msgpack.packb({"t": "x", "nested": [{"v": ext}]})
    expect_error("EPROTO", raw_frame(hdr))


def test_deep_nesting_refused_as_frame_error():
    hdr = b"\x82\xa1t\xa1x\xa1d" + b"\x91" * 5000 + b"\xc0"
    expect_error("EPROTO", raw_frame(hdr))


def test_poisoned_after_error():
    dec = FrameDecoder(max_frame=64)
    with pytest.raises(FrameError):
        dec.feed(struct.pack(">I", 65))
    for _ in range(2):
        with pytest.raises(FrameError) as info:
            dec.feed(frame_bytes({"t": "fine"}))
        assert info.value.errno_name == "EMSGSIZE"
        assert "earlier error" in info.value.message


def test_error_carries_errno_number():
    import errno
    err = expect_error("EPROTO", raw_frame(b"\xc1"))
    assert err.errno == errno.EPROTO
    assert str(err).startswith("EPROTO: ")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(1, 64), max_size=10))
def test_random_bytes_raise_only_frame_error(data, chunks):
    dec = FrameDecoder(max_frame=4096)
    pos = 0
    try:
        for size in [*chunks, len(data)]:
            for frame in dec.feed(data[pos:pos + size]):
                assert isinstance(frame.kind, str)
            pos += size
    except FrameError as exc:
        assert exc.errno_name in ("EPROTO", "EMSGSIZE")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_headers_raise_only_frame_error(header_bytes):
    # Random bytes rarely get past the length checks; this aims them at msgpack.
    try:
        FrameDecoder().feed(raw_frame(header_bytes, b"pl"))
    except FrameError as exc:
        assert exc.errno_name == "EPROTO"


# --- field() -------------------------------------------------------------------

def test_field():
    hdr = {"t": "read", "qpn": 7, "flag": True, "data": b"abc", "ratio": 0.5}
    assert field(hdr, "qpn", int, min=0, max=2**24 - 1) == 7
    assert field(hdr, "data", bytes, min=3, max=3) == b"abc"
    assert field(hdr, "ratio", (int, float), min=0, max=1) == 0.5
    assert field(hdr, "flag", bool) is True
    assert field(hdr, "absent", int, required=False) is None
    with pytest.raises(FrameError, match=r"field 'qpn' of 'read' must be int in \[8, 9\]"):
        field(hdr, "qpn", int, min=8, max=9)
    with pytest.raises(FrameError, match="field 'absent' of 'read' is missing"):
        field(hdr, "absent", int)
    with pytest.raises(FrameError, match="must be int"):
        field(hdr, "flag", int)  # bool is not an int on the wire
    with pytest.raises(FrameError, match=r"must be bytes of length in \[4, inf\]"):
        field(hdr, "data", bytes, min=4)
    with pytest.raises(FrameError) as info:
        field(hdr, "data", str)
    assert info.value.errno_name == "EPROTO"


# --- handshake -----------------------------------------------------------------

TOKEN = b"shared secret"


def hello_through_the_wire(header: dict) -> dict:
    """Headers go through a real frame, as they will in the daemon."""
    (frame,) = FrameDecoder().feed(frame_bytes(header))
    return frame.header


def handshake_error(header, nonce, token) -> HandshakeError:
    with pytest.raises(HandshakeError) as info:
        verify_hello(header, nonce, token)
    return info.value


@pytest.mark.parametrize("role", ["control", "wire"])
def test_correct_proof_accepted(role):
    challenge, nonce = make_challenge(auth=True)
    assert challenge == {"t": "challenge", "version": PROTOCOL_VERSION, "nonce": nonce,
                         "auth": True}
    assert len(nonce) == 32
    hello = make_hello(hello_through_the_wire(challenge), role, TOKEN)
    assert hello["proof"] == compute_proof(TOKEN, nonce, role)
    assert verify_hello(hello_through_the_wire(hello), nonce, TOKEN) == role


def test_no_auth_accepts_hello_without_proof():
    challenge, nonce = make_challenge(auth=False)
    hello = make_hello(challenge, "control", None)
    assert "proof" not in hello
    assert verify_hello(hello, nonce, None) == "control"


def test_nonces_differ():
    assert make_challenge(True)[1] != make_challenge(True)[1]


def test_wrong_token_refused():
    challenge, nonce = make_challenge(auth=True)
    hello = make_hello(challenge, "control", b"other secret")
    assert handshake_error(hello, nonce, TOKEN).errno_name == "EACCES"


def test_missing_proof_refused():
    challenge, nonce = make_challenge(auth=True)
    hello = {"t": "hello", "version": 1, "role": "control"}
    err = handshake_error(hello, nonce, TOKEN)
    assert err.errno_name == "EACCES" and "no proof" in err.message
    hello["proof"] = "not bytes"
    assert handshake_error(hello, nonce, TOKEN).errno_name == "EACCES"


def test_client_without_token_refused_early():
    challenge, _ = make_challenge(auth=True)
    with pytest.raises(HandshakeError) as info:
        make_hello(challenge, "control", None)
    assert info.value.errno_name == "EACCES"


def test_replayed_hello_refused():
    old_challenge, _ = make_challenge(auth=True)
    recorded = make_hello(old_challenge, "control", TOKEN)
    _, new_nonce = make_challenge(auth=True)
    assert handshake_error(recorded, new_nonce, TOKEN).errno_name == "EACCES"


def test_proof_binds_the_role():
    challenge, nonce = make_challenge(auth=True)
    hello = make_hello(challenge, "wire", TOKEN)
    hello["role"] = "control"
    assert handshake_error(hello, nonce, TOKEN).errno_name == "EACCES"


@pytest.mark.parametrize("version", [0, 2, 99])
def test_wrong_version_refused(version):
    challenge, nonce = make_challenge(auth=True)
    hello = make_hello(challenge, "control", TOKEN)
    hello["version"] = version
    err = handshake_error(hello, nonce, TOKEN)
    assert err.errno_name == "EPROTO"
    assert err.message == f"protocol version {version}, this daemon speaks 1"


def test_client_refuses_challenge_of_another_version():
    challenge, _ = make_challenge(auth=False)
    challenge["version"] = 2
    with pytest.raises(HandshakeError) as info:
        make_hello(challenge, "control", None)
    assert info.value.errno_name == "EPROTO" and "version 2" in info.value.message


@pytest.mark.parametrize("hello", [
    {"t": "hello", "version": 1, "role": "admin"},
    {"t": "hello", "version": 1, "role": 1},
    {"t": "hello", "version": 1},
    {"t": "hello", "version": True, "role": "control"},
    {"t": "hello", "role": "control"},
    {"t": "request", "version": 1, "role": "control"},
], ids=["unknown-role", "int-role", "no-role", "bool-version", "no-version", "not-hello"])
def test_bad_hello_refused_as_eproto(hello):
    _, nonce = make_challenge(auth=False)
    assert handshake_error(hello, nonce, None).errno_name == "EPROTO"


def test_make_hello_refuses_unknown_role():
    challenge, _ = make_challenge(auth=False)
    with pytest.raises(HandshakeError) as info:
        make_hello(challenge, "admin", None)
    assert info.value.errno_name == "EINVAL"


def test_a_payload_never_aliases_a_buffer_that_changes():
    """Payloads are views, not copies, of what the decoder was fed; so a mutable buffer
    is copied once on the way in, a frame completed across two feeds lives in a buffer
    the decoder hands over, and every payload is read-only."""
    data = bytearray(frame_bytes({"t": "x"}, b"payload!") * 2)
    dec = FrameDecoder()
    cut = len(data) // 2 + 3
    first = dec.feed(memoryview(data)[:cut])       # a view of the caller's buffer
    (whole,) = first
    rest = dec.feed(bytes(data[cut:]))
    data[:] = b"\xff" * len(data)                   # the caller reuses its buffer
    (again,) = dec.feed(frame_bytes({"t": "y"}, b"third"))
    for frame, want in ((whole, b"payload!"), (rest[0], b"payload!"), (again, b"third")):
        assert bytes(frame.payload) == want
        assert frame.payload.readonly
