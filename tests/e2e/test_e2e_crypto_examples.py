"""The examples and the table of mlx5dv_wr_set_mkey_crypto(3), end to end between two
daemons over TCP, through softhca.client only (tests/support/e2e.py).

The target owns the MKEY and its DEK (created with ctx.create_dek); the initiator
reads and writes it as a peer would. Every image is built by the oracle: crcmod
guards and cryptography's own XTS mode, one context per data unit.
"""

from __future__ import annotations

import random

import pytest

import softhca.client as sh
from softhca.tools import oracle
from softhca.tools.crypto_table import (
    DUS,
    TWEAK,
    dec,
    enc,
    new_key,
    prot,
    row_images,
    sig_pi,
)

from e2e import SIG_CRYPTO_FLAGS, two_nodes, whole

CRYPTO_FLAGS = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO
LOCAL = sh.IBV_ACCESS_LOCAL_WRITE
REMOTE = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ | sh.IBV_ACCESS_REMOTE_WRITE
N_BLOCKS = 6


async def configure_row(side, row: str, key: bytes, data: bytes, access: int = REMOTE,
                        memory: bytes | int | None = None):
    """The row's MKEY on ``side``, list layout over an MR holding ``memory`` (by default
    the row's memory image); returns (memory image, wire image, MR, MKEY, has sig)."""
    image, wire, mem_sig, wire_sig, eot, order, unit = row_images(row, key, data)
    sig = None
    if mem_sig is not None or wire_sig is not None:
        sig = sh.Mlx5SigBlockAttr(mem=mem_sig, wire=wire_sig, check_mask=0xFF)
    dek = await side.dek(key)
    crypto = sh.Mlx5CryptoAttr(crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS,
                               encrypt_on_tx=eot, signature_crypto_order=order,
                               data_unit_size=DUS[unit],
                               initial_tweak=TWEAK.to_bytes(16, "little"), dek=dek)
    mr = await side.reg_mr(image if memory is None else memory)
    mkey = await side.mkey(SIG_CRYPTO_FLAGS if sig else CRYPTO_FLAGS, access=access,
                           sges=whole(mr), sig=sig, crypto=crypto)
    return image, wire, mr, mkey, sig is not None


async def assert_no_err(mkey: sh.MKey) -> None:
    err = await mkey.mkey_check()
    assert err.err_type == sh.MLX5DV_MKEY_NO_ERR, err


async def run_row(pair, row: str, rng: random.Random) -> None:
    t, i = pair.target, pair.initiator
    key, data = new_key(rng, 64), rng.randbytes(N_BLOCKS * 512)
    memory, wire, mr, mkey, has_sig = await configure_row(t, row, key, data)
    dst = await i.reg_mr(len(wire))

    # TX: the target answers the initiator's RDMA_READ through the MKEY.
    wc = await pair.read(whole(dst), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_READ), f"row {row}: {wc}"
    assert await dst.read() == wire, f"row {row} TX"
    if has_sig:
        await assert_no_err(mkey)

    # RX: the wire image written back through the MKEY over a zeroed target MR.
    await mr.write(bytes(len(memory)))
    wc = await pair.write(whole(dst), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_WRITE), f"row {row}: {wc}"
    assert await mr.read() == memory, f"row {row} RX"
    if has_sig:
        await assert_no_err(mkey)


@pytest.mark.parametrize("row", list("ABCDEFGHIJ"))
async def test_e2e_crypto_table_row(pair, rng, row):
    """Table row: RDMA_READ of the MKEY gives exactly the row's wire image, RDMA_WRITE of
    it gives back the memory image (path MTU 1024: each message is several packets)."""
    await run_row(pair, row, rng)


@pytest.mark.parametrize("row", ["C", "E", "I"])
async def test_e2e_crypto_table_row_mtu_256(rng, row):
    """The same rows with a 256-byte path MTU: data units and blocks span many packets."""
    async with two_nodes(mtu=sh.IBV_MTU_256) as pair:
        await run_row(pair, row, rng)


