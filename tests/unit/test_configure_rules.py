"""Every rule of docs/semantics.md section 4: the MKEY configure WR is refused by
wr_complete with the errno the rule names, and nothing of it is applied."""

from __future__ import annotations

import pytest

from softhca.engine import transfer
from softhca.engine.completion import Fault, TransferError
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    MkeyConfAttr,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    MkeyConfFlags,
    MkeyErrType,
    MkeyInitAttrFlags,
    SendFlags,
    SigBlockAttrFlags,
    SigCrcType,
    SigType,
    WcOpcode,
)
from softhca.protocol.errors import RDMAError

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

DIF512 = SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(), block_size=BlockSize.SIZE_512)
GOOD_SIG = SigBlockAttr(mem=None, wire=DIF512, check_mask=0xFF)


def dif(**kw) -> SigBlockDomain:
    return SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(**kw),
                          block_size=BlockSize.SIZE_512)


def crc(crc_type, seed, bs=BlockSize.SIZE_512) -> SigBlockDomain:
    return SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(crc_type, seed), block_size=bs)


@pytest.fixture
def setup(node):
    mr = node.reg_mr(8192)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE, 2)
    return node, mr, mkey


def snapshot(mkey):
    return (mkey.valid, mkey.access, mkey.layout, mkey.sig, mkey.crypto)


def expect_refused(node, mkey, errno_name, build):
    """Run ``build(qp)`` between wr_start and wr_complete; wr_complete must fail
    with ``errno_name`` and leave the MKEY as it was."""
    before = snapshot(mkey)
    qp = node.qp
    qp.wr_start()
    qp.wr_flags = SendFlags.INLINE | SendFlags.SIGNALED
    build(qp)
    with pytest.raises(RDMAError) as info:
        qp.wr_complete()
    assert info.value.errno_name == errno_name, info.value
    assert snapshot(mkey) == before
    return info.value


def test_valid_configure_completes_with_driver1(setup):
    node, mr, mkey = setup
    posted = node.configure(mkey, sges=[SGE(mr.addr, 1024, mr.lkey)], sig=GOOD_SIG,
                            wr_flags=SendFlags.INLINE | SendFlags.SIGNALED)
    assert [(p.opcode, p.signaled) for p in posted] == [(WcOpcode.DRIVER1, True)]
    assert mkey.valid and mkey.layout.length == 1024


# -- EOPNOTSUPP ---------------------------------------------------------------

def test_qp_without_mkey_configure_send_op(setup):
    node, mr, mkey = setup
    node.qp = MkeyConfigureBuilder(node.pd, send_ops_flags=0)
    expect_refused(node, mkey, "EOPNOTSUPP",
                   lambda qp: qp.wr_mkey_configure(mkey, 0, MkeyConfAttr()))


def test_inline_missing(setup):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_flags = SendFlags.SIGNALED
        qp.wr_mkey_configure(mkey, 0, MkeyConfAttr())
    err = expect_refused(node, mkey, "EOPNOTSUPP", build)
    assert "IBV_SEND_INLINE" in err.message


@pytest.mark.parametrize("attr", [MkeyConfAttr(conf_flags=0x2), MkeyConfAttr(comp_mask=1)])
def test_unknown_conf_flags_or_comp_mask(setup, attr):
    node, mr, mkey = setup
    expect_refused(node, mkey, "EOPNOTSUPP", lambda qp: qp.wr_mkey_configure(mkey, 0, attr))


# -- setters and num_setters: EINVAL --------------------------------------------

def test_setter_without_configure(setup):
    node, mr, mkey = setup
    expect_refused(node, mkey, "EINVAL", lambda qp: qp.wr_set_mkey_access_flags(0))


def test_setter_called_twice(setup):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, 2, MkeyConfAttr())
        qp.wr_set_mkey_access_flags(AccessFlags.REMOTE_READ)
        qp.wr_set_mkey_access_flags(AccessFlags.REMOTE_WRITE)
    expect_refused(node, mkey, "EINVAL", build)


