"""The manual pages' examples, end to end between two daemons, each ending in PASS or FAIL.

The catalogue: each example is the verb its page names, run between a target that owns
the MKEY and an initiator with plain MRs (tools/harness.py): SEND with the MKEY as lkey
and a RECV on the far side, RECV with the MKEY as the SGE, RDMA_READ and RDMA_WRITE by
the initiator with the target MKEY's rkey (address 0: MKEYs are zero-based).

What an example must produce is computed from the man pages alone, not by the engine:
the PI and AES-XTS by tools/oracle.py, the crypto table's rows by tools/crypto_table.py.
The demo never imports the tests, so it can run where only the package is installed.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

from ..protocol.attrs import (
    SGE,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from ..protocol.enums import (
    AccessFlags,
    BlockSize,
    MkeyErrType,
    SigCrcType,
    SigMask,
    SigT10difFlags,
    SigType,
)
from .crypto_table import (
    BEFORE,
    SIG,
    SIG1,
    TABLE,
    crypto_attr,
    dec,
    enc,
    new_key,
    row_images,
)
from .harness import (
    CRYPTO_FLAGS,
    EXAMPLE_TIMEOUT,
    INDIRECT,
    LOCAL,
    REMOTE,
    SIG_CRYPTO_FLAGS,
    SIG_FLAGS,
    Example,
    Outcome,
    judge,
    on_mkey,
    run_all,
    select_entries,
    two_daemons,
    whole,
)
from .oracle import guard_of, protect
from .render import Shape, Style, preview

SIG_PAGE = "mlx5dv_wr_set_mkey_sig_block(3)"
CRYPTO_PAGE = "mlx5dv_wr_set_mkey_crypto(3)"
CONF_PAGE = "mlx5dv_wr_mkey_configure(3)"
M32 = 0xFFFFFFFF


# The configurations are those of tests/unit/test_sig_block_examples.py and
# tests/unit/test_crypto_examples.py, so the demo shows what the tests assert.
CRC32_512 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, M32),
                           block_size=BlockSize.SIZE_512)
DIF_4K = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_4096,
                        dif=SigT10dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000,
                                      flags=SigT10difFlags.REF_REMAP))
SIG_EXAMPLE_1 = SigBlockAttr(mem=CRC32_512, wire=None, check_mask=SigMask.CRC32)
SIG_EXAMPLE_2 = SigBlockAttr(mem=None, wire=DIF_4K, check_mask=0xFF)


@dataclass(frozen=True)
class Entry:
    name: str
    page: str
    where: str
    result: str
    fn: Callable[[Example], Awaitable[None]]


EXAMPLES: list[Entry] = []


def example(name: str, page: str, where: str, result: str):
    def register(fn: Callable[[Example], Awaitable[None]]) -> Callable[[Example], Awaitable[None]]:
        EXAMPLES.append(Entry(name, page, where, result, fn))
        return fn
    return register


# -- mlx5dv_wr_set_mkey_sig_block(3) ---------------------------------------------------

@example("sig_block 1", SIG_PAGE, "Example 1",
         "SEND with the MKEY as local key: each CRC32 validated against its 512 bytes, "
         "stripped, and only the 512 bytes of data per block sent to the wire.")
async def _sig_block_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    memory = protect(data, CRC32_512)
    mr = await t.reg_mr(memory)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {len(memory)}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    mem_shape, plain = Shape(512, CRC32_512), Shape(512)
    ex.image("target memory", memory, mem_shape)
    dst = await i.reg_mr(len(data))
    # The SGE length counts wire bytes (docs/semantics.md 5): 8 blocks of 512.
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.image("wire (SEND)", wire.data, plain)
    got = await dst.read()
    ex.image("initiator memory (RECV)", got, plain)
    await ex.mkey_check(mkey)
    ex.same("wire holds the data alone, CRC32 stripped", wire.data, data, plain)
    ex.same("initiator received the data", got, data, plain)
    # "validate each CRC32": with one stored CRC32 wrong the data still moves and the
    # MKEY latches a BAD_GUARD for that block (mlx5dv_mkey_check(3)).
    b = 3
    bad = bytearray(memory)
    bad[b * 516 + 512] ^= 0x01
    await mr.write(bytes(bad))
    await dst.write(bytes(len(data)))
    ex.say("tamper", f"one CRC32 byte of blk {b} flipped in target memory; SEND again")
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.same("the data still moves (a signature error is not a transport error)", wire.data,
            data, plain)
    ex.same("initiator received the data again", await dst.read(), data, plain)
    stored = int.from_bytes(bad[b * 516 + 512:b * 516 + 516], "big")
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD,
                               guard_of(CRC32_512, data[b * 512:(b + 1) * 512]), stored, b * 516))


@example("sig_block 1.1", SIG_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data scattered with a CRC32 generated after every "
         "512 bytes.")
async def _sig_block_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    mr = await t.reg_mr(8 * 516)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    src = await i.reg_mr(data)
    plain = Shape(512)
    ex.image("initiator memory", data, plain)
    wire = await ex.send(i, whole(src), t, on_mkey(mkey, len(data)))
    ex.image("wire (SEND)", wire.data, plain)
    got = await mr.read()
    ex.image("target memory (RECV)", got, Shape(512, CRC32_512))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's data", wire.data, data, plain)
    ex.same("target memory is data + CRC32 every 512 bytes", got,
            protect(data, CRC32_512), Shape(512, CRC32_512))


@example("sig_block 2", SIG_PAGE, "Example 2",
         "A remote RDMA_READ of the MKEY: the data transmitted with a T10DIF generated "
         "every 4K of data.")
async def _sig_block_2(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = await t.reg_mr(data)
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    ex.image("target memory", data, plain)
    dst = await i.reg_mr(4 * 4104)
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image("wire (RDMA_READ response)", wire.data, dif)
    got = await dst.read()
    ex.image("initiator memory", got, dif)
    await ex.mkey_check(mkey)
    want = protect(data, DIF_4K)
    ex.same("wire is data + T10DIF (crcmod guard, app 0x5a5a, ref 0x1000 + blk)", wire.data,
            want, dif)
    ex.same("initiator memory holds data + the same T10DIF", got, want, dif)
    ex.same("target memory is not changed by being read", await mr.read(), data, plain)


@example("sig_block 2.1", SIG_PAGE, "Example 2.1",
         "A remote RDMA_WRITE to the MKEY: each T10DIF validated against its 4K of data, "
         "stripped, and the data alone scattered.")
async def _sig_block_2_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = await t.reg_mr(len(data))
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    image = protect(data, DIF_4K)
    src = await i.reg_mr(image)
    ex.image("initiator memory", image, dif)
    wire = await ex.rdma_write(whole(src), mkey)
    ex.image("wire (RDMA_WRITE)", wire.data, dif)
    got = await mr.read()
    ex.image("target memory", got, plain)
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's data + T10DIF", wire.data, image, dif)
    ex.same("target memory is the data alone, T10DIF stripped", got, data, plain)
    # "validate each T10DIF field": a wrong guard in block 2 is reported at that block.
    b = 2
    bad = bytearray(image)
    bad[b * 4104 + 4096] ^= 0x01
    await src.write(bytes(bad))
    await mr.write(bytes(len(data)))
    ex.say("tamper", f"one guard byte of blk {b} flipped in initiator memory; RDMA_WRITE again")
    await ex.rdma_write(whole(src), mkey)
    ex.same("the data is still scattered (the writer's completion says nothing)",
            await mr.read(), data, plain)
    stored = int.from_bytes(bad[b * 4104 + 4096:b * 4104 + 4098], "big")
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD,
                               guard_of(DIF_4K, data[b * 4096:(b + 1) * 4096]), stored, b * 4104))




@example("crypto 1", CRYPTO_PAGE, "Example 1 (row F)",
         "SEND with the MKEY as local key: the encrypted memory decrypted with the DEK and "
         "the plaintext sent to the wire.")
async def _crypto_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    memory = enc(key, data, 512)
    mr = await t.reg_mr(memory)
    attr = crypto_attr(await t.create_dek(key), False, BEFORE, 512)
    mkey = await t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    ex.image("target memory", memory, Shape(512, enc="all"))
    dst = await i.reg_mr(len(data))
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.image("wire (SEND)", wire.data, Shape(512))
    got = await dst.read()
    ex.image("initiator memory (RECV)", got, Shape(512))
    await ex.mkey_check(mkey)
    ex.same("wire is the plaintext whose cryptography XTS encryption is in memory", wire.data,
            data)
    ex.same("initiator received the plaintext", got, data)


@example("crypto 1.1", CRYPTO_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data encrypted with the DEK and scattered.")
async def _crypto_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    # An AES-128-XTS DEK here (32 bytes), so both key sizes are shown.
    key, data = new_key(ex.rng, 32), ex.rng.randbytes(8 * 512)
    mr = await t.reg_mr(len(data))
    attr = crypto_attr(await t.create_dek(key), False, BEFORE, 512)
    mkey = await t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    src = await i.reg_mr(data)
    ex.image("initiator memory", data, Shape(512))
    wire = await ex.send(i, whole(src), t, on_mkey(mkey, len(data)))
    ex.image("wire (SEND)", wire.data, Shape(512))
    got = await mr.read()
    ex.image("target memory (RECV)", got, Shape(512, enc="all"))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's plaintext", wire.data, data)
    ex.same("target memory is enc(data), tweak + k for unit k", got,
            enc(key, data, 512))


async def _row_c(ex: Example, key: bytes, memory: bytes | int):
    t = ex.target
    mr = await t.reg_mr(memory)
    sig = SigBlockAttr(mem=None, wire=SIG, check_mask=0xFF)
    attr = crypto_attr(await t.create_dek(key), True, BEFORE, 520)
    mkey = await t.mkey(SIG_CRYPTO_FLAGS, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, SIG_CRYPTO_FLAGS, REMOTE,
                   f"list layout: {mr.length}B of MR 0x{mr.lkey:x}", sig, attr, key)
    return mr, mkey


@example("crypto 2", CRYPTO_PAGE, "Example 2 (row C)",
         "A remote RDMA_READ: a T10DIF generated every 512B of data, data and T10DIF "
         "encrypted together (520B data units) and transmitted.")
async def _crypto_2(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = await _row_c(ex, key, data)
    ex.image("target memory", data, Shape(512))
    dst = await i.reg_mr(8 * 520)
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image("wire (RDMA_READ response)", wire.data, Shape(512, SIG, "all"))
    got = await dst.read()
    ex.image("initiator memory", got, Shape(512, SIG, "all"))
    clear = dec(key, got, 520)
    ex.image("initiator memory decrypted by cryptography XTS", clear, Shape(512, SIG))
    await ex.mkey_check(mkey)
    want = enc(key, protect(data, SIG), 520)
    ex.same("wire is enc(data+T10DIF) per 520B unit", wire.data, want, Shape(512, SIG, "all"))
    ex.same("initiator memory holds the wire image", got, want, Shape(512, SIG, "all"))
    ex.same("decrypted, it is data + T10DIF (crcmod guard, app 0xbeef, ref 0x2000 + blk)",
            clear, protect(data, SIG), Shape(512, SIG))


@example("crypto 2.1", CRYPTO_PAGE, "Example 2.1",
         "A remote RDMA_WRITE: the data decrypted, each T10DIF validated against its 512B, "
         "stripped, and the data alone scattered.")
async def _crypto_2_1(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = await _row_c(ex, key, len(data))
    image = enc(key, protect(data, SIG), 520)
    src = await i.reg_mr(image)
    ex.image("initiator memory", image, Shape(512, SIG, "all"))
    wire = await ex.rdma_write(whole(src), mkey)
    ex.image("wire (RDMA_WRITE)", wire.data, Shape(512, SIG, "all"))
    got = await mr.read()
    ex.image("target memory", got, Shape(512))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's enc(data+T10DIF)", wire.data, image, Shape(512, SIG, "all"))
    ex.same("target memory is the data alone", got, data, Shape(512))
    # A ciphertext byte changed on the wire decrypts to garbage in its 16-byte XTS
    # block: the T10DIF check after decryption must catch it at that 520B unit.
    u = 5
    bad = bytearray(image)
    bad[u * 520 + 17] ^= 0x80
    await src.write(bytes(bad))
    ex.say("tamper", f"one ciphertext byte of unit {u} flipped in initiator memory; "
           "RDMA_WRITE again")
    await ex.rdma_write(whole(src), mkey)
    clear = dec(key, bytes(bad), 520)[u * 520:(u + 1) * 520]
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD, guard_of(SIG, clear[:512]),
                               int.from_bytes(clear[512:514], "big"), u * 520))


# -- the table of mlx5dv_wr_set_mkey_crypto(3) (tools/crypto_table.py) --------------------

ROW_BLOCKS = 6


def image_shape(image: str, sig: SigBlockDomain | None) -> Shape:
    """How to cut an image named in the table's notation: "enc(data)+SIG" has the data
    but not the PI encrypted, "enc(data+SIG)" both, "data+SIG" neither."""
    if image.startswith("enc(") and image.endswith(")"):
        return Shape(512, sig, "all")
    return Shape(512, sig, "data" if image.startswith("enc(") else "none")


async def _crypto_row(ex: Example, row: str) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(ROW_BLOCKS * 512)
    r, printed = row_images(row, key, data), TABLE[row]
    mem_shape = image_shape(printed.memory, r.mem_sig)
    wire_shape = image_shape(printed.wire, r.wire_sig)
    sig = None
    if r.mem_sig or r.wire_sig:
        sig = SigBlockAttr(mem=r.mem_sig, wire=r.wire_sig, check_mask=0xFF)
    flags = SIG_CRYPTO_FLAGS if sig else CRYPTO_FLAGS
    mr = await t.reg_mr(r.memory)
    attr = crypto_attr(await t.create_dek(key), r.encrypt_on_tx, r.order, r.unit)
    mkey = await t.mkey(flags, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, flags, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   sig, attr, key)
    if SIG1 in (r.mem_sig, r.wire_sig):
        ex.say("", "SIG1 = CRC64_XP10, SIG2 = SIG = T10DIF: one signature converted into another")
    ex.image(f"target memory {printed.memory}", r.memory, mem_shape)
    # TX: the initiator reads the MKEY; the target's READ responses carry the wire image.
    dst = await i.reg_mr(len(r.wire))
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image(f"wire {printed.wire} (RDMA_READ response)", wire.data, wire_shape)
    got = await dst.read()
    ex.image("initiator memory after RDMA_READ", got, wire_shape)
    await ex.mkey_check(mkey)
    ex.same(f"TX gives the wire image {printed.wire}", wire.data, r.wire, wire_shape)
    ex.same("initiator memory holds the wire image", got, r.wire, wire_shape)
    # RX: the same bytes written back through the MKEY over a zeroed target MR.
    await mr.write(bytes(mr.length))
    ex.say("back", "target MR zeroed; the initiator RDMA_WRITEs the wire image to the MKEY")
    wire = await ex.rdma_write(whole(dst), mkey)
    got = await mr.read()
    ex.image("target memory after RDMA_WRITE of the wire image", got, mem_shape)
    await ex.mkey_check(mkey)
    ex.same("the RDMA_WRITE carried the wire image", wire.data, r.wire, wire_shape)
    ex.same(f"RX gives back the memory image {printed.memory}", got, r.memory, mem_shape)


for _row, _p in TABLE.items():
    example(f"crypto row {_row}", CRYPTO_PAGE, f"table row {_row}",
            f"Memory {_p.memory} -> {_p.op1}, {_p.op2}, {_p.op3} -> Wire {_p.wire}; "
            f"encrypt_on_tx {_p.encrypt_on_tx}, signature_crypto_order {_p.order}."
            )(functools.partial(_crypto_row, row=_row))


# -- mlx5dv_wr_mkey_configure(3) ------------------------------------------------------------

RW = AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE


@example("mkey_configure list", CONF_PAGE, "List data layout configuration",
         "An RDMA_WRITE to the MKEY: the first 64 bytes go to mr1, the next 4096 bytes to mr2.")
async def _layout_list(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = await t.reg_mr(256), await t.reg_mr(8192)
    # The page's example: 2 setters, access REMOTE_READ | REMOTE_WRITE, list of two SGEs.
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=2,
                        sges=[SGE(mr1.addr, 64, mr1.lkey), SGE(mr2.addr, 4096, mr2.lkey)])
    ex.mkey_config(mkey, INDIRECT, RW, f"list layout: 64B of mr1 0x{mr1.lkey:x}, "
                   f"4096B of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(64 + 4096)
    src = await i.reg_mr(data)
    ex.segments("initiator", data, [64], f"memory {len(data)}B {preview(data)}")
    wire = await ex.rdma_write(whole(src), mkey)
    ex.segments("wire bytes", wire.data, [64],
                f"RDMA_WRITE {len(wire.data)}B {preview(wire.data)}")
    m1, m2 = await mr1.read(), await mr2.read()
    ex.segments("target mr1", m1, [64])
    ex.segments("target mr2", m2, [4096])
    await ex.mkey_check(mkey)
    ex.same("the wire carried the initiator's bytes", wire.data, data)
    ex.same("mr1[0,64) is the first 64 bytes", m1[:64], data[:64])
    ex.same("mr2[0,4096) is the next 4096 bytes", m2[:4096], data[64:])
    ex.same("the rest of mr1 and mr2 is untouched", m1[64:] + m2[4096:],
            bytes(256 - 64 + 8192 - 4096))
    back = await i.reg_mr(len(data))
    ex.say("back", "the initiator RDMA_READs the MKEY")
    wire = await ex.rdma_read(whole(back), mkey)
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back", wire.data, data)
    ex.same("and scatters them into the initiator's MR", await back.read(), data)


@example("mkey_configure interleaved", CONF_PAGE, "Interleaved data layout configuration",
         "An RDMA_WRITE to the MKEY: 512 bytes to mr1 @0, 8 bytes to mr2 @0, 512 bytes to "
         "mr1 @516, 8 bytes to mr2 @8.")
async def _layout_interleaved(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = await t.reg_mr(2048), await t.reg_mr(64)
    # "one entry will be consumed for strided header": 2 entries need max_entries 3.
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=3,
                        interleaved=(2, [MrInterleaved(mr1.addr, 512, 4, mr1.lkey),
                                         MrInterleaved(mr2.addr, 8, 0, mr2.lkey)]))
    ex.mkey_config(mkey, INDIRECT, RW, f"interleaved layout x2: 512B skip 4 of mr1 0x{mr1.lkey:x}"
                   f", 8B skip 0 of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(2 * 520)
    src = await i.reg_mr(data)
    ex.segments("initiator", data, [512, 520, 1032], f"memory {len(data)}B {preview(data)}")
    wire = await ex.rdma_write(whole(src), mkey)
    ex.segments("wire bytes", wire.data, [512, 520, 1032],
                f"RDMA_WRITE {len(wire.data)}B {preview(wire.data)}")
    m1, m2 = await mr1.read(), await mr2.read()
    ex.segments("target mr1", m1, [512, 516, 1028])
    ex.segments("target mr2", m2, [8, 16])
    await ex.mkey_check(mkey)
    ex.same("the wire carried the initiator's bytes", wire.data, data)
    ex.same("first 512 bytes at mr1 offset 0", m1[0:512], data[0:512])
    ex.same("next 8 bytes at mr2 offset 0", m2[0:8], data[512:520])
    ex.same("next 512 bytes at mr1 offset 516", m1[516:1028], data[520:1032])
    ex.same("next 8 bytes at mr2 offset 8", m2[8:16], data[1032:1040])
    ex.same("the skipped and unused bytes are untouched", m1[512:516] + m1[1028:] + m2[16:],
            bytes(4 + 2048 - 1028 + 48))
    back = await i.reg_mr(len(data))
    ex.say("back", "the initiator RDMA_READs the MKEY")
    wire = await ex.rdma_read(whole(back), mkey)
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back", wire.data, data)
    ex.same("and scatters them into the initiator's MR", await back.read(), data)


# -- selection and the run ---------------------------------------------------------------

def select(only: list[str] | None) -> list[Entry]:
    """The examples named by ``only``: an exact name, else every example whose name
    starts with it ("crypto row" runs the ten rows)."""
    return select_entries(EXAMPLES, only, "example", "examples")


async def _play(entry: Entry, ex: Example) -> None:
    async with two_daemons(ex, trace=True):
        await entry.fn(ex)


async def run_one(entry: Entry, index: int, total: int, out: TextIO, style: Style) -> Outcome:
    out.write(style("head", f"[{index}/{total}] {entry.name}: {entry.page}, {entry.where}") + "\n")
    out.write(f"  Result: {entry.result}\n")
    ex = Example(entry.name, out, style)
    return await judge(ex, _play(entry, ex), EXAMPLE_TIMEOUT, "example", out, style)


def run(only: list[str] | None = None, out: TextIO | None = None,
        color: bool | None = None) -> list[Outcome]:
    """Run the selected examples, printing each; raises UnknownExample for a bad name."""
    return run_all(select(only), run_one, "example", out, color)