async def test_e2e_crypto_example_1(pair, rng):
    """Row F, SEND with the MKEY as lkey: the encrypted memory decrypted with the DEK and
    the plaintext sent; the initiator's RECV gets the plaintext."""
    t, i = pair.target, pair.initiator
    key, data = new_key(rng, 64), rng.randbytes(8 * 512)
    memory, wire, mr, mkey, _ = await configure_row(t, "F", key, data, access=LOCAL)
    assert memory == enc(key, data, 512) and wire == data
    dst = await i.reg_mr(len(data))

    swc, rwc = await pair.send(t, [sh.SGE(0, len(data), mkey.lkey)], i, whole(dst))
    assert (swc.status, swc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND), swc
    assert (rwc.status, rwc.opcode, rwc.byte_len) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RECV,
                                                      len(data)), rwc
    assert await dst.read() == data
    assert await mr.read() == memory


async def test_e2e_crypto_example_1_1(pair, rng):
    """Row F, RECV whose SGE is the MKEY: the plaintext from the wire encrypted with the
    DEK (AES-128-XTS here) into target memory."""
    t, i = pair.target, pair.initiator
    key, data = new_key(rng, 32), rng.randbytes(8 * 512)
    _, _, mr, mkey, _ = await configure_row(t, "F", key, data, access=LOCAL, memory=len(data))
    src = await i.reg_mr(data)

    swc, rwc = await pair.send(i, whole(src), t, [sh.SGE(0, len(data), mkey.lkey)])
    assert (swc.status, swc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND), swc
    assert (rwc.status, rwc.opcode, rwc.byte_len) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RECV,
                                                      len(data)), rwc
    assert await mr.read() == enc(key, data, 512)


async def test_e2e_crypto_example_2(pair, rng):
    """Row C, RDMA_READ of the MKEY: a T10DIF generated every 512 bytes of data, data and
    T10DIF encrypted together in 520-byte data units."""
    t, i = pair.target, pair.initiator
    key, data = new_key(rng, 64), rng.randbytes(8 * 512)
    _, wire, _, mkey, _ = await configure_row(t, "C", key, data)
    dst = await i.reg_mr(8 * 520)

    wc = await pair.read(whole(dst), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_READ), wc
    got = await dst.read()
    assert got == wire == enc(key, prot(data, sig_pi), 520)
    assert dec(key, got, 520) == prot(data, sig_pi)
    await assert_no_err(mkey)


async def test_e2e_crypto_example_2_1(pair, rng):
    """Row C, RDMA_WRITE to the MKEY: decrypted, each T10DIF validated, stripped, the data
    alone scattered; a ciphertext byte changed is caught by the DIF check at its unit."""
    t, i = pair.target, pair.initiator
    key, data = new_key(rng, 64), rng.randbytes(8 * 512)
    _, wire, mr, mkey, _ = await configure_row(t, "C", key, data, memory=len(data))
    src = await i.reg_mr(wire)

    wc = await pair.write(whole(src), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_WRITE), wc
    assert await mr.read() == data
    await assert_no_err(mkey)

    u = 5
    bad = bytearray(wire)
    bad[u * 520 + 17] ^= 0x80
    await src.write(bytes(bad))
    wc = await pair.write(whole(src), mkey.rkey, 0)
    assert wc.status == sh.IBV_WC_SUCCESS, wc
    clear = dec(key, bytes(bad), 520)
    # Only unit u decrypts differently; the data moves regardless (docs/semantics.md 6).
    assert await mr.read() == b"".join(clear[k * 520:k * 520 + 512] for k in range(8))
    unit = clear[u * 520:(u + 1) * 520]
    err = await mkey.mkey_check()
    assert err.err_type == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, err
    assert (err.sig_err.actual_value, err.sig_err.expected_value, err.sig_err.offset) == (
        oracle.t10dif_crc(unit[:512], 0), int.from_bytes(unit[512:514], "big"), u * 520), err
    await assert_no_err(mkey)
