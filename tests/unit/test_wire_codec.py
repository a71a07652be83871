"""The control protocol's C side against its Python side, without root or a daemon.

provider/wire.h is written from protocol/'s tables by tools/gen_wire_h.py; the
provider and librdmacm take the protocol version, request names, field keys, map
sizes and errno table from it. Here:

- the committed header is what the tables give today (a table changed without
  ``make -C provider wire.h`` fails, naming the command);
- ``provider/build/wirecheck`` (provider/tests/wirecheck.c: wire_enc.c, frame.c and
  mp.c, no libibverbs object) encodes a request of every kind from wire.h's table, and
  Python's ``decode_request`` must take each, with the values this test computes from
  protocol/'s tables; Python encodes a request of every kind, and the C side reads it
  against its table;
- the provider's own WR encoders (post_send of every enum ibv_wr_opcode, on RC and UD
  QPs, with 0 to 3 SGEs, bind_mw; post_recv) are decoded by Python and compared with
  what ibv_post_send(3) says each member of struct ibv_send_wr means;
- the provider's WC decoder reads what the daemon pushes (``WC.to_wire``);
- every errno name the daemon may send maps to its number, an unknown one to EIO;
- the C HELLO passes ``verify_hello``;
- docs/protocol.md's request table names every field of the requests it lists, and
  every field of their replies;
- the replies: protocol/replies.py's tables are wire.h's too; every reply and frame the
  daemon's real handlers send (two embedded daemons driven through a connected RC
  pair, rdma_cm, an async event, refusals) passes Python's check and the C side's
  reading of wire.h's tables (``reply VERB HEX``, ``frame KIND HEX``), a reply of every
  kind too; a renamed, missing or mistyped key is refused by both, nested maps and
  mkey_configure's attribute maps included;
- the provider, libmlx5 and librdmacm spell no key, frame kind, role, setter or rdma_cm
  event name of the wire as a string literal (wire.h's constants only).
"""

from __future__ import annotations

import asyncio
import difflib
import errno
import re
from pathlib import Path

import msgpack
import native
import pytest

from softhca.protocol import cm, cm_sidr  # noqa: F401  (their requests join BY_VERB)
from softhca.protocol.attrs import SGE
from softhca.protocol.control import BY_VERB, decode_request
from softhca.protocol.enums import WcOpcode, WcStatus, WrOpcode
from softhca.protocol.errors import ERRNO_NAMES, RDMAError
from softhca.protocol.frames import FrameError
from softhca.protocol.handshake import verify_hello
from softhca.protocol.records import SEND_WR, WC, WC_FIELDS, SendWR
from softhca.protocol.schema import U32, U64, check_fields
from softhca.tools.gen_wire_h import render

import e2e

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "provider" / "wire.h"


def test_committed_header_is_current():
    want = render()
    have = HEADER.read_text() if HEADER.exists() else ""
    diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                        "provider/wire.h (committed)",
                                        "protocol/'s tables", n=1))
    assert have == want, ("provider/wire.h differs from protocol/'s tables: run "
                          "`make -C provider wire.h` and rebuild the provider\n" + diff[:3000])


@pytest.fixture(scope="module")
def wire():
    """Lines of commands in, lines of answers out (one wirecheck run)."""
    return native.line_tool("wirecheck", needs=[(
        Path("/usr/include/infiniband/verbs.h"),
        "no <infiniband/verbs.h> (libibverbs-dev): wire_enc.c's structs")])


# -- every request kind ------------------------------------------------------------------

def sample_value(verb: str, key: str, spec: tuple):
    """A field's value by wirecheck.c's rule (its comment), computed from the Python
    spec: the C side computes it from wire.h's table."""
    typ, lo, hi, _ = spec
    if key == "credits":
        return [[1, 1]]
    if key == "pieces":
        return [[0, 0, 4096]]
    if key == "wrs" and verb == "post_send":
        return [SendWR(wr_id=1, opcode=WrOpcode.SEND, sg=[SGE(4096, 8, 5)]).to_wire()]
    if key == "wrs":
        return [{"wr_id": 1, "sg": [[4096, 8, 5]]}]
    if typ is bool:
        return True
    if typ in (int, (int, float)):
        return int(hi)
    n = max(lo, min(hi, 3))
    if typ is str:
        return "x" * n
    if typ is bytes:
        return b"\xab" * n
    assert lo == 0, (verb, key)
    return [] if typ is list else {}


# A request field of a nested kind whose decoder takes no empty value, which the C
# sample rule does not fill: faults_add's rule (server/faults.py checks its fields; the
# provider never sends it).
UNFILLED = {("faults_add", "rule")}


def sample_request(verb: str, required_only: bool = False) -> dict:
    return {"t": verb, "id": 7, **{k: sample_value(verb, k, spec)
                                   for k, spec in BY_VERB[verb].SCHEMA.items()
                                   if (verb, k) not in UNFILLED
                                   and (spec[3] or not required_only)}}


def decode(hex_: str) -> dict:
    header = msgpack.unpackb(bytes.fromhex(hex_), raw=False)
    assert isinstance(header, dict), hex_[:80]
    return header


