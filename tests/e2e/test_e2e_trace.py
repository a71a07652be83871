"""The trace of every man page example, end to end: the stages the page describes, in order.

Each example runs between two embedded daemons (tests/support/e2e.py) with a "trace"
subscription on the daemons involved, as `softhca trace` would have; the stages each
daemon reports for the transfer through the example's key must be the ones the man
page describes, in order, and every block's check result NO_ERR. The expected stage
lists are written out here from the pages' words:

- mlx5dv_wr_set_mkey_sig_block(3), example 1: "validate each CRC32 ... strip ... and
  only the 512 bytes of data ... sent": gather, check, strip, wire;
  1.1: "a CRC32 generated after every 512 bytes" on RECV: wire, generate, scatter;
  2: "T10DIF generated every 4K" on RDMA_READ: gather, generate, wire;
  2.1: "validate each T10DIF ... strip ... scatter": wire, check, strip, scatter.
- mlx5dv_wr_set_mkey_crypto(3), example 1 (row F): decrypt with the DEK and send:
  gather, decrypt, wire; 1.1: encrypt and scatter: wire, encrypt, scatter;
  2 (row C): generate a T10DIF, encrypt data and T10DIF: gather, generate, encrypt, wire;
  2.1: decrypt, validate, strip, scatter.
- The table's rows A..J: TX (an RDMA_READ of the MKEY) runs Op1, Op2, Op3 in order,
  RX (an RDMA_WRITE of the wire image) the inverse.
"""

from __future__ import annotations

import pytest

import softhca.client as sh
from softhca.tools import crypto_table, demo, explain, harness, oracle

from e2e import SIG_FLAGS, sge, two_nodes, whole

NO_ERR = sh.MLX5DV_MKEY_NO_ERR
IDLE = 0.3


async def drain(sub, idle: float = IDLE) -> list[sh.Event]:
    """Every event until the stream has been quiet for ``idle`` seconds."""
    out = []
    while True:
        ev = await sub.next(idle)
        if ev is None:
            return out
        out.append(ev)


def transfers(events, op: str, direction: str) -> list[list[sh.Event]]:
    """The trace events of ``op`` in ``direction``, cut into transfers (a transfer
    starts with gather on TX, with wire on RX)."""
    first = "gather" if direction == "TX" else "wire"
    out: list[list[sh.Event]] = []
    for e in events:
        h = e.header
        if e.kind != "trace" or h["op"] != op or h["direction"] != direction:
            continue
        if h["stage"] == first or not out:
            out.append([])
        out[-1].append(e)
    return out


def one_transfer(events, op: str, direction: str) -> list[sh.Event]:
    found = transfers(events, op, direction)
    assert len(found) == 1, f"{op} {direction}: {len(found)} transfers, expected one"
    return found[0]


def stages(evs: list[sh.Event]) -> list[str]:
    return [e.header["stage"] for e in evs]


def stage(evs: list[sh.Event], name: str) -> sh.Event:
    (ev,) = [e for e in evs if e.header["stage"] == name]
    return ev


def assert_checks_pass(evs: list[sh.Event], blocks: int) -> None:
    for e in evs:
        if e.header["stage"] == "check":
            assert e.header["detail"]["results"] == [NO_ERR] * blocks
            assert e.header["detail"]["error"] is None


async def send(p, src, local, dst, recv) -> None:
    swc, rwc = await p.send(src, local, dst, recv)
    assert (swc.status, rwc.status) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SUCCESS)


def on_mkey(mkey, length: int) -> list[sh.SGE]:
    return [sh.SGE(0, length, mkey.lkey)]


# -- mlx5dv_wr_set_mkey_sig_block(3) ----------------------------------------------------

