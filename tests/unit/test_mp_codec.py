"""provider/mp.c, the provider's msgpack codec in C, against Python's msgpack.

``provider/build/mpcheck`` (provider/tests/mpcheck.c, built here with ``make -C provider``,
with AddressSanitizer and UBSan; no libibverbs, no root) encodes what it is told with
mp.c and reads what it is given with mp.c's reader. Both ways are judged from this side:

- mp.c encodes a value at and around every size boundary of every msgpack family
  (positive fixint, uint 8/16/32/64, negative fixint and the ints below it, fixstr and
  str 8/16/32, bin 8/16/32, fixarray and array 16/32, fixmap and map 16/32, nil, bool);
  Python's msgpack decodes it to the value this test built, and the first byte is the
  format the msgpack specification gives that size (computed here from the spec's
  ranges, not taken from either codec).
- Python's msgpack encodes values of every family; mp.c's reader renders them as this
  test renders its own values (mpcheck.c names the rendering), each key of a map of up
  to 256 entries also found by ``mp_find``.
- Every proper prefix of each encoding, and bytes that are not msgpack the daemon takes
  (ext types, 0xc1, counts larger than the bytes, nesting past the reader's limit), are
  refused ("bad") without a read past the buffer (the sanitizers would end the run).
"""

from __future__ import annotations

import msgpack
import native
import pytest


@pytest.fixture(scope="module")
def mp():
    """A function: lines of commands in, lines of answers out (one mpcheck run)."""
    return native.line_tool("mpcheck")


# -- the spec's formats (msgpack spec, "Formats"): the first byte for a size -----------------

def uint_format(n: int) -> int:
    if n <= 0x7F:
        return n                    # positive fixint
    for bound, tag in ((0xFF, 0xCC), (0xFFFF, 0xCD), (0xFFFF_FFFF, 0xCE)):
        if n <= bound:
            return tag
    return 0xCF


def str_format(n: int) -> int:
    if n <= 31:
        return 0xA0 | n             # fixstr
    return 0xD9 if n <= 0xFF else 0xDA if n <= 0xFFFF else 0xDB


def bin_format(n: int) -> int:
    return 0xC4 if n <= 0xFF else 0xC5 if n <= 0xFFFF else 0xC6


def container_format(n: int, fix: int, tag16: int) -> int:
    return fix | n if n <= 15 else tag16 if n <= 0xFFFF else tag16 + 1


def around(*bounds: int) -> list[int]:
    return sorted({x for b in bounds for x in (b - 1, b, b + 1) if x >= 0})


UINTS = around(0, 0x7F, 0xFF, 0xFFFF, 0xFFFF_FFFF) + [2**64 - 2, 2**64 - 1]
NEGS = [-1, -31, -32, -33, -127, -128, -129, -32767, -32768, -32769, -(2**31), -(2**31) - 1,
        -(2**63) + 1, -(2**63)]
LENGTHS = around(0, 31, 32, 0xFF, 0xFFFF) + [0x10001]
COUNTS = around(0, 15, 16, 0xFFFF) + [0x10001]


def _str(n: int) -> str:
    return "".join(chr(ord("a") + i % 26) for i in range(n))


def _bin(n: int) -> bytes:
    return bytes(i & 0xFF for i in range(n))


def encode_cases() -> list[tuple[str, object, set[int]]]:
    """(mpcheck command, the value it must decode to, the first bytes the spec allows)."""
    cases: list[tuple[str, object, set[int]]] = []
    cases += [(f"enc uint {n}", n, {uint_format(n)}) for n in UINTS]
    cases += [(f"enc int {n}", n, {uint_format(n)}) for n in UINTS if n < 2**63]
    # A negative int: negative fixint from -32, else any signed format wide enough (the
    # spec lets an encoder choose; the value is what must come back).
    cases += [(f"enc int {n}", n, {n & 0xFF} if n >= -32 else
               {t for t, bits in ((0xD0, 8), (0xD1, 16), (0xD2, 32), (0xD3, 64))
                if n >= -(2 ** (bits - 1))}) for n in NEGS]
    cases += [(f"enc str {n}", _str(n), {str_format(n)}) for n in LENGTHS]
    cases += [(f"enc bin {n}", _bin(n), {bin_format(n)}) for n in LENGTHS]
    cases += [(f"enc arr {n}", [None] * n, {container_format(n, 0x90, 0xDC)}) for n in COUNTS]
    cases += [(f"enc map {n}", {f"k{i}": i for i in range(n)},
               {container_format(n, 0x80, 0xDE)}) for n in COUNTS]
    cases += [("enc nil", None, {0xC0}), ("enc bool 0", False, {0xC2}),
              ("enc bool 1", True, {0xC3})]
    return cases