def test_c_encodes_every_request_kind_python_decodes(wire):
    verbs = list(BY_VERB)
    answers = wire([f"req {v}" for v in verbs])
    unfilled = set()
    for verb, answer in zip(verbs, answers, strict=True):
        if answer.startswith("unfilled "):
            unfilled.add((verb, answer.split()[1]))
            continue
        header = decode(answer)
        assert header == sample_request(verb), f"{verb}: C's request differs: {header}"
        # The wire format: the fields, their types and bounds (EPROTO otherwise).
        check_fields(header, BY_VERB[verb].SCHEMA, verb)
        try:
            rid, req = decode_request(header, memoryview(b""))
        except RDMAError as e:
            # A verb's own judgement of the sample values (a port space that is not
            # RDMA_PS_TCP...) is not the format's; a malformed frame is.
            assert e.errno_name != "EPROTO", f"{verb}: Python refuses the C encoding: {e}"
            continue
        assert rid == 7 and req.VERB == verb
    assert unfilled == UNFILLED


def test_python_encodes_every_request_kind_c_reads(wire):
    cases = []
    for verb in BY_VERB:
        for required_only in (False, True):
            h = sample_request(verb, required_only)
            if (verb, "rule") in UNFILLED:
                h["rule"] = {"action": "drop"}
            cases.append((verb, h))
    answers = wire([f"check {msgpack.packb(h, use_bin_type=True).hex()}" for _, h in cases])
    for (verb, h), answer in zip(cases, answers, strict=True):
        assert answer == f"ok {verb} {len(h) - 2}", (verb, answer)


def test_c_and_python_refuse_alike(wire):
    """An unknown field, a missing required one, a value of the wrong type: the C
    table's reading and Python's decode_request both refuse each, naming it."""
    base = sample_request("create_qp")
    extra = {**base, "max_inline": 4}
    missing = {k: v for k, v in base.items() if k != "scq"}
    wrong = {**base, "sq_sig_all": 1}
    answers = wire([f"check {msgpack.packb(h, use_bin_type=True).hex()}"
                    for h in (extra, missing, wrong)])
    assert answers == ["bad unknown field max_inline of create_qp",
                       "bad missing scq of create_qp",
                       "bad field sq_sig_all of create_qp is not of type b"]
    for h, word in ((extra, "max_inline"), (missing, "scq"), (wrong, "sq_sig_all")):
        with pytest.raises(FrameError, match=word):
            decode_request(h, memoryview(b""))


# -- the provider's WR encoders ------------------------------------------------------------

IMM = {WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM}
INV = {WrOpcode.SEND_WITH_INV, WrOpcode.LOCAL_INV}


def expected_wr(ud: bool, op: WrOpcode, n: dict, sges: list[SGE]) -> SendWR:
    """struct ibv_send_wr's members as ibv_post_send(3) reads them, for the opcode."""
    atomic = op in (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD) or (
        op == WrOpcode.ATOMIC_WRITE and not sges)
    wr = SendWR(wr_id=n["wr_id"], opcode=op, sg=sges, send_flags=n["send_flags"],
                imm_data=n["imm"] if op in IMM else None,
                invalidate_rkey=n["inv"] if op in INV else 0)
    if ud:
        wr.ah, wr.remote_qpn, wr.remote_qkey = n["ah"], n["rqpn"] & 0xFFFFFF, n["rqkey"]
    elif op == WrOpcode.BIND_MW:
        wr.rkey = n["rkey"]
        wr.bind = (n["mw"], n["lkey"], n["baddr"], n["blen"], n["baccess"])
    else:
        wr.rkey, wr.remote_addr = n["rkey"], n["raddr"]
        if atomic:
            wr.compare_add, wr.swap = n["cmp"], n["swap"]
    return wr


def post_send_command(ud: bool, all_: bool, op: WrOpcode, n: dict, sges: list[SGE]) -> str:
    nums = [int(ud), int(all_), int(op), n["wr_id"], n["send_flags"], n["imm"], n["rkey"],
            n["raddr"], n["cmp"], n["swap"], n["inv"], n["ah"], n["rqpn"], n["rqkey"],
            n["mw"], n["lkey"], n["baddr"], n["blen"], n["baccess"], len(sges)]
    nums += [x for s in sges for x in (s.addr, s.length, s.lkey)]
    return "post_send " + " ".join(map(str, nums))


NUMBERS = [
    dict(wr_id=U64, send_flags=0xF, imm=0x12345678, rkey=U32, raddr=U64, cmp=U64 - 1,
         swap=1 << 63, inv=0xABCD0001, ah=U32, rqpn=(1 << 24) + 5, rqkey=0x80000000,
         mw=U32 - 1, lkey=7, baddr=U64 - 4096, blen=1 << 40, baccess=0xF),
    dict(wr_id=0, send_flags=0, imm=0, rkey=0, raddr=0, cmp=0, swap=0, inv=0, ah=1, rqpn=1,
         rqkey=0, mw=1, lkey=0, baddr=0, blen=0, baccess=0),
]
SGES = [[], [SGE(4096, 8, 5)], [SGE(U64, U32, U32), SGE(0, 0, 0), SGE(1 << 33, 4096, 9)]]