def test_two_layout_setters(setup):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, 2, MkeyConfAttr())
        qp.wr_set_mkey_layout_list([SGE(mr.addr, 64, mr.lkey)])
        qp.wr_set_mkey_layout_interleaved(1, [MrInterleaved(mr.addr, 64, 0, mr.lkey)])
    expect_refused(node, mkey, "EINVAL", build)


@pytest.mark.parametrize("num_setters,called", [(2, 1), (1, 2), (0, 1)])
def test_num_setters_mismatch(setup, num_setters, called):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, num_setters, MkeyConfAttr())
        setters = [lambda: qp.wr_set_mkey_access_flags(AccessFlags.REMOTE_READ),
                   lambda: qp.wr_set_mkey_layout_list([SGE(mr.addr, 64, mr.lkey)])]
        for s in setters[:called]:
            s()
    expect_refused(node, mkey, "EINVAL", build)


@pytest.mark.parametrize("flags", [AccessFlags.ZERO_BASED, AccessFlags.MW_BIND, 0x1000])
def test_access_flags_outside_the_set(setup, flags):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
        qp.wr_set_mkey_access_flags(flags)
    expect_refused(node, mkey, "EINVAL", build)


# -- layouts: EINVAL --------------------------------------------------------------

def _layout_case(node, mr, mkey):
    other_pd = node.hca.alloc_pd()
    foreign = node.hca.reg_mr(other_pd, 4096, AccessFlags.LOCAL_WRITE)
    return {
        "list over max_entries": ("list", [SGE(mr.addr, 8, mr.lkey)] * 3),
        "interleaved needs an extra entry": ("il", 1, [MrInterleaved(mr.addr, 8, 0, mr.lkey)] * 2),
        "unknown lkey": ("list", [SGE(mr.addr, 8, 0xDEAD00)]),
        "lkey of another PD": ("list", [SGE(foreign.addr, 8, foreign.lkey)]),
        "range leaves the MR": ("list", [SGE(mr.addr + 8000, 400, mr.lkey)]),
        "range starts before the MR": ("list", [SGE(mr.addr - 1, 8, mr.lkey)]),
        "interleaved repeat leaves the MR": ("il", 20, [MrInterleaved(mr.addr, 512, 8, mr.lkey)]),
        "an MKEY as a layout entry": ("list", [SGE(0, 8, mkey.lkey)]),
    }


@pytest.mark.parametrize("case", ["list over max_entries", "interleaved needs an extra entry",
                                  "unknown lkey", "lkey of another PD", "range leaves the MR",
                                  "range starts before the MR",
                                  "interleaved repeat leaves the MR", "an MKEY as a layout entry"])
def test_bad_layout(setup, case):
    node, mr, mkey = setup
    spec = _layout_case(node, mr, mkey)[case]

    def build(qp):
        qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
        if spec[0] == "list":
            qp.wr_set_mkey_layout_list(spec[1])
        else:
            qp.wr_set_mkey_layout_interleaved(spec[1], spec[2])
    expect_refused(node, mkey, "EINVAL", build)


# -- the sig setter: EINVAL --------------------------------------------------------

BAD_SIGS = {
    "both domains absent": SigBlockAttr(mem=None, wire=None),
    "unknown flags": SigBlockAttr(wire=DIF512, flags=0x4),
    "unknown sig_type": SigBlockAttr(wire=SigBlockDomain(sig_type=7, dif=SigT10dif())),
    "block_size 5": SigBlockAttr(wire=SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(),
                                                     block_size=5)),
    "bg 0x1234": SigBlockAttr(wire=dif(bg=0x1234)),
    "crc32 seed 1": SigBlockAttr(mem=crc(SigCrcType.CRC32, 1)),
    "crc32c seed 0xFFFF": SigBlockAttr(mem=crc(SigCrcType.CRC32C, 0xFFFF)),
    "crc64 seed 0xFFFFFFFF": SigBlockAttr(mem=crc(SigCrcType.CRC64_XP10, 0xFFFFFFFF)),
    "unknown crc type": SigBlockAttr(mem=crc(3, 0)),
    "unknown t10dif flags": SigBlockAttr(wire=dif(flags=0x8)),
    "COPY_MASK with different sig_type": SigBlockAttr(
        mem=crc(SigCrcType.CRC32, 0), wire=DIF512, flags=SigBlockAttrFlags.COPY_MASK,
        copy_mask=0xF0),
    "COPY_MASK with different block_size": SigBlockAttr(
        mem=crc(SigCrcType.CRC32, 0, BlockSize.SIZE_4096), wire=crc(SigCrcType.CRC32, 0),
        flags=SigBlockAttrFlags.COPY_MASK, copy_mask=0xF0),
    "COPY_MASK with different CRC type": SigBlockAttr(
        mem=crc(SigCrcType.CRC32, 0), wire=crc(SigCrcType.CRC32C, 0),
        flags=SigBlockAttrFlags.COPY_MASK, copy_mask=0xF0),
    "COPY_MASK with one domain": SigBlockAttr(wire=DIF512, flags=SigBlockAttrFlags.COPY_MASK),
}


