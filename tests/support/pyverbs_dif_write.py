"""examples/c/dif_write.c written in pyverbs, as a peer for the C program on the
provider: the same address exchange over TCP (one line each way, "cex QPN PSN GID RKEY
ADDR LEN" in hex, then "at NAME" lines as barriers), the same RC QP, the same transfers.

    PYTHONPATH=$(softhca pyverbs path) python pyverbs_dif_write.py [-p PORT] [ADDR]

without ADDR the target (a plain buffer the initiator writes data+T10-DIF into), with
ADDR the initiator (the T10-DIF wire-domain MKEY: RDMA_WRITE from it, RDMA_READ into it).
SOFTHCA_TARGET names the daemon. It prints what the C program prints (``image NAME LEN
HEX``, ``mkey_check ...``, ``check ok|FAILED: ...``, PASS or FAIL): the bytes the
test judges, and what this side can judge itself (the data that arrived, mkey_check).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

import pyverbs.enums as e
import pyverbs.providers.mlx5.mlx5_enums as dve
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.providers.mlx5.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
)
from pyverbs.providers.mlx5.mlx5dv_mkey import (
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5SigBlockAttr,
    Mlx5SigBlockDomain,
    Mlx5SigT10Dif,
)
from pyverbs.qp import QPAttr, QPCap, QPInitAttrEx
from pyverbs.wr import SGE, SendWR

# examples/c/dif_write.c's constants: the two programs must move the same bytes.
BLOCKS, BLK, PI, SEED = 8, 512, 8, 601
BG, APP, REF = 0xFFFF, 0x5A5A, 0x1000
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
M64 = (1 << 64) - 1
# enum mlx5dv_mkey_err_type, as examples/c/cex.c prints it
ERR_NAMES = {0: "NO_ERR", 1: "BAD_GUARD", 2: "BAD_REFTAG", 3: "BAD_APPTAG"}
failures = 0


def pattern(n: int, seed: int) -> bytes:
    """cex_pattern of examples/c/cex.c: xorshift64*, the high byte of each output."""
    x = (seed * 0x9E3779B97F4A7C15 & M64) | 1
    out = bytearray(n)
    for i in range(n):
        x ^= x >> 12
        x ^= (x << 25) & M64
        x ^= x >> 27
        out[i] = ((x * 0x2545F4914F6CDD1D) & M64) >> 56
    return bytes(out)


def check(ok: bool, text: str) -> None:
    global failures
    print(f"check {'ok' if ok else 'FAILED'}: {text}", flush=True)
    failures += not ok


def image(name: str, data: bytes) -> None:
    print(f"image {name} {len(data)} {data.hex()}", flush=True)


class Link:
    """The TCP side channel: the exchange line, then barriers."""

    def __init__(self, peer: str | None, port: int) -> None:
        if peer is None:
            srv = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
            self.sock, _ = srv.accept()
            srv.close()
        else:
            for _ in range(100):
                try:
                    self.sock = socket.create_connection((peer, port))
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise SystemExit(f"cannot connect to {peer}:{port}")
        self.rfile = self.sock.makefile("r")

    def line(self, text: str) -> str:
        self.sock.sendall(text.encode() + b"\n")
        got = self.rfile.readline().rstrip("\n")
        if not got:
            raise SystemExit("the peer closed the connection")
        return got

    def barrier(self, name: str) -> None:
        got = self.line(f"at {name}")
        if got != f"at {name}":
            raise SystemExit(f"out of step: here at {name}, the peer says {got}")


def connect(ctx, qp, link: Link, rkey: int, addr: int, length: int) -> dict:
    psn = 0x1234
    gid = ctx.query_gid(1, 0)
    mine = f"cex {qp.qp_num:06x} {psn:06x} {gid.raw.hex()} {rkey:08x} {addr:016x} {length:016x}"
    fields = link.line(mine).split()
    if len(fields) != 7 or fields[0] != "cex":
        raise SystemExit(f"the peer sent {fields}, not an exchange line")
    qpn, rpsn, rgid, rrkey, raddr, rlen = (fields[1], fields[2], fields[3], fields[4],
                                           fields[5], fields[6])
    dgid = GID()
    dgid.raw = bytes.fromhex(rgid)
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = REMOTE
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = int(qpn, 16), int(rpsn, 16), psn
    attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
    attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
    attr.ah_attr = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=dgid, sgid_index=0, hop_limit=1))
    qp.to_rts(attr)
    print(f"connected local_qpn 0x{qp.qp_num:06x} remote_qpn 0x{int(qpn, 16):06x}", flush=True)
    return {"rkey": int(rrkey, 16), "addr": int(raddr, 16), "len": int(rlen, 16)}


def wait(cq, what: str):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        n, wcs = cq.poll()
        if n:
            if wcs[0].status != e.IBV_WC_SUCCESS:
                raise SystemExit(f"{what} completed with status {wcs[0].status}")
            return wcs[0]
    raise SystemExit(f"no completion for {what}")


def post(qp, cq, opcode, sge: SGE, rkey: int, addr: int, what: str):
    wr = SendWR(wr_id=7, opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, addr)
    qp.post_send(wr)
    return wait(cq, what)


def t10dif_pi_ok(blk: bytes, pi: bytes, b: int) -> bool:
    # cex_crc16_t10dif: CRC-16/T10-DIF, seeded with bg
    crc = BG
    for byte in blk:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8BB7) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return pi == crc.to_bytes(2, "big") + APP.to_bytes(2, "big") + (REF + b).to_bytes(4, "big")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-p", type=int, default=18515)
    ap.add_argument("addr", nargs="?")
    args = ap.parse_args()
    role = "initiator" if args.addr else "target"
    print(f"role {role} (pyverbs)", flush=True)
    ctx = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
    pd, cq = PD(ctx), CQ(ctx, 64, None, None, 0)
    dv = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
                          send_ops_flags=dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
    qp = Mlx5QP(ctx, QPInitAttrEx(
        qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd, cap=QPCap(16, 16),
        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        send_ops_flags=e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE
        | e.IBV_QP_EX_WITH_RDMA_READ), dv)
    qp.to_init(QPAttr(port_num=1, qp_access_flags=REMOTE))
    data = pattern(BLOCKS * BLK, SEED)
    wire_len = BLOCKS * (BLK + PI)
    link = Link(args.addr, args.p)
    try:
        if role == "target":
            mr = MR(pd, wire_len, REMOTE)
            connect(ctx, qp, link, mr.rkey, mr.buf, wire_len)
            link.barrier("configured")
            link.barrier("written")
            got = mr.read(wire_len, 0)
            image("target_memory", got)
            blocks = [got[b * (BLK + PI):(b + 1) * (BLK + PI)] for b in range(BLOCKS)]
            check(all(blk[:BLK] == data[b * BLK:(b + 1) * BLK] for b, blk in enumerate(blocks)),
                  "each block of the initiator's data arrived")
            check(all(t10dif_pi_ok(blk[:BLK], blk[BLK:], b) for b, blk in enumerate(blocks)),
                  f"target_memory: {BLOCKS} T10-DIFs as computed here")
            link.barrier("read")
            mr.close()
        else:
            mr = MR(pd, BLOCKS * BLK, REMOTE)
            mr.write(data, len(data))
            mkey = Mlx5Mkey(pd, dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                            | dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1)
            wire = Mlx5SigBlockDomain(
                sig_type=dve.MLX5DV_SIG_TYPE_T10DIF, block_size=dve.MLX5DV_BLOCK_SIZE_512,
                dif=Mlx5SigT10Dif(bg_type=dve.MLX5DV_SIG_T10DIF_CRC, bg=BG, app_tag=APP,
                                  ref_tag=REF, flags=dve.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP))
            # a configure WR needs the QP in RTS; the peer waits for it
            peer = connect(ctx, qp, link, 0, 0, 0)
            qp.wr_start()
            qp.wr_id, qp.wr_flags = 1, e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
            qp.wr_mkey_configure(mkey, 3, Mlx5MkeyConfAttr())
            qp.wr_set_mkey_access_flags(e.IBV_ACCESS_LOCAL_WRITE)
            qp.wr_set_mkey_layout_list([SGE(mr.buf, BLOCKS * BLK, mr.lkey)])
            qp.wr_set_mkey_sig_block(Mlx5SigBlockAttr(mem=None, wire=wire, check_mask=0xFF))
            qp.wr_complete()
            wc = wait(cq, "the MKEY configure WR")
            check(wc.opcode == dve.MLX5DV_WC_UMR, "the configure WR completes as MLX5DV_WC_UMR")
            link.barrier("configured")
            image("initiator_memory", mr.read(BLOCKS * BLK, 0))
            # the MKEY is zero based; the SGE counts the wire's bytes
            post(qp, cq, e.IBV_WR_RDMA_WRITE, SGE(0, wire_len, mkey.lkey), peer["rkey"],
                 peer["addr"], "RDMA_WRITE")
            err = mkey.mkey_check()
            print(f"mkey_check after_write err_type={ERR_NAMES[err.err_type]}", flush=True)
            check(err.err_type == dve.MLX5DV_MKEY_NO_ERR, "mkey_check after the write")
            link.barrier("written")
            mr.write(bytes(BLOCKS * BLK), BLOCKS * BLK)
            post(qp, cq, e.IBV_WR_RDMA_READ, SGE(0, wire_len, mkey.lkey), peer["rkey"],
                 peer["addr"], "RDMA_READ")
            back = mr.read(BLOCKS * BLK, 0)
            image("initiator_memory_read", back)
            check(back == data, "the read brought the data back, T10-DIFs checked and stripped")
            err = mkey.mkey_check()
            print(f"mkey_check after_read err_type={ERR_NAMES[err.err_type]}", flush=True)
            check(err.err_type == dve.MLX5DV_MKEY_NO_ERR, "every T10-DIF the target held was valid")
            link.barrier("read")
            mkey.close()
            mr.close()
    finally:
        link.sock.close()
        qp.close()
        cq.close()
        pd.close()
        ctx.close()
    print("FAIL" if failures else "PASS", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