def test_c_post_send_every_opcode_python_decodes(wire):
    cases = []
    for op in WrOpcode:
        for ud in ((False, True) if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM) else (False,)):
            for i, (n, sges) in enumerate((n, s) for n in NUMBERS for s in SGES):
                cases.append((ud, bool(i % 2), op, n, sges))
    answers = wire([post_send_command(*c) for c in cases])
    for (ud, all_, op, n, sges), answer in zip(cases, answers, strict=True):
        what = f"{op.name} ud={ud} sges={len(sges)}"
        try:
            rid, req = decode_request(decode(answer), memoryview(b""))
        except FrameError as e:
            pytest.fail(f"post_send of {what}: Python refuses the C encoding: {e}")
        assert (req.VERB, req.qp, req.wr_complete) == ("post_send", 3, all_), what
        assert req.wrs == (expected_wr(ud, op, n, sges),), what


def test_c_post_recv_python_decodes(wire):
    answers = wire([f"post_recv {w} {len(s)} " + " ".join(f"{x.addr} {x.length} {x.lkey}"
                                                          for x in s)
                    for w in (0, U64) for s in SGES])
    for (w, s), answer in zip(((w, s) for w in (0, U64) for s in SGES), answers, strict=True):
        _, req = decode_request(decode(answer), memoryview(b""))
        assert (req.qp, [(x.wr_id, x.sg) for x in req.wrs]) == (3, [(w, s)])


# -- pushed completions, errnos, HELLO -------------------------------------------------------

def test_wc_list_order_is_the_table():
    wc = WC(wr_id=101, status=WcStatus(5), opcode=WcOpcode(1), byte_len=102, qp_num=103,
            imm_data=104, wc_flags=105, invalidated_rkey=106, vendor_err=107, src_qp=108)
    assert dict(zip(WC_FIELDS, wc.to_wire(), strict=True)) == {
        f: int(getattr(wc, f)) for f in WC_FIELDS}


WC_WITH_IMM, WC_WITH_INV = 1 << 1, 1 << 3     # enum ibv_wc_flags (verbs.h)


def test_c_reads_the_pushed_wcs(wire):
    wcs = [WC(U64, WcStatus.SUCCESS, WcOpcode.RECV, byte_len=U32, qp_num=0xFFFFFF,
              imm_data=0xDEADBEEF, wc_flags=WC_WITH_IMM),
           WC(1, WcStatus(5), WcOpcode.RECV, qp_num=9, invalidated_rkey=0x1234,
              wc_flags=WC_WITH_INV, vendor_err=0x5F01),
           WC(2, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, byte_len=40, qp_num=3,
              imm_data=0, wc_flags=WC_WITH_IMM, src_qp=0xABCDE),
           WC(3, WcStatus.SUCCESS, WcOpcode.SEND, qp_num=3)]
    header = {"t": "wc", "cq": 77, "wcs": [w.to_wire() for w in wcs]}
    answer, = wire([f"wc {msgpack.packb(header, use_bin_type=True).hex()}"])
    want = "cq=77" + "".join(
        f" {w.wr_id},{int(w.status)},{int(w.opcode)},{w.byte_len},{w.qp_num},{w.wc_flags},"
        f"{w.vendor_err},{w.src_qp},{w.imm_data or 0},{w.invalidated_rkey}" for w in wcs)
    assert answer == want


def test_every_errno_name_maps_to_its_number(wire):
    names = [*ERRNO_NAMES, "ENOPE", "EINVALX"]
    answers = wire([f"errno {n}" for n in names])
    got = dict(zip(names, map(int, answers), strict=True))
    assert got == {**{n: getattr(errno, n) for n in ERRNO_NAMES},
                   "ENOPE": errno.EIO, "EINVALX": errno.EIO}


def test_c_hello_is_the_protocol_version(wire):
    hello, = wire(["hello"])
    assert verify_hello(decode(hello), b"\0" * 32, None, None) == "control"


# -- docs/protocol.md ----------------------------------------------------------------------