def test_python_decodes_what_mp_c_encodes(mp):
    cases = encode_cases()
    answers = mp([c for c, _, _ in cases])
    for (command, value, formats), hex_ in zip(cases, answers, strict=True):
        data = bytes.fromhex(hex_)
        assert data[0] in formats, (command, hex(data[0]), sorted(map(hex, formats)))
        got = msgpack.unpackb(data, raw=False, strict_map_key=False)
        assert got == value, command
        assert type(got) is type(value), command
        # One whole value: nothing left over.
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        assert len(list(unpacker)) == 1, command


# -- the other way: what Python encodes, read by mp.c ---------------------------------------

def render(value) -> str:
    """A value as mpcheck renders what mp.c reads (see provider/tests/mpcheck.c)."""
    if value is None:
        return "nil"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return f"u{value}" if value >= 0 else "neg"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "s" + value.encode().hex()
    if isinstance(value, bytes):
        return "b" + value.hex()
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{render(k)}:{render(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def decode_values() -> list[object]:
    values: list[object] = [None, True, False, 0.5, 1e300]
    values += UINTS + NEGS
    values += [_str(n) for n in LENGTHS] + ["é€😀"]
    values += [_bin(n) for n in LENGTHS]
    values += [[i for i in range(n)] for n in COUNTS if n < 0x10000]
    values += [[None] * 0x10001]
    values += [{f"key{i}": i for i in range(n)} for n in COUNTS]
    # What a control header looks like: nested maps and arrays of every kind.
    values += [{"t": "post_send", "rid": 7, "qp": 2**40, "wrs": [
        {"wr_id": 2**64 - 1, "opcode": 0, "sg": [[4096, 65536, 0x1234]], "imm": None,
         "inline": b"\x00\x01" * 40, "flags": -1, "ok": True}], "": {}}]
    return values


def test_mp_c_reads_what_python_encodes(mp):
    values = decode_values()
    data = [msgpack.packb(v, use_bin_type=True) for v in values]
    answers = mp([f"dec {d.hex()}" for d in data])
    for value, answer in zip(values, answers, strict=True):
        assert answer == render(value), repr(value)[:80]


# -- refused without a read past the bytes --------------------------------------------------

def test_every_truncation_is_refused(mp):
    """Every proper prefix of an encoding up to 300 bytes long; of a longer one, each cut
    inside its first 8 bytes (the header) and the one that leaves out only its last."""
    whole = [msgpack.packb(v, use_bin_type=True) for v in decode_values()]
    whole += [bytes.fromhex(h) for h in mp([c for c, _, _ in encode_cases()])]
    prefixes = sorted({d[:i] for d in whole
                       for i in (range(len(d)) if len(d) <= 300 else [*range(8), len(d) - 1])},
                      key=len)
    answers = mp([f"dec {p.hex()}" for p in prefixes])
    assert len(prefixes) > 2500
    assert [p.hex()[:40] for p, a in zip(prefixes, answers, strict=True) if a != "bad"] == []


MALFORMED = {
    "nothing": b"",
    "0xc1, never used": b"\xc1",
    "fixext 1": b"\xd4\x01\x00",
    "ext 8": b"\xc7\x01\x01\x00",
    "ext 32": b"\xc9\x00\x00\x00\x01\x01\x00",
    "fixext 16": b"\xd8\x01" + bytes(16),
    "str 32 claiming 4 GiB": b"\xdb\xff\xff\xff\xff" + b"abc",
    "bin 32 claiming 4 GiB": b"\xc6\xff\xff\xff\xff" + b"abc",
    "array 32 of 2^32 - 1 elements": b"\xdd\xff\xff\xff\xff" + b"\xc0" * 8,
    "map 32 of 2^32 - 1 entries": b"\xdf\xff\xff\xff\xff" + b"\xc0" * 8,
    "map 16 with a key and no value": b"\xde\x00\x01\xa1k",
    "fixarray with an ext inside": b"\x92\xc0\xd4\x01\x00",
    "nesting 40 arrays deep": b"\x91" * 40 + b"\xc0",
    "two values where one is read": b"\xc0\xc0",
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_is_refused(mp, data):
    assert mp([f"dec {data.hex()}"]) == ["bad"]


def test_nesting_up_to_the_readers_limit_is_read(mp):
    """The reader follows 32 levels of containers below the top (mp.c skip_depth), so
    the refusal above is its limit and not any nesting."""
    deep = b"\x91" * 32 + b"\xc0"
    assert mp([f"dec {deep.hex()}"]) == ["[" * 32 + "nil" + "]" * 32]