async def test_sig_block_example_1_gather_check_strip_send(rng):
    """SEND with the MKEY as lkey: each CRC32 validated, stripped, the data sent."""
    async with two_nodes() as p:
        data = rng.randbytes(8 * 512)
        memory = oracle.protect(data, demo.CRC32_512)
        mr = await p.target.reg_mr(memory)
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr), sig=demo.SIG_EXAMPLE_1)
        dst = await p.initiator.reg_mr(len(data))
        tsub = await p.target.node.subscribe("trace")
        isub = await p.initiator.node.subscribe("trace")
        await send(p, p.target, on_mkey(mkey, len(data)), p.initiator, whole(dst))
        tx = one_transfer(await drain(tsub), "SEND", "TX")
        assert stages(tx) == ["gather", "check", "strip", "wire"]
        assert_checks_pass(tx, 8)
        assert stage(tx, "check").header["detail"]["check_mask"] == sh.MLX5DV_SIG_MASK_CRC32
        assert stage(tx, "gather").data == memory and stage(tx, "wire").data == data
        assert {e.header["role"] for e in tx} == {"requester"}
        assert {e.header["key"] for e in tx} == {mkey.lkey}
        rx = one_transfer(await drain(isub), "RECV", "RX")
        assert stages(rx) == ["wire", "scatter"]
        assert stage(rx, "scatter").data == data


async def test_sig_block_example_1_1_receive_generate_scatter(rng):
    """RECV on the same MKEY: a CRC32 generated after every 512 bytes."""
    async with two_nodes() as p:
        data = rng.randbytes(8 * 512)
        mr = await p.target.reg_mr(8 * 516)
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr), sig=demo.SIG_EXAMPLE_1)
        src = await p.initiator.reg_mr(data)
        tsub = await p.target.node.subscribe("trace")
        await send(p, p.initiator, whole(src), p.target, on_mkey(mkey, len(data)))
        rx = one_transfer(await drain(tsub), "RECV", "RX")
        # The wire domain has no signature: nothing to check, the memory's CRC32 generated.
        assert stages(rx) == ["wire", "generate", "scatter"]
        assert stage(rx, "generate").header["detail"]["pi_size"] == 4
        assert stage(rx, "scatter").data == oracle.protect(data, demo.CRC32_512)


async def test_sig_block_example_2_gather_generate_transmit(rng):
    """RDMA_READ of the MKEY: a T10DIF generated every 4K of data."""
    async with two_nodes() as p:
        data = rng.randbytes(4 * 4096)
        mr = await p.target.reg_mr(data)
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr), sig=demo.SIG_EXAMPLE_2)
        dst = await p.initiator.reg_mr(4 * 4104)
        tsub = await p.target.node.subscribe("trace")
        isub = await p.initiator.node.subscribe("trace")
        assert (await p.read(whole(dst), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        tx = one_transfer(await drain(tsub), "RDMA_READ", "TX")
        assert stages(tx) == ["gather", "generate", "wire"]
        assert {e.header["role"] for e in tx} == {"responder"}
        assert stage(tx, "wire").data == oracle.protect(data, demo.DIF_4K)
        rx = one_transfer(await drain(isub), "RDMA_READ", "RX")
        assert stages(rx) == ["wire", "scatter"]


async def test_sig_block_example_2_1_receive_check_strip_scatter(rng):
    """RDMA_WRITE to the MKEY: each 4096-byte block's T10-DIF validated, stripped,
    the data scattered."""
    async with two_nodes() as p:
        data = rng.randbytes(4 * 4096)
        mr = await p.target.reg_mr(len(data))
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr), sig=demo.SIG_EXAMPLE_2)
        image = oracle.protect(data, demo.DIF_4K)
        src = await p.initiator.reg_mr(image)
        tsub = await p.target.node.subscribe("trace")
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        rx = one_transfer(await drain(tsub), "RDMA_WRITE", "RX")
        assert stages(rx) == ["wire", "check", "strip", "scatter"]
        assert_checks_pass(rx, 4)
        check = stage(rx, "check").header["detail"]
        assert check["domain_pi"] == 8 and check["check_mask"] == 0xFF
        assert stage(rx, "wire").data == image and stage(rx, "scatter").data == data
        assert {e.header["key"] for e in rx} == {mkey.rkey}


async def test_sig_block_example_2_1_a_bad_guard_is_reported_at_its_block(rng):
    async with two_nodes() as p:
        data = rng.randbytes(4 * 4096)
        mr = await p.target.reg_mr(len(data))
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr), sig=demo.SIG_EXAMPLE_2)
        bad = bytearray(oracle.protect(data, demo.DIF_4K))
        bad[2 * 4104 + 4096] ^= 0x01
        src = await p.initiator.reg_mr(bytes(bad))
        tsub = await p.target.node.subscribe("trace")
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        rx = one_transfer(await drain(tsub), "RDMA_WRITE", "RX")
        assert stages(rx) == ["wire", "check", "strip", "scatter"]
        check = stage(rx, "check").header["detail"]
        assert check["results"] == [NO_ERR, NO_ERR, sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, NO_ERR]
        assert check["error"]["err_type"] == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD
        assert check["error"]["offset"] == 2 * 4104
        # The data still moves; the error is latched for mlx5dv_mkey_check.
        assert stage(rx, "scatter").data == data
        assert (await mkey.mkey_check()).err_type == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD


# -- mlx5dv_wr_set_mkey_crypto(3) ---------------------------------------------------------

async def crypto_mkey(side, key: bytes, memory: bytes | int, row: str):
    """An MKEY configured as the table's row (crypto_table.row_images gives the domains)."""
    r = crypto_table.row_images(row, key, bytes(512))
    sig = None
    if r.mem_sig or r.wire_sig:
        sig = sh.Mlx5SigBlockAttr(mem=r.mem_sig, wire=r.wire_sig, check_mask=0xFF)
    flags = harness.SIG_CRYPTO_FLAGS if sig else harness.CRYPTO_FLAGS
    mr = await side.reg_mr(memory)
    attr = crypto_table.crypto_attr(await side.dek(key), crypto_table.TABLE[row].encrypt_on_tx, r.order, r.unit)
    mkey = await side.mkey(flags, sges=whole(mr), sig=sig, crypto=attr)
    return mr, mkey


def assert_crypto_detail(ev: sh.Event, unit: int) -> None:
    d = ev.header["detail"]
    assert d["data_unit_size"] == unit
    tweak = d["first_tweak"]
    assert (int(tweak, 16) if isinstance(tweak, str) else tweak) == crypto_table.TWEAK


async def test_crypto_example_1_gather_decrypt_send(rng):
    """SEND with the MKEY as lkey: the memory decrypted with the DEK, plaintext sent."""
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 64), rng.randbytes(8 * 512)
        memory = crypto_table.enc(key, data, 512)
        _, mkey = await crypto_mkey(p.target, key, memory, "F")
        dst = await p.initiator.reg_mr(len(data))
        tsub = await p.target.node.subscribe("trace")
        await send(p, p.target, on_mkey(mkey, len(data)), p.initiator, whole(dst))
        tx = one_transfer(await drain(tsub), "SEND", "TX")
        assert stages(tx) == ["gather", "decrypt", "wire"]
        assert_crypto_detail(stage(tx, "decrypt"), 512)
        assert stage(tx, "gather").data == memory and stage(tx, "wire").data == data


async def test_crypto_example_1_1_receive_encrypt_scatter(rng):
    """RECV on the same MKEY: the wire data encrypted with the DEK and scattered."""
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 32), rng.randbytes(8 * 512)
        _, mkey = await crypto_mkey(p.target, key, len(data), "F")
        src = await p.initiator.reg_mr(data)
        tsub = await p.target.node.subscribe("trace")
        await send(p, p.initiator, whole(src), p.target, on_mkey(mkey, len(data)))
        rx = one_transfer(await drain(tsub), "RECV", "RX")
        assert stages(rx) == ["wire", "encrypt", "scatter"]
        assert_crypto_detail(stage(rx, "encrypt"), 512)
        assert stage(rx, "scatter").data == crypto_table.enc(key, data, 512)