def test_docs_request_table_names_every_field():
    """Each row of docs/protocol.md's control request table names every field its
    verbs take (a post_send's WR map's too)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    rows = [line for line in text.splitlines() if re.match(r"\| `[a-z_]+`", line)]
    missing = []
    seen = set()
    for row in rows:
        cells = row.split(" | ")
        verbs = [v for v in re.findall(r"`([a-z_0-9]+)`", cells[0]) if v in BY_VERB]
        if not verbs or len(cells) < 2:
            continue
        named = set(re.findall(r"`?([a-z_0-9]+)`?", cells[1]))
        for verb in verbs:
            seen.add(verb)
            fields = set(BY_VERB[verb].SCHEMA)
            if verb == "post_send":
                fields |= set(SEND_WR)
            missing += [f"{verb}.{f}" for f in sorted(fields - named)]
    assert {"post_send", "post_recv", "create_qp", "create_ah"} <= seen
    assert missing == [], f"docs/protocol.md's request table does not name {missing}"


# -- the provider's and librdmacm's request sites -------------------------------------------

C_SOURCES = sorted(p for p in [*(ROOT / "provider").glob("*.c"),
                               *(ROOT / "provider" / "rdmacm").glob("*.c")])
# Where a request's fields end: the call that sends it.
_SENT = re.compile(r"shca_call\(|shca_call_post\(|cm_call\(|\bcall\(&b|shca_send_oneway\(")


def _code(path: Path) -> str:
    """The file without its comments (a key named in a comment is not written)."""
    return re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)


def _function_keys(name: str) -> set[str]:
    """The keys a wire_enc.c function writes (a request's fields it writes for its caller)."""
    code = _code(ROOT / "provider" / "wire_enc.c")
    body = re.search(rf"\n\w[^\n]*\b{name}\([^)]*\)\n\{{\n(.*?)\n\}}\n", code, re.S)
    assert body, name
    return {k.lower() for k in re.findall(r"SHCA_K_(\w+)", body.group(1))}


def request_sites() -> list[tuple[str, str, str, set[str]]]:
    """(file:line, verb, count expression, keys written) of every request head whose
    verb is a wire.h name."""
    sites = []
    for path in C_SOURCES:
        code = _code(path)
        for m in re.finditer(r"\b(?:shca_begin|cm_begin|shca_wire_begin)\(([^;]*?)\);", code):
            args = [a.strip() for a in m.group(1).split(",")]
            verb = next((v for v in map(re.compile(r"SHCA_V_(\w+)").fullmatch, args) if v),
                        None)
            if verb is None:
                continue
            end = _SENT.search(code, m.end())
            body = code[m.end():end.start() if end else len(code)]
            keys = {k.lower() for k in re.findall(r"SHCA_K_(\w+)", body)}
            if "shca_wire_post_send(" in body:
                keys |= _function_keys("shca_wire_post_send")
            line = code[:m.start()].count("\n") + 1
            sites.append((f"{path.relative_to(ROOT)}:{line}", verb.group(1).lower(),
                          args[-1], keys))
    return sites


def test_request_sites_write_their_verbs_fields():
    """Each request the C libraries build names only fields of its verb (modify_qp's
    attr, a post's WRs aside: nested maps), and the count its head announces is the
    fields it writes: NREQ with exactly the required fields, NFIELDS with all of them."""
    nested = {"modify_qp": {"dest_host", "dest_port", "dest_dev"}}
    sites = request_sites()
    faults = []
    for where, verb, count, keys in sites:
        assert verb in BY_VERB, f"{where}: {verb} is not a request"
        schema = BY_VERB[verb].SCHEMA
        required = {k for k, spec in schema.items() if spec[3]}
        written = keys & set(schema)
        stray = keys - set(schema) - nested.get(verb, set())
        if stray:
            faults.append(f"{where}: {verb} has no field(s) {sorted(stray)}")
        if count == f"SHCA_NREQ_{verb.upper()}" and written != required:
            faults.append(f"{where}: {verb} announces its required fields "
                          f"{sorted(required)} and writes {sorted(written)}")
        if count.startswith(f"SHCA_NFIELDS_{verb.upper()}") and written != set(schema):
            faults.append(f"{where}: {verb} announces every field {sorted(schema)} "
                          f"and writes {sorted(written)}")
        if not required <= written:
            faults.append(f"{where}: {verb} lacks {sorted(required - written)}")
    assert len(sites) >= 30
    assert faults == []


def test_no_request_named_by_a_literal():
    """A verb is wire.h's SHCA_V_ name in the C libraries, never a string of its own."""
    verbs = "|".join(map(re.escape, BY_VERB))
    # (a reply's or welcome's field read by mp_find may share a verb's name: "devices")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in C_SOURCES
             for m in re.finditer(rf'(mp_find\w*\([^,]*, )?"({verbs})"', _code(p))
             if not m.group(1)]
    assert found == []


# -- replies and pushed frames: what the daemon's handlers answer, read by the C side ------

class Capture:
    """What the daemons of this process send, from their own builders: each ``ok``
    reply with the verb of the request it answers, each ``err`` frame, pushed
    completions and rdma_cm events, welcome frames."""

    def __init__(self) -> None:
        self.replies: list[tuple[str, dict]] = []
        self.frames: list[tuple[str, dict]] = []
        self._verbs: dict[tuple[int, int], str] = {}

    def install(self, monkeypatch) -> None:
        from softhca.protocol import replies, session
        from softhca.protocol.session import Call
        from softhca.server import cm as server_cm
        from softhca.server import daemon

        proto = session.ControlSession
        server_frame, reply, send_error = proto._server_frame, proto.reply, proto.send_error
        push_completions, push_event = proto.push_completions, proto.push_event

        def on_frame(s, fr, events):
            server_frame(s, fr, events)
            if events and type(events[-1]) is Call:
                self._verbs[(id(s), events[-1].rid)] = events[-1].request.VERB

        def on_reply(s, rid, payload=b"", **result):
            self.replies.append((self._verbs[(id(s), rid)], {"t": "ok", "id": rid, **result}))
            reply(s, rid, payload, **result)

        def on_error(s, rid, error):
            before = len(s._out)
            send_error(s, rid, error)
            self.frames.append(("err", _unframe(bytes(b"".join(s._out[before:])))))

        def on_wcs(s, cq, wcs):
            self.frames.append(("wc", {"t": "wc", "cq": cq, "wcs": wcs}))
            push_completions(s, cq, wcs)

        def on_event(s, header, payload=b""):
            if "cm" in header:
                self.frames.append(("cm_event", {**header, "t": "event"}))
            push_event(s, header, payload)

        def on_built(kind, **fields):
            header = replies.frame(kind, **fields)
            if kind == "welcome":
                self.frames.append((kind, dict(header)))
            return header

        monkeypatch.setattr(proto, "_server_frame", on_frame)
        monkeypatch.setattr(proto, "reply", on_reply)
        monkeypatch.setattr(proto, "send_error", on_error)
        monkeypatch.setattr(proto, "push_completions", on_wcs)
        monkeypatch.setattr(proto, "push_event", on_event)
        monkeypatch.setattr(daemon, "frame", on_built)
        monkeypatch.setattr(server_cm, "frame", on_built)


