"""What the man pages say the bytes are, computed without the engine.

The demo judges the daemons' wire images with this, and the tests take their expected
values from it; so nothing here imports softhca.engine (tests/unit/test_layering.py checks
that). The PI comes from crcmod (another CRC implementation than the engine's fast
path) with the parameters of docs/semantics.md section 3 and a plain RFC 1071 sum;
AES-XTS from cryptography's own XTS mode, one context per data unit, straight from
mlx5dv_wr_set_mkey_crypto(3)'s definition of the tweak.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..protocol.attrs import SigBlockDomain, pi_size
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    CRC_PI_BYTES,
    SigCrcType,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
)

M16, M32, M64 = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF

# docs/semantics.md section 3: (crcmod polynomial with its x^width term, reflected, final xor).
_CRC_PARAMS = {
    "t10dif": (0x18BB7, False, 0),
    "crc32": (0x104C11DB7, False, M32),
    "crc32c": (0x11EDC6F41, True, M32),
    "crc64": (0x1AD93D23594C93659, True, M64),
}
# The check values of "123456789" in the same table: an oracle that disagrees with
# the contract's own numbers must not judge anything.
_CRC_CHECK = {
    ("t10dif", 0): 0xD0DB, ("t10dif", M16): 0x8E3C,
    ("crc32", M32): 0xFC891918, ("crc32", 0): 0x765E7680,
    ("crc32c", M32): 0xE3069283, ("crc32c", 0): 0xA71C05DF,
    ("crc64", M64): 0xAE8B14860A799888, ("crc64", 0): 0x87FF3F9B2B57C87B,
}


@functools.cache
def crc(kind: str, seed: int) -> Callable[[bytes], int]:
    """The CRC whose register starts at ``seed``, with the algorithm's final xor."""
    # crcmod and cryptography load when the oracle computes, not when softhca's parser
    # is built (explain's --row configurations come from the crypto table, beside it).
    import crcmod

    poly, rev, xorout = _CRC_PARAMS[kind]
    # crcmod's initCrc is the register value after the final xor, so undo it.
    fn = crcmod.mkCrcFun(poly, initCrc=seed ^ xorout, rev=rev, xorOut=xorout)
    want = _CRC_CHECK.get((kind, seed))
    if want is not None and fn(b"123456789") != want:
        raise RuntimeError(f"oracle {kind} seed {seed:#x} disagrees with docs/semantics.md")
    return fn


def t10dif_crc(data: bytes, bg: int) -> int:
    return crc("t10dif", bg)(data)


def crc32_fcph(data: bytes, seed: int) -> int:
    return crc("crc32", seed)(data)


def crc32c(data: bytes, seed: int) -> int:
    return crc("crc32c", seed)(data)


def crc64_xp10(data: bytes, seed: int) -> int:
    return crc("crc64", seed)(data)


# by enum mlx5dv_sig_crc_type: the CRC and its PI bytes.
CRC_FUNCS = {SigCrcType.CRC32: (crc32_fcph, CRC_PI_BYTES[SigCrcType.CRC32]),
             SigCrcType.CRC32C: (crc32c, CRC_PI_BYTES[SigCrcType.CRC32C]),
             SigCrcType.CRC64_XP10: (crc64_xp10, CRC_PI_BYTES[SigCrcType.CRC64_XP10])}


def ip_csum(data: bytes, bg: int = 0) -> int:
    """RFC 1071 over big-endian words, bg as the starting sum (docs/semantics.md section 3)."""
    if len(data) % 2:
        data += b"\0"
    s = bg + sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while s > M16:
        s = (s & M16) + (s >> 16)
    return ~s & M16


def t10dif_pi(block: bytes, *, csum: bool = False, bg: int = 0, app: int = 0,
              ref: int = 0) -> bytes:
    """guard | app tag | ref tag, each big-endian (docs/semantics.md section 2)."""
    guard = ip_csum(block, bg) if csum else t10dif_crc(block, bg)
    return guard.to_bytes(2, "big") + app.to_bytes(2, "big") + (ref & M32).to_bytes(4, "big")


def crc_pi(block: bytes, crc_type: int, seed: int) -> bytes:
    fn, size = CRC_FUNCS[crc_type]
    # mlx5dv_wr_set_mkey_sig_block(3): "only the 32 least significant bits are used
    # for CRC32/CRC32C".
    return fn(block, seed & ((1 << 8 * size) - 1)).to_bytes(size, "big")


def protect_blocks(data: bytes, block_size: int, pi: Callable[[bytes, int], bytes]) -> bytes:
    """``data`` cut into blocks, each followed by ``pi(block, index)``; a tail stays plain
    data (docs/semantics.md section 5)."""
    out = bytearray()
    n = len(data) // block_size
    for b in range(n):
        block = data[b * block_size:(b + 1) * block_size]
        out += block + pi(block, b)
    out += data[n * block_size:]
    return bytes(out)


# -- the same, for a struct mlx5dv_sig_block_domain -------------------------------------

def guard_of(d: SigBlockDomain, block: bytes) -> int:
    """The T10-DIF guard or the CRC of one block in domain ``d``."""
    if d.sig_type == SigType.T10DIF:
        if d.dif.bg_type == SigT10difBgType.CSUM:
            return ip_csum(block, d.dif.bg)
        return t10dif_crc(block, d.dif.bg)
    return int.from_bytes(crc_pi(block, d.crc.crc_type, d.crc.seed), "big")


def ref_of(d: SigBlockDomain, b: int) -> int:
    # mlx5dv_wr_set_mkey_sig_block(3): ref_tag is "the value of the first block",
    # and REF_REMAP means "Increment reference tag per block".
    step = b if d.dif.flags & SigT10difFlags.REF_REMAP else 0
    return (d.dif.ref_tag + step) & M32


def pi_of(d: SigBlockDomain, block: bytes, b: int) -> bytes:
    """Block b's PI in domain ``d``."""
    if d.sig_type == SigType.T10DIF:
        return (guard_of(d, block).to_bytes(2, "big") + d.dif.app_tag.to_bytes(2, "big")
                + ref_of(d, b).to_bytes(4, "big"))
    return guard_of(d, block).to_bytes(pi_size(d), "big")


def protect(data: bytes, d: SigBlockDomain) -> bytes:
    """``data`` as domain ``d`` lays it out: blocks each followed by their PI."""
    return protect_blocks(data, BLOCK_SIZE_BYTES[d.block_size],
                          lambda block, b: pi_of(d, block, b))


def xts(key: bytes, data: bytes, unit: int, tweak: int, encrypt: bool) -> bytes:
    """IEEE 1619 XTS-AES: unit k with tweak ``tweak + k`` as 16 little-endian bytes
    (mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each data_unit_size")."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    out = bytearray()
    for k, start in enumerate(range(0, len(data), unit)):
        t = ((tweak + k) % (1 << 128)).to_bytes(16, "little")
        cipher = Cipher(algorithms.AES(key), modes.XTS(t))
        ctx = cipher.encryptor() if encrypt else cipher.decryptor()
        out += ctx.update(data[start:start + unit]) + ctx.finalize()
    return bytes(out)