async def test_crypto_example_2_gather_generate_encrypt_transmit(rng):
    """RDMA_READ (row C): a T10DIF generated every 512 bytes, data and T10DIF encrypted
    together in 520-byte data units, transmitted."""
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 64), rng.randbytes(8 * 512)
        _, mkey = await crypto_mkey(p.target, key, data, "C")
        dst = await p.initiator.reg_mr(8 * 520)
        tsub = await p.target.node.subscribe("trace")
        assert (await p.read(whole(dst), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        tx = one_transfer(await drain(tsub), "RDMA_READ", "TX")
        assert stages(tx) == ["gather", "generate", "encrypt", "wire"]
        assert_crypto_detail(stage(tx, "encrypt"), 520)
        assert stage(tx, "generate").data == oracle.protect(data, crypto_table.SIG)
        assert stage(tx, "wire").data == crypto_table.enc(key, oracle.protect(data, crypto_table.SIG), 520)


async def test_crypto_example_2_1_receive_decrypt_check_strip_scatter(rng):
    """RDMA_WRITE (row C): decrypted, each T10DIF validated, stripped, data scattered."""
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 64), rng.randbytes(8 * 512)
        _, mkey = await crypto_mkey(p.target, key, len(data), "C")
        src = await p.initiator.reg_mr(crypto_table.enc(key, oracle.protect(data, crypto_table.SIG), 520))
        tsub = await p.target.node.subscribe("trace")
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        rx = one_transfer(await drain(tsub), "RDMA_WRITE", "RX")
        assert stages(rx) == ["wire", "decrypt", "check", "strip", "scatter"]
        assert_checks_pass(rx, 8)
        assert_crypto_detail(stage(rx, "decrypt"), 520)
        assert stage(rx, "decrypt").data == oracle.protect(data, crypto_table.SIG)
        assert stage(rx, "scatter").data == data


# The table: TX runs Op1, Op2, Op3 of the row (SIG.mem = X is the memory signature's
# check and strip, SIG.wire = Y the wire signature's generation: SIG.mem = SIG1 and
# SIG.wire = SIG2 together are a check then a generate that replaces the PI), and RX
# the inverse. Written out from the man page's columns.
ROW_STAGES = {
    # row: (TX stages, RX stages)
    "A": (["gather", "encrypt", "wire"], ["wire", "decrypt", "scatter"]),
    "B": (["gather", "encrypt", "generate", "wire"],
          ["wire", "check", "strip", "decrypt", "scatter"]),
    "C": (["gather", "generate", "encrypt", "wire"],
          ["wire", "decrypt", "check", "strip", "scatter"]),
    "D": (["gather", "check", "strip", "encrypt", "wire"],
          ["wire", "decrypt", "generate", "scatter"]),
    "E": (["gather", "check", "generate", "encrypt", "wire"],
          ["wire", "decrypt", "check", "generate", "scatter"]),
    "F": (["gather", "decrypt", "wire"], ["wire", "encrypt", "scatter"]),
    "G": (["gather", "decrypt", "generate", "wire"],
          ["wire", "check", "strip", "encrypt", "scatter"]),
    "H": (["gather", "decrypt", "check", "strip", "wire"],
          ["wire", "generate", "encrypt", "scatter"]),
    "I": (["gather", "decrypt", "check", "generate", "wire"],
          ["wire", "check", "generate", "encrypt", "scatter"]),
    "J": (["gather", "check", "strip", "decrypt", "wire"],
          ["wire", "encrypt", "generate", "scatter"]),
}
ROW_BLOCKS = 4


@pytest.mark.parametrize("row", sorted(ROW_STAGES))
async def test_crypto_table_row_stages(row, rng):
    want_tx, want_rx = ROW_STAGES[row]
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 64), rng.randbytes(ROW_BLOCKS * 512)
        r = crypto_table.row_images(row, key, data)
        mr, mkey = await crypto_mkey(p.target, key, r.memory, row)
        dst = await p.initiator.reg_mr(len(r.wire))
        tsub = await p.target.node.subscribe("trace")
        # TX: the initiator reads the MKEY; the target's pipeline gives the wire image.
        assert (await p.read(whole(dst), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        tx = one_transfer(await drain(tsub), "RDMA_READ", "TX")
        assert stages(tx) == want_tx
        assert_checks_pass(tx, ROW_BLOCKS)
        assert stage(tx, "gather").data == r.memory and stage(tx, "wire").data == r.wire
        # RX: the wire image written back through the MKEY gives the memory image.
        await mr.write(bytes(mr.length))
        assert (await p.write([sge(dst)], mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        rx = one_transfer(await drain(tsub), "RDMA_WRITE", "RX")
        assert stages(rx) == want_rx
        assert_checks_pass(rx, ROW_BLOCKS)
        assert stage(rx, "wire").data == r.wire and stage(rx, "scatter").data == r.memory
        for ev in tx + rx:
            if ev.header["stage"] in ("encrypt", "decrypt"):
                assert_crypto_detail(ev, r.unit)
        # `softhca explain --row` derives the same stages from the configuration alone.
        doc = explain.explain(explain.row_config(row))
        assert (doc["tx"]["stages"], doc["rx"]["stages"]) == (want_tx, want_rx)