def _unframe(data: bytes) -> dict:
    from softhca.protocol.frames import FrameDecoder

    frames = FrameDecoder(1 << 20).feed(data)
    assert len(frames) == 1, len(frames)
    return dict(frames[0].header)


async def _cm_events(node, qpn: int) -> None:
    """rdma_cm on one daemon: a listener and an id that resolves its address and route
    and connects (connect_request, connect_response, established), then disconnects."""
    listen = (await node.request("cm_create_id", ps=0x0106))[0]["cmid"]
    port = (await node.request("cm_bind", cmid=listen, ip="127.0.0.1", port=0))[0]["port"]
    await node.request("cm_listen", cmid=listen, backlog=4)
    active = (await node.request("cm_create_id", ps=0x0106))[0]["cmid"]
    await node.request("cm_resolve_addr", cmid=active, ip="127.0.0.1", port=port,
                       timeout_ms=2000)
    await asyncio.sleep(0.2)
    await node.request("cm_resolve_route", cmid=active, timeout_ms=2000)
    await asyncio.sleep(0.1)
    await node.request("cm_connect", cmid=active, qpn=qpn, psn=7, responder_resources=1,
                       initiator_depth=1, retry_count=7, rnr_retry_count=7)
    await asyncio.sleep(0.2)
    await node.request("cm_counts")
    await node.request("cm_destroy_id", cmid=active)
    await node.request("cm_destroy_id", cmid=listen)


async def _drive(pair) -> None:
    """Every request kind the daemon answers with fields, on the pair's two daemons."""
    import softhca.client as sh

    t, i = pair.target, pair.initiator
    n = t.node
    ctx = t.ctx.handle
    pd = t.pd.handle
    await n.request("devices")
    await n.request("query_device", ctx=ctx)
    await n.request("query_mlx5_device", ctx=ctx)
    mr = await t.reg_mr(b"x" * 4096)
    await mr.read(16)
    h = mr.handle
    await n.request("rereg_mr", mr=h, flags=sh.IBV_REREG_MR_CHANGE_ACCESS,
                    access=sh.IBV_ACCESS_LOCAL_WRITE)
    mw = (await n.request("alloc_mw", pd=pd, type=2))[0]["mw"]
    await n.request("dealloc_mw", mw=mw)
    cq = (await n.request("create_cq", ctx=ctx, cqe=16))[0]["cq"]
    await n.request("resize_cq", cq=cq, cqe=32)
    await n.request("poll_cq", cq=cq, num=4, timeout=0)
    await n.request("poll_cq", cq=cq, num=4, timeout=0.05)     # waits, answered later
    await n.request("destroy_cq", cq=cq)
    await n.request("query_qp", qp=t.qp.handle)
    await n.request("modify_qp", qp=t.qp.handle, attr={"qp_access_flags": e2e.ALL},
                    mask=sh.IBV_QP_ACCESS_FLAGS)
    ah = (await n.request("create_ah", pd=pd, dest_host=i.node.host, dest_port=i.node.port,
                          dest_dev="mlx5_0", sgid=bytes(16), dgid=bytes(16)))[0]["ah"]
    await n.request("destroy_ah", ah=ah)
    srq = (await n.request("create_srq", pd=pd, max_wr=8, max_sge=1, srq_limit=0))[0]["srq"]
    await n.request("modify_srq", srq=srq, mask=2, srq_limit=4)
    await n.request("query_srq", srq=srq)
    await n.request("destroy_srq", srq=srq)
    mkey = await t.pd.create_mkey(e2e.SIG_FLAGS, 4)
    await t.configure(mkey, access=e2e.ALL, sges=[e2e.sge(mr, 512)])
    await n.request("mkey_check", mkey=mkey.handle)
    await n.request("crypto_login_query_state", ctx=ctx)
    await n.request("get_async_event", ctx=ctx, timeout=0)
    rule = (await n.request("faults_add", rule={"action": "drop", "count": 1}))[0]["rule"]
    await n.request("faults_list")
    await n.request("faults_clear", rule_id=rule["id"])
    await n.request("counters")
    await n.request("subscribe", events=[])
    # a SEND and its RECV: pushed completions on both sides
    dst = await i.reg_mr(64)
    await pair.send(t, [e2e.sge(mr, 64)], i, e2e.whole(dst))
    # mlx5dv_qp_cancel_posted_send_wrs(3): the QP drained (SQD) first, with the
    # IBV_EVENT_SQ_DRAINED event asked for (an async event to take and acknowledge)
    await n.request("modify_qp", qp=t.qp.handle, attr={"qp_state": 4,
                                                       "en_sqd_async_notify": 1},
                    mask=sh.IBV_QP_STATE | sh.IBV_QP_EN_SQD_ASYNC_NOTIFY)
    await n.request("cancel_posted_send_wrs", qp=t.qp.handle, wr_id=1)
    event = (await n.request("get_async_event", ctx=ctx, timeout=5))[0]["event"]
    await n.request("ack_async_event", event=event["event"])
    # refusals: err frames, one with the refused WR's index (ibv_post_send's bad_wr)
    bad = sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=[e2e.sge(dst, 8)] * 9)
    for node, verb, fields in (
            (n, "dealloc_pd", {"pd": 99}),
            (i.node, "post_send", {"qp": i.qp.handle, "wrs": [bad.to_wire()]})):
        with pytest.raises(RDMAError):
            await node.request(verb, **fields)
    await _cm_events(i.node, i.qp.qp_num)


