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
- docs/protocol.md's request table names every field of the requests it lists.
"""

from __future__ import annotations

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