@pytest.mark.parametrize("case", list(BAD_SIGS))
def test_bad_sig_block_attr(setup, case):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
        qp.wr_set_mkey_sig_block(BAD_SIGS[case])
    expect_refused(node, mkey, "EINVAL", build)


def test_crc_seed_bits_beyond_the_width_are_ignored(setup):
    """mlx5dv_wr_set_mkey_sig_block(3): "only the 32 least significant bits are used for
    CRC32/CRC32C"."""
    node, mr, mkey = setup
    node.configure(mkey, sges=[SGE(mr.addr, 1024, mr.lkey)],
                   sig=SigBlockAttr(mem=crc(SigCrcType.CRC32C, 0xFFFFFFFF_FFFFFFFF)))
    assert mkey.sig.mem.guard_seed == 0xFFFFFFFF


def test_sig_setter_without_block_signature_flag(node):
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT)

    def build(qp):
        qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
        qp.wr_set_mkey_sig_block(GOOD_SIG)
    expect_refused(node, mkey, "EINVAL", build)


def test_different_block_sizes_are_not_modelled(setup):
    node, mr, mkey = setup

    def build(qp):
        qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
        qp.wr_set_mkey_sig_block(SigBlockAttr(mem=crc(SigCrcType.CRC32, 0, BlockSize.SIZE_4096),
                                              wire=DIF512))
    expect_refused(node, mkey, "EOPNOTSUPP", build)


# -- the crypto setter: EINVAL ---------------------------------------------------------

def test_crypto_setter_rules(node):
    mr = node.reg_mr(4096)
    key = bytes(range(64))
    dek = node.create_dek(key)
    other_pd_dek = node.hca.create_dek(DEKInitAttr(pd=node.hca.alloc_pd(), key=key))
    destroyed = node.create_dek(bytes(range(1, 65)))
    node.hca.destroy_dek(destroyed)
    good = CryptoAttr(dek=dek)
    cases = {
        "standard not AES_XTS": CryptoAttr(crypto_standard=1, dek=dek),
        "order out of range": CryptoAttr(signature_crypto_order=2, dek=dek),
        "data_unit_size out of range": CryptoAttr(data_unit_size=5, dek=dek),
        "unknown DEK": CryptoAttr(dek=424242),
        "DEK not READY": CryptoAttr(dek=destroyed),
        "DEK of another PD": CryptoAttr(dek=other_pd_dek),
        "comp_mask": CryptoAttr(dek=dek, comp_mask=1),
    }
    with_crypto = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.CRYPTO)
    for name, attr in cases.items():
        def build(qp, attr=attr):
            qp.wr_mkey_configure(with_crypto, 1, MkeyConfAttr())
            qp.wr_set_mkey_crypto(attr)
        err = expect_refused(node, with_crypto, "EINVAL", build)
        assert err.message, name
    without = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE)

    def build(qp):
        qp.wr_mkey_configure(without, 1, MkeyConfAttr())
        qp.wr_set_mkey_crypto(good)
    expect_refused(node, without, "EINVAL", build)
    node.configure(with_crypto, sges=[SGE(mr.addr, 1024, mr.lkey)], crypto=good)
    assert with_crypto.crypto.dek is dek