# Reply kinds with fields the scenario above does not provoke, and why: each is read by
# the C side from the table all the same (test_c_reads_a_reply_of_every_kind).
NOT_DRIVEN = {
    "reg_mr_shared": "a local program's memfds over the UNIX socket (tests/native)",
    "reg_mr_process": "the embedded daemon's own memory, with its process secret",
    "create_dek": "a crypto login first (tests/e2e's crypto tests)",
    "query_dek": "a DEK", "create_crypto_login": "a wrapped credential",
    "crypto_login_query": "a crypto login object",
}


def _hex(header: dict) -> str:
    return msgpack.packb(header, use_bin_type=True).hex()


async def test_every_reply_and_pushed_frame_the_daemon_sends_c_reads(wire, monkeypatch):
    from softhca.protocol.replies import REPLIES, check_frame, check_reply

    cap = Capture()
    cap.install(monkeypatch)
    async with e2e.two_nodes() as pair:
        await _drive(pair)
    driven = {verb for verb, _ in cap.replies}
    with_fields = {verb for verb, spec in REPLIES.items() if spec}
    assert with_fields - driven == set(NOT_DRIVEN), sorted((with_fields - driven)
                                                           ^ set(NOT_DRIVEN))
    for verb, header in cap.replies:
        check_reply(verb, {k: v for k, v in header.items() if k not in ("t", "id")})
    answers = wire([f"reply {verb} {_hex(h)}" for verb, h in cap.replies])
    for (verb, h), answer in zip(cap.replies, answers, strict=True):
        assert answer == f"ok {verb} {len(h) - 2}", (verb, h, answer)
    assert any(h.get("event") for verb, h in cap.replies if verb == "get_async_event")
    assert any("bad_wr" in h for kind, h in cap.frames if kind == "err")
    kinds = {kind for kind, _ in cap.frames}
    assert kinds == {"welcome", "err", "wc", "cm_event"}, kinds
    cm_kinds = {h["cm"] for kind, h in cap.frames if kind == "cm_event"}
    assert {"addr_resolved", "route_resolved", "connect_request"} <= cm_kinds, cm_kinds
    for kind, h in cap.frames:
        check_frame(kind, h)
    answers = wire([f"frame {kind} {_hex(h)}" for kind, h in cap.frames])
    for (kind, h), answer in zip(cap.frames, answers, strict=True):
        fields = len([k for k in h if k not in ("t", "id")])
        assert answer == f"ok {kind} {fields}", (kind, h, answer)


def sample_reply_value(path: str, key: str, spec: tuple):
    """A value of a reply field by its spec, a nested map's from its own table."""
    from softhca.protocol.replies import MAPS

    typ, lo, hi, _ = spec
    if isinstance(typ, tuple) and typ[1] is type(None):
        typ = typ[0]
    if f"{path}.{key}" in MAPS:
        return sample_map(f"{path}.{key}", MAPS[f"{path}.{key}"])
    if typ is bool:
        return True
    if typ is int:
        return int(hi)
    n = 3 if lo is None else max(lo, min(hi, 3))
    return {str: "x" * n, bytes: b"\xab" * n, list: [], dict: {}}[typ]


def sample_map(path: str, schema: dict) -> dict:
    return {k: sample_reply_value(path, k, spec) for k, spec in schema.items()}


def test_c_reads_a_reply_of_every_kind(wire):
    """A reply of every kind, each field by its table (those the scenario above does not
    provoke included), every nested map filled: Python's check and the C table agree."""
    from softhca.protocol.replies import REPLIES, check_reply

    cases = [(verb, {"t": "ok", "id": 9, **sample_map(verb, spec)})
             for verb, spec in REPLIES.items()]
    for verb, h in cases:
        check_reply(verb, {k: v for k, v in h.items() if k not in ("t", "id")})
    answers = wire([f"reply {verb} {_hex(h)}" for verb, h in cases])
    assert answers == [f"ok {verb} {len(h) - 2}" for verb, h in cases]


