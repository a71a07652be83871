"""The WR and WC records: one definition, one encoder, one decoder (protocol.records)."""

from __future__ import annotations

import pytest

import softhca.client as sh
from softhca.engine import rc
from softhca.protocol.attrs import SGE
from softhca.protocol.enums import WcOpcode, WcStatus, WrOpcode
from softhca.protocol.errors import RDMAError
from softhca.protocol.records import WC, RecvWR, SendWR


def test_engine_and_client_share_the_records():
    assert rc.SendWR is SendWR and rc.RecvWR is RecvWR and rc.WC is WC
    assert sh.WC is WC
    assert issubclass(sh.SendWR, SendWR) and issubclass(sh.RecvWR, RecvWR)


def test_send_wr_wire_form_has_the_c_field_names():
    wr = SendWR(7, WrOpcode.ATOMIC_CMP_AND_SWP, [SGE(0x1000, 8, 0x11), SGE(0x2000, 16, 0x22)],
                send_flags=2, imm_data=None)
    wr.set_wr_atomic(0x33, 0x4000, 5, 9)
    # verbs.h: IBV_WR_ATOMIC_CMP_AND_SWP is 5.
    assert wr.to_wire() == {"wr_id": 7, "opcode": 5,
                            "sg": [[0x1000, 8, 0x11], [0x2000, 16, 0x22]], "send_flags": 2,
                            "rkey": 0x33, "remote_addr": 0x4000, "compare_add": 5, "swap": 9,
                            "invalidate_rkey": 0}


def test_send_wr_round_trips_every_field():
    wr = SendWR(2**64 - 1, WrOpcode.SEND_WITH_IMM, [SGE(1, 2, 3)], 8, 0xDEADBEEF, 4, 5, 6, 7,
                0x123)
    back = SendWR.from_wire(wr.to_wire())
    assert back == wr and type(back.opcode) is WrOpcode


def test_num_sge_sends_only_the_first_sges():
    sges = [SGE(0, 1, 1), SGE(8, 1, 1), SGE(16, 1, 1)]
    assert SendWR(1, WrOpcode.SEND, sges, num_sge=2).to_wire()["sg"] == [[0, 1, 1], [8, 1, 1]]
    assert RecvWR(1, sges, num_sge=1).to_wire() == {"wr_id": 1, "sg": [[0, 1, 1]]}


def test_recv_wr_round_trips():
    wr = RecvWR(9, [SGE(0x10, 20, 0x30)])
    assert wr.to_wire() == {"wr_id": 9, "sg": [[0x10, 20, 0x30]]}
    assert RecvWR.from_wire(wr.to_wire()) == wr


def test_wc_round_trips_every_field():
    wc = WC(11, WcStatus.REM_ACCESS_ERR, WcOpcode.RECV_RDMA_WITH_IMM, 4096, 0x12, 0xAB, 8,
            0x55, 3)
    w = wc.to_wire()
    # docs/protocol.md, poll_cq: [wr_id, status, opcode, byte_len, imm_data, qp_num,
    # wc_flags, vendor_err, invalidated_rkey]; verbs.h's enum values.
    assert w == [11, 10, 129, 4096, 0xAB, 0x12, 8, 3, 0x55]
    assert WC.from_wire(w) == wc
    assert WC.from_wire([1, 0, 0, 0, None, 0, 0, 0, 0]).imm_data is None


def test_client_constructors_are_pyverbs_ones():
    # pyverbs: SendWR(wr_id, opcode, num_sge, imm_data, sg, send_flags=IBV_SEND_SIGNALED)
    wr = sh.SendWR(3, sh.IBV_WR_SEND_WITH_IMM, 1, 0x77, [SGE(0, 4, 1), SGE(4, 4, 1)])
    assert (wr.wr_id, wr.imm_data, wr.send_flags) == (3, 0x77, 2)
    assert wr.to_wire()["sg"] == [[0, 4, 1]]
    rwr = sh.RecvWR(4, 1, [SGE(0, 4, 1), SGE(4, 4, 1)])
    assert rwr.to_wire() == {"wr_id": 4, "sg": [[0, 4, 1]]}
    # The engine's record is unsignaled unless asked, as a zeroed ibv_send_wr is.
    assert SendWR(1, WrOpcode.SEND).send_flags == 0


@pytest.mark.parametrize("w, errno, words", [
    ("x", "EPROTO", "send_wr[3] must be a map"),
    ({"wr_id": 1}, "EPROTO", "field 'opcode' of 'send_wr' is missing"),
    ({**SendWR(1).to_wire(), "bogus": 1}, "EPROTO", "send_wr[3] has unknown field(s): bogus"),
    ({**SendWR(1).to_wire(), "opcode": 99}, "EINVAL", "opcode 99 is not an enum ibv_wr_opcode"),
    ({**SendWR(1).to_wire(), "sg": [[1, 2]]}, "EPROTO", "send_wr[3] SGE 0 must be"),
    ({**SendWR(1).to_wire(), "imm_data": 1 << 32}, "EPROTO", "field 'imm_data'"),
])
def test_send_wr_decoder_refuses(w, errno, words):
    with pytest.raises(RDMAError) as e:
        SendWR.from_wire(w, "send_wr[3]")
    assert e.value.errno_name == errno and words in e.value.message


@pytest.mark.parametrize("w", [[1, 0, 0, 0, None, 0, 0, 0], [1, 0, 0, 0, None, 0, 0, 0, True],
                               [1, 99, 0, 0, None, 0, 0, 0, 0], {"wr_id": 1},
                               [-1, 0, 0, 0, None, 0, 0, 0, 0], [1, 0, 0, 0, 0, None, 0, 0, 0]])
def test_wc_decoder_refuses(w):
    with pytest.raises(RDMAError) as e:
        WC.from_wire(w)
    assert e.value.errno_name == "EPROTO"


class _Recorder:
    """A WR builder that writes down the calls made on it."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("wr_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, *args))

    def __setattr__(self, name, value):
        if name != "calls":
            self.calls.append(("set", name, value))
        object.__setattr__(self, name, value)


def test_configure_wr_from_keywords_makes_the_man_page_calls():
    from softhca.protocol.attrs import MkeyConfAttr, SigBlockAttr
    from softhca.protocol.records import build_configure_wr

    qp, sig, sges = _Recorder(), SigBlockAttr(), [SGE(0, 512, 7)]
    build_configure_wr(qp, "mkey", sges=sges, sig=sig, access=1, wr_id=5, wr_flags=8,
                       conf_flags=1)
    # mlx5dv_wr_mkey_configure(3): wr_start, wr_id/wr_flags, configure announcing the
    # setters that follow (access, layout, signature: 3), then the setters.
    assert qp.calls == [("wr_start",), ("set", "wr_id", 5), ("set", "wr_flags", 8),
                        ("wr_mkey_configure", "mkey", 3, MkeyConfAttr(conf_flags=1)),
                        ("wr_set_mkey_access_flags", 1), ("wr_set_mkey_layout_list", sges),
                        ("wr_set_mkey_sig_block", sig)]
    qp = _Recorder()
    build_configure_wr(qp, "mkey", interleaved=(2, []))
    assert qp.calls[3:] == [("wr_mkey_configure", "mkey", 1, MkeyConfAttr()),
                            ("wr_set_mkey_layout_interleaved", 2, [])]