def test_dek_refuses_equal_halves_and_bad_lengths(node):
    for key in (bytes(64), bytes(32), bytes(range(48))):
        with pytest.raises(RDMAError) as info:
            node.create_dek(key)
        assert info.value.errno_name == "EINVAL"


# -- what a configure keeps ---------------------------------------------------------------

def test_a_failed_batch_applies_none_of_its_wrs(setup):
    node, mr, mkey = setup
    other = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=2)
    qp = node.qp
    qp.wr_start()
    qp.wr_flags = SendFlags.INLINE
    qp.wr_mkey_configure(other, 1, MkeyConfAttr())          # valid on its own
    qp.wr_set_mkey_layout_list([SGE(mr.addr, 512, mr.lkey)])
    qp.wr_mkey_configure(mkey, 1, MkeyConfAttr())
    qp.wr_set_mkey_access_flags(AccessFlags.ZERO_BASED)      # refused
    with pytest.raises(RDMAError):
        qp.wr_complete()
    assert not other.valid and other.layout is None


def test_configure_keeps_and_replaces(setup):
    node, mr, mkey = setup
    node.configure(mkey, access=AccessFlags.REMOTE_READ, sges=[SGE(mr.addr, 1040, mr.lkey)],
                   sig=GOOD_SIG)
    sig = mkey.sig
    # Access and layout replaced when given; the signature kept when not.
    node.configure(mkey, access=AccessFlags.REMOTE_WRITE | AccessFlags.LOCAL_WRITE)
    assert mkey.access == AccessFlags.REMOTE_WRITE | AccessFlags.LOCAL_WRITE
    assert mkey.sig is sig and mkey.layout.length == 1040
    # RESET_SIG_ATTR drops it.
    node.configure(mkey, access=None, conf_flags=MkeyConfFlags.RESET_SIG_ATTR)
    assert mkey.sig is None
    # The MKEY was created with BLOCK_SIGNATURE, so mlx5dv_mkey_check still answers, with
    # no error (the mlx5 provider keeps the signature context; rdma-core's
    # test_mlx5_mkey.test_mkey_sig_err checks exactly this). It used to expect EINVAL.
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    # RESET_SIG_ATTR with a new sig setter: the new one applies.
    node.configure(mkey, access=None, sig=GOOD_SIG, conf_flags=MkeyConfFlags.RESET_SIG_ATTR)
    assert mkey.sig is not None and mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_crypto_kept_until_replaced(node):
    mr = node.reg_mr(4096)
    d1, d2 = node.create_dek(bytes(range(64))), node.create_dek(bytes(range(2, 66)))
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.CRYPTO)
    node.configure(mkey, sges=[SGE(mr.addr, 1024, mr.lkey)], crypto=CryptoAttr(dek=d1))
    node.configure(mkey, access=AccessFlags.LOCAL_WRITE)
    assert mkey.crypto.dek is d1
    node.configure(mkey, access=None, crypto=CryptoAttr(dek=d2))
    assert mkey.crypto.dek is d2


def test_crypto_mkey_without_crypto_attrs_fails_traffic(node):
    mr = node.reg_mr(4096)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.CRYPTO)
    node.configure(mkey, sges=[SGE(mr.addr, 1024, mr.lkey)])
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 0, 512)
    assert info.value.fault is Fault.CRYPTO


def test_local_inv_clears_the_mkey_until_configured_again(setup):
    node, mr, mkey = setup
    node.configure(mkey, sges=[SGE(mr.addr, 1024, mr.lkey)])
    transfer.tx(node.pd, mkey.lkey, 0, 512)
    mkey.invalidate()
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 0, 512)
    assert info.value.fault is Fault.ACCESS and "invalidated" in info.value.message
    node.configure(mkey, access=None)
    transfer.tx(node.pd, mkey.lkey, 0, 512)


def test_wrs_after_a_configure_see_it_at_once(setup):
    """mlx5dv_wr_mkey_configure(3): no need to wait for the configure's completion."""
    node, mr, mkey = setup
    node.configure(mkey, sges=[SGE(mr.addr, 1040, mr.lkey)], sig=GOOD_SIG)
    assert len(transfer.tx(node.pd, mkey.lkey, 0, 2 * 520)) == 1040