def test_c_and_python_refuse_a_drifted_reply(wire):
    """A reply whose key one side renamed, a required field missing, a value of another
    type, a nested map's key renamed, a stray one: both tables refuse each, naming it."""
    from softhca.protocol.replies import MAPS, REPLIES, check_reply

    qp = {"t": "ok", "id": 3, **sample_map("create_qp", REPLIES["create_qp"])}
    renamed = {"t": "ok", "id": 3, "qp": 1, "qpn": 5}
    missing = {"t": "ok", "id": 3, "qp": 1}
    wrong = {**qp, "qp_num": "5"}
    attr = sample_map("query_qp.attr", MAPS["query_qp.attr"])
    nested = {"t": "ok", "id": 3, "attr": {**{k: v for k, v in attr.items() if k != "qkey"},
                                           "q_key": 1}}
    stray = {**qp, "handle": 1}
    cases = [("create_qp", renamed, "unknown field qpn of create_qp", "qpn"),
             ("create_qp", missing, "missing qp_num of create_qp", "qp_num"),
             ("create_qp", wrong, "field qp_num of create_qp is not of type u", "qp_num"),
             ("query_qp", nested, "unknown field q_key of query_qp.attr", "q_key"),
             ("create_qp", stray, "unknown field handle of create_qp", "handle")]
    answers = wire([f"reply {verb} {_hex(h)}" for verb, h, _, _ in cases])
    assert answers == [f"bad {why}" for _, _, why, _ in cases]
    for verb, h, _, word in cases:
        with pytest.raises(FrameError, match=word):
            check_reply(verb, {k: v for k, v in h.items() if k not in ("t", "id")})


def test_c_reads_the_handshake_frames(wire):
    """The daemon's challenge and a daemon's HELLO on a wire link with its proof (their
    builders), the C HELLO, and a welcome missing its role."""
    from softhca.protocol.handshake import make_challenge, make_hello
    from softhca.protocol.replies import check_frame

    challenge, _ = make_challenge(auth=True)
    link_hello = make_hello(challenge, "wire", b"k" * 32, src="127.0.0.1:4791")
    for kind, h in (("challenge", challenge), ("hello", link_hello)):
        check_frame(kind, h)
    hello, = wire(["hello"])
    answers = wire([f"frame challenge {_hex(challenge)}", f"frame hello {hello}",
                    f"frame hello {_hex(link_hello)}",
                    f"frame welcome {_hex({'t': 'welcome', 'devices': []})}"])
    assert answers == ["ok challenge 3", "ok hello 2", "ok hello 4",
                       "bad missing role of welcome"]


def test_c_reads_mkey_configure_attribute_maps(wire):
    """mlx5dv_wr_set_mkey_sig_block's and mlx5dv_wr_set_mkey_crypto's maps as
    protocol/attrs_wire.py writes them (what the daemon reads back), against the C side's
    tables; a key of another struct is refused at its depth."""
    from softhca.protocol.attrs import (
        CryptoAttr,
        SigBlockAttr,
        SigBlockDomain,
        SigCrc,
        SigT10dif,
    )
    from softhca.protocol.attrs_wire import attr_to_wire
    from softhca.protocol.enums import SigType

    sig = attr_to_wire(SigBlockAttr(
        mem=SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(app_tag=7)),
        wire=SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(seed=1)), check_mask=0xFF))
    crypto = attr_to_wire(CryptoAttr(encrypt_on_tx=True))
    drifted = {**sig, "wire": {**sig["wire"], "crc": {"type": 1, "seed": 1}}}
    answers = wire([f"frame mkey_configure.sig_block {_hex(sig)}",
                    f"frame mkey_configure.crypto {_hex(crypto)}",
                    f"frame mkey_configure.sig_block {_hex(drifted)}"])
    assert answers == ["ok mkey_configure.sig_block 6", "ok mkey_configure.crypto 8",
                       "bad unknown field type of mkey_configure.sig_block.wire.crc"]


def test_dv_writes_the_attribute_maps_keys():
    """provider/dv.c names exactly the attribute maps' keys (protocol/attrs.py's
    records' fields), and announces each map's size by its struct's wire.h count."""
    from softhca.protocol.replies import ATTR_MAPS, attr_spec, attr_struct

    code = _code(ROOT / "provider" / "dv.c")
    keys = {k.lower() for k in re.findall(r"SHCA_A_(\w+)", code)}
    assert keys == {k for cls in ATTR_MAPS.values() for k in attr_spec(cls)}
    counts = set(re.findall(r"mp_map\(b, SHCA_ATTR_NFIELDS_(\w+)\)", code))
    assert counts == {attr_struct(cls).upper() for cls in ATTR_MAPS.values()}
    assert not re.search(r"mp_map\(b, \d+\)", code)


# -- no key of the wire spelled in the C libraries -----------------------------------------

