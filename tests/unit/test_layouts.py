"""The layout examples of mlx5dv_wr_mkey_configure(3), against the engine."""

from __future__ import annotations

import pytest

from softhca.engine import transfer
from softhca.protocol.attrs import SGE, MrInterleaved, SigBlockAttr, SigBlockDomain, SigT10dif
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    MkeyErrType,
    MkeyInitAttrFlags,
    SigType,
)
from softhca.tools import oracle

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

RW = AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE | AccessFlags.LOCAL_WRITE


def test_mkey_configure_list_layout_example(node, rng):
    """"The first 64 bytes will go to memory referenced by mr1. The next 4096 bytes will
    go to memory referenced by mr2." """
    mr1, mr2 = node.reg_mr(256), node.reg_mr(8192)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=2)
    node.configure(mkey, access=AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE,
                   sges=[SGE(mr1.addr, 64, mr1.lkey), SGE(mr2.addr, 4096, mr2.lkey)])
    data = rng.randbytes(64 + 4096)
    # The MKEY has REMOTE_WRITE but not LOCAL_WRITE: the example's RDMA_WRITE is remote.
    transfer.rx(node.pd, mkey.rkey, 0, data, remote=True)
    assert mr1.read(64) == data[:64]
    assert mr1.read(256 - 64, 64) == bytes(256 - 64)
    assert mr2.read(4096) == data[64:]
    assert mr2.read(4096, 4096) == bytes(4096)
    assert transfer.tx(node.pd, mkey.rkey, 0, len(data), remote=True) == data


def test_mkey_configure_interleaved_layout_example(node, rng):
    """"The first 512 bytes will go to memory referenced by mr1 at offset 0. The next 8
    bytes will go to memory referenced by mr2 at offset 0. The next 512 bytes will go to
    memory referenced by mr1 at offset 516. The next 8 bytes will go to memory referenced
    by mr2 at offset 8." """
    mr1, mr2 = node.reg_mr(2048), node.reg_mr(64)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=3)
    node.configure(mkey, access=AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE,
                   interleaved=(2, [MrInterleaved(mr1.addr, 512, 4, mr1.lkey),
                                    MrInterleaved(mr2.addr, 8, 0, mr2.lkey)]))
    data = rng.randbytes(2 * 520)
    transfer.rx(node.pd, mkey.rkey, 0, data, remote=True)
    m1, m2 = mr1.read(), mr2.read()
    assert m1[0:512] == data[0:512]
    assert m2[0:8] == data[512:520]
    assert m1[516:1028] == data[520:1032]
    assert m2[8:16] == data[1032:1040]
    assert m1[512:516] == bytes(4) and m1[1028:] == bytes(len(m1) - 1028)
    assert m2[16:] == bytes(48)
    assert transfer.tx(node.pd, mkey.rkey, 0, len(data), remote=True) == data


def test_interleaved_layout_keeps_pi_in_its_own_buffer(node, rng):
    """The interleaved layout's purpose: data in one MR, each block's T10DIF in another."""
    n = 4
    data_mr, pi_mr = node.reg_mr(n * 512), node.reg_mr(n * 8)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE, 3)
    dif = SigT10dif(app_tag=0x77, ref_tag=9)
    node.configure(mkey, access=RW,
                   interleaved=(n, [MrInterleaved(data_mr.addr, 512, 0, data_mr.lkey),
                                    MrInterleaved(pi_mr.addr, 8, 0, pi_mr.lkey)]),
                   sig=SigBlockAttr(mem=SigBlockDomain(sig_type=SigType.T10DIF, dif=dif,
                                                       block_size=BlockSize.SIZE_512),
                                    wire=None, check_mask=0xFF))
    data = rng.randbytes(n * 512)
    transfer.rx(node.pd, mkey.rkey, 0, data, remote=True)
    assert data_mr.read() == data
    expect = b"".join(oracle.t10dif_pi(data[b * 512:(b + 1) * 512], app=0x77, ref=9)
                      for b in range(n))
    assert pi_mr.read() == expect
    assert transfer.tx(node.pd, mkey.rkey, 0, n * 512, remote=True) == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
