"""Independent computations of what the device must produce.

Nothing here imports softhca.engine: the expected PI and ciphertexts of the
tests come from crcmod (a different CRC implementation than the engine's fast
path), a plain RFC 1071 sum, and cryptography's own XTS mode with one context
per data unit, straight from the man pages' definitions.
"""

from __future__ import annotations

import crcmod
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def t10dif_crc(data: bytes, bg: int) -> int:
    # crcmod starts the register at initCrc ^ xorOut; xorOut is 0 here.
    return crcmod.mkCrcFun(0x18BB7, initCrc=bg, rev=False, xorOut=0)(data)


def ip_csum(data: bytes, bg: int = 0) -> int:
    if len(data) % 2:
        data += b"\0"
    s = bg
    for i in range(0, len(data), 2):
        s += (data[i] << 8) | data[i + 1]
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def crc32_fcph(data: bytes, seed: int) -> int:
    return crcmod.mkCrcFun(0x104C11DB7, initCrc=seed ^ M32, rev=False, xorOut=M32)(data)


def crc32c(data: bytes, seed: int) -> int:
    return crcmod.mkCrcFun(0x11EDC6F41, initCrc=seed ^ M32, rev=True, xorOut=M32)(data)


def crc64_xp10(data: bytes, seed: int) -> int:
    return crcmod.mkCrcFun(0x1AD93D23594C93659, initCrc=seed ^ M64, rev=True, xorOut=M64)(data)


CRC_FUNCS = {0: (crc32_fcph, 4), 1: (crc32c, 4), 2: (crc64_xp10, 8)}  # by mlx5dv_sig_crc_type


def t10dif_pi(block: bytes, *, csum: bool = False, bg: int = 0, app: int = 0,
              ref: int = 0) -> bytes:
    guard = ip_csum(block, bg) if csum else t10dif_crc(block, bg)
    return guard.to_bytes(2, "big") + app.to_bytes(2, "big") + (ref & M32).to_bytes(4, "big")


def crc_pi(block: bytes, crc_type: int, seed: int) -> bytes:
    fn, size = CRC_FUNCS[crc_type]
    return fn(block, seed).to_bytes(size, "big")


def protect(data: bytes, block_size: int, pi) -> bytes:
    """data cut into blocks, each followed by pi(block, index); a tail stays plain."""
    out = bytearray()
    n = len(data) // block_size
    for b in range(n):
        block = data[b * block_size:(b + 1) * block_size]
        out += block + pi(block, b)
    out += data[n * block_size:]
    return bytes(out)


def xts(key: bytes, data: bytes, unit: int, tweak: int, encrypt: bool) -> bytes:
    """IEEE 1619 XTS-AES, unit k of ``data`` with tweak ``tweak + k`` (16 bytes LE)."""
    out = bytearray()
    for k, start in enumerate(range(0, len(data), unit)):
        t = ((tweak + k) % (1 << 128)).to_bytes(16, "little")
        c = Cipher(algorithms.AES(key), modes.XTS(t))
        op = c.encryptor() if encrypt else c.decryptor()
        out += op.update(data[start:start + unit]) + op.finalize()
    return bytes(out)