# String literals in the provider's and librdmacm's C that equal a word of the wire and
# are not one: file, literal, why.
LITERAL_ALLOWED = {
    ("provider/qp.c", "attr"): "ibv_query_qp's log line names its argument (attr or "
                               "init_attr), not a reply's key",
}
# Calls whose string argument would be a key or a frame kind.
_KEYED = re.compile(r"\b(mp_find|mp_find_uint|shca_get_u32|mp_kv_uint|mp_kv_str|mp_str|"
                    r"mp_str_eq|u8|expect|addr_of|gid_of|shca_hello_begin|setter)"
                    r"\(([^;{]*?)\"([^\"\\\\]*)\"")


def _wire_words() -> set[str]:
    from softhca.protocol.control import CONFIGURE_CALL, QP_ATTR, SETTERS, SYSV_PIECE
    from softhca.protocol.kinds import FrameKind
    from softhca.protocol.records import RECV_WR
    from softhca.protocol.replies import (
        ATTR_MAPS,
        CM_EVENTS,
        FRAMES,
        HELLO_ROLES,
        MAPS,
        REPLIES,
        attr_spec,
    )

    tables = [*REPLIES.values(), *FRAMES.values(), *MAPS.values(), SEND_WR, RECV_WR,
              QP_ATTR, *(cls.SCHEMA for cls in BY_VERB.values()),
              *(attr_spec(cls) for cls in ATTR_MAPS.values())]
    return ({k for t in tables for k in t} | {k.value for k in FrameKind} | set(CM_EVENTS)
            | set(HELLO_ROLES) | set(SETTERS) | set(BY_VERB)
            | {CONFIGURE_CALL[0], SYSV_PIECE, "t", "id"})


def test_no_wire_key_spelled_in_the_c_libraries():
    """Every key, frame kind, role, setter and rdma_cm event name the provider, libmlx5
    and librdmacm read or write is wire.h's constant: no string literal equal to one of
    protocol/'s words (LITERAL_ALLOWED aside, with its reason), and no literal at all
    where a key goes (mp_find, mp_kv_uint, shca_get_u32, ...)."""
    words = _wire_words()
    found = []
    for p in [*C_SOURCES, *sorted((ROOT / "provider" / "mlx5").glob("*.c"))]:
        # (the comments blanked, their lines kept: a finding names its line)
        code = re.sub(r"/\*.*?\*/", lambda c: re.sub(r"[^\n]", " ", c.group(0)),
                      p.read_text(), flags=re.S)
        rel = str(p.relative_to(ROOT))
        for m in re.finditer(r'"((?:[^"\\\n]|\\.)*)"', code):
            if m.group(1) in words and (rel, m.group(1)) not in LITERAL_ALLOWED:
                found.append(f"{rel}:{code[:m.start()].count(chr(10)) + 1} \"{m.group(1)}\"")
        found += [f"{rel}:{code[:m.start()].count(chr(10)) + 1} {m.group(1)}(\"{m.group(3)}\")"
                  for m in _KEYED.finditer(code) if "(" not in m.group(2)]
    assert found == []
    for (rel, word), _why in LITERAL_ALLOWED.items():
        assert f'"{word}"' in _code(ROOT / rel), f"{rel} no longer spells {word!r}: drop it"


def test_docs_request_table_names_every_reply_field():
    """Each row of docs/protocol.md's control request table names, in its result column,
    every field of its verbs' replies (protocol/replies.py REPLIES)."""
    from softhca.protocol.replies import REPLIES

    text = (ROOT / "docs" / "protocol.md").read_text()
    missing, checked = [], 0
    for row in (line for line in text.splitlines() if re.match(r"\| `[a-z_]+`", line)):
        cells = row.split(" | ")
        verbs = [v for v in re.findall(r"`([a-z_0-9]+)`", cells[0]) if v in REPLIES]
        if not verbs or len(cells) < 3:
            continue
        named = set(re.findall(r"`?([a-z_0-9]+)`?", cells[2]))
        checked += sum(len(REPLIES[v]) for v in verbs)
        missing += [f"{v}.{f}" for v in verbs for f in REPLIES[v] if f not in named]
    assert checked >= 40
    assert missing == [], f"docs/protocol.md's request table does not name {missing}"


async def test_the_daemon_sends_no_reply_its_table_does_not_describe(monkeypatch):
    """A handler whose reply has a field protocol/replies.py does not name, or a value
    of another type, answered at once or later (a wait's reply_to): the daemon sends the
    client an internal error instead, so no C library meets a key wire.h lacks."""
    import softhca.client as sh
    from softhca.protocol import control
    from softhca.server import verbs

    def later(v, r, rid):
        asyncio.get_running_loop().call_soon(
            lambda: v.session.reply_to("devices", rid, devices="mlx5_0"))

    async with sh.embedded() as node:
        monkeypatch.setitem(verbs.HANDLERS, control.Devices,
                            lambda v, r, rid: {"devices": [], "names": []})
        with pytest.raises(RDMAError, match=r"EPROTO.*internal error.*names"):
            await node.request("devices")
        monkeypatch.setitem(verbs.HANDLERS, control.Devices, later)
        with pytest.raises(RDMAError, match=r"EPROTO.*internal error.*devices"):
            await node.request("devices")
        monkeypatch.undo()
        assert (await node.request("devices"))[0]["devices"] == ["mlx5_0"]
