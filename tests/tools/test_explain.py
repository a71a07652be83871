"""``softhca explain``: the pipelines a configuration implies, against the man pages.

The table of mlx5dv_wr_set_mkey_crypto(3) is copied here, column by column, as the
page prints it (Memory, Op1, Op2, Op3, Wire, encrypt_on_tx, signature_crypto_order);
for every row, ``softhca explain --row X --json`` must list the row's Op1, Op2, Op3 as
its TX operations, in that order, and their inverse, in the reverse order, for RX, and
name the row's memory and wire images. The stage lists are checked too, translated
from the same columns by the test itself (a SIG.mem on TX is a check, SIG.wire a
generate, a signature with none on the other side a strip).
"""

from __future__ import annotations

import json
import re

import pytest

from softhca.engine.signature import computed_copy_mask, validate_sig_block_attr
from softhca.tools import explain
from softhca.tools.cli import main

# mlx5dv_wr_set_mkey_crypto(3), the table (capitalisation as printed: "Encrypt On TX" in B).
# Deliberately literals, not softhca.tools.crypto_table.TABLE: explain's row
# configurations come from that module, and a test that read the table from it too
# could not catch a wrong row there.
MAN_PAGE_TABLE = {
    # row: (Memory, Op1, Op2, Op3, Wire, encrypt_on_tx, signature_crypto_order)
    "A": ("data", "Encrypt on TX", "SIG.mem = none", "SIG.wire = none", "enc(data)", True,
          "Doesn't matter"),
    "B": ("data", "Encrypt On TX", "SIG.mem = none", "SIG.wire = SIG", "enc(data)+SIG", True,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "C": ("data", "SIG.mem = none", "SIG.wire = SIG", "Encrypt on TX", "enc(data+SIG)", True,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "D": ("data+SIG", "SIG.mem = SIG", "SIG.wire = none", "Encrypt on TX", "enc(data)", True,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "E": ("data+SIG1", "SIG.mem = SIG1", "SIG.wire = SIG2", "Encrypt on TX", "enc(data+SIG2)",
          True, "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "F": ("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = none", "data", False,
          "Doesn't matter"),
    "G": ("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = SIG", "data+SIG", False,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "H": ("enc(data+SIG)", "Decrypt on TX", "SIG.mem = SIG", "SIG.wire = none", "data", False,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "I": ("enc(data+SIG1)", "Decrypt on TX", "SIG.mem = SIG1", "SIG.wire = SIG2", "data+SIG2",
          False, "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "J": ("enc(data)+SIG", "SIG.mem = SIG", "SIG.wire = none", "Decrypt on TX", "data", False,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
}


def norm(op: str) -> str:
    return re.sub(r"\s+", " ", op.strip().lower())


def inverse(op: str) -> str:
    """The RX counterpart of a TX operation: the crypto op flips, the signature of a
    domain stays the signature of that domain."""
    return {"encrypt on tx": "decrypt on rx", "decrypt on tx": "encrypt on rx"}.get(op, op)


def stages_from_ops(ops: list[str], direction: str) -> list[str]:
    """The engine's stage names for a list of table operations: the input side's SIG is
    checked, the output side's generated (or, when it is none, the input's stripped)."""
    src = "mem" if direction == "TX" else "wire"
    out = ["gather" if direction == "TX" else "wire"]
    in_sig = "none"
    for op in ops:
        m = re.fullmatch(r"sig\.(mem|wire) = (\w+)", op)
        if m is None:
            out.append(op.split()[0])                  # encrypt / decrypt
        elif m.group(1) == src:
            in_sig = m.group(2)
            if in_sig != "none":
                out.append("check")
        elif m.group(2) != "none":
            out.append("generate")
        elif in_sig != "none":
            out.append("strip")
    out.append("wire" if direction == "TX" else "scatter")
    return out


def run_json(capsys, *argv: str) -> dict:
    assert main(["explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("row", sorted(MAN_PAGE_TABLE))
def test_row_matches_the_man_page_table(row, capsys):
    memory, op1, op2, op3, wire, eot, order = MAN_PAGE_TABLE[row]
    doc = run_json(capsys, "--row", row)
    tx_ops = [norm(o) for o in doc["tx"]["table_ops"]]
    assert tx_ops == [norm(op1), norm(op2), norm(op3)]
    # RX undoes TX: the inverse operations in the reverse order.
    assert [norm(o) for o in doc["rx"]["table_ops"]] == [inverse(o) for o in reversed(tx_ops)]
    assert doc["layout"]["memory"]["image"] == memory
    assert doc["layout"]["wire"]["image"] == wire
    assert doc["config"]["crypto"]["encrypt_on_tx"] is eot
    if order == "Doesn't matter":
        assert doc["config"]["memory"] is None and doc["config"]["wire"] is None
        assert any("does not matter" in n for n in doc["notes"])
    else:
        assert doc["config"]["crypto"]["signature_crypto_order"] == order
    assert doc["tx"]["stages"] == stages_from_ops(tx_ops, "TX")
    assert doc["rx"]["stages"] == stages_from_ops([inverse(o) for o in reversed(tx_ops)], "RX")
    assert [s["step"] for s in doc["tx"]["steps"]] == list(range(1, len(doc["tx"]["stages"]) + 1))
    assert doc["warnings"] == []


def test_row_c_text(capsys):
    assert main(["explain", "--row", "C"]) == 0
    out = capsys.readouterr().out
    steps = re.findall(r"^  (\d)\. (.*)$", out, re.M)
    tx = [text for n, text in steps[:4]]
    assert tx[0] == "gather memory: data (512B per block)"
    assert tx[1].startswith("generate SIG (T10-DIF: guard = CRC16 (T10-DIF, poly 0x8BB7, "
                            "seed 0x0000) over the data; app tag = 0xbeef; ref tag = "
                            "0x00002000 + block index (REF_REMAP))")
    assert tx[2].startswith("encrypt data+SIG with AES-XTS-256 on the wire stream, data units "
                            "of 520B, tweak = initial_tweak + unit")
    assert tx[3] == "wire: enc(data+SIG) (520B per block)"
    assert [n for n, _ in steps] == ["1", "2", "3", "4", "1", "2", "3", "4", "5"]
    assert re.search(r"^  memory +data +\| data 512 \| +512B$", out, re.M)
    assert re.search(r"^  wire +enc\(data\+SIG\) +\| enc\( data 512 \| guard 2 \| app 2 \| "
                     r"ref 4 \) \| +520B$", out, re.M)
    assert "TX (memory -> wire), in the table's terms: SIG.mem = none, SIG.wire = SIG, " \
           "Encrypt on TX" in out
    assert "RX (wire -> memory), in the table's terms: Decrypt on RX, SIG.wire = SIG, " \
           "SIG.mem = none" in out
    assert "RX checked    wire SIG: guard (G1 G0), app (A1 A0), ref (R3 R2 R1 R0)" in out
    assert "TX generated  wire SIG: guard (G1 G0), app (A1 A0), ref (R3 R2 R1 R0)" in out
    assert "\x1b[" not in out


def test_row_c_from_flags_is_row_c(capsys):
    """The same configuration given as flags explains the same way as --row C."""
    row = run_json(capsys, "--row", "c")
    flags = run_json(capsys, "--wire", "t10dif:block=512,bg=crc,app=0xbeef,ref=0x2000,"
                     "flags=ref_remap", "--check-mask", "0xff",
                     "--crypto", "aes-xts:encrypt_on_tx=1,order=before,dus=520,"
                     "tweak=0x112233445566778899aabbccddeeff00")
    for key in ("tx", "rx", "layout", "names"):
        assert flags[key] == row[key]


def test_sig_block_examples_from_flags(capsys):
    """mlx5dv_wr_set_mkey_sig_block(3): example 1 / 1.1 (memory CRC32) and 2 / 2.1 (wire
    T10-DIF every 4K)."""
    doc = run_json(capsys, "--mem", "crc32:block=512,seed=0xffffffff", "--check-mask", "crc32")
    assert doc["tx"]["stages"] == ["gather", "check", "strip", "wire"]
    assert doc["rx"]["stages"] == ["wire", "generate", "scatter"]
    assert doc["layout"]["memory"]["map"] == "| data 512 | crc32 4 |"
    assert doc["tx"]["checked"] == [{"domain": "memory", "sig": "SIG", "field": "crc32",
                                     "bytes": ["C3", "C2", "C1", "C0"]}]
    doc = run_json(capsys, "--wire", "t10dif:block=4096,bg=0xffff,app=0x5a5a,ref=0x1000,"
                   "flags=ref_remap", "--check-mask", "0xff")
    assert doc["tx"]["stages"] == ["gather", "generate", "wire"]
    assert doc["rx"]["stages"] == ["wire", "check", "strip", "scatter"]
    assert doc["layout"]["wire"]["block_bytes"] == 4104
    assert [c["field"] for c in doc["rx"]["checked"]] == ["guard", "app", "ref"]
    assert "seed 0xffff" in doc["rx"]["steps"][1]["text"]
    assert "0x00001000 + block index (REF_REMAP)" in doc["rx"]["steps"][1]["text"]


def test_copy_mask_is_computed_as_the_device_does(capsys):
    doc = run_json(capsys, "--mem", "t10dif:app=0x1234,ref=0x10", "--wire",
                   "t10dif:app=0x1234,ref=0x20", "--check-mask", "guard,app")
    c = doc["config"]
    assert (c["copy_mask"], c["copy_mask_given"]) == (0xF0, False)
    assert "ref tag generated (ref_tag differs)" in c["copy_mask_why"]
    assert [(x["field"], x["from"]) for x in doc["tx"]["copied"]] == [("guard", "SIG1"),
                                                                     ("app", "SIG1")]
    assert [x["field"] for x in doc["tx"]["generated"]] == ["ref"]
    assert [x["field"] for x in doc["tx"]["checked"]] == ["guard", "app"]
    assert doc["tx"]["stages"] == ["gather", "check", "generate", "wire"]
    assert doc["layout"]["memory"]["image"] == "data+SIG1"
    assert doc["layout"]["wire"]["image"] == "data+SIG2"


# docs/semantics.md section 6, step 2, written out: nothing unless both domains have the
# same sig_type and block_size; a CRC whole when the CRC types match; a T10DIF's guard
# (0xc0) when bg_type and bg match, app (0x30) when app_tag does, ref (0x0f) when ref_tag does.
@pytest.mark.parametrize("mem, wire, want", [
    ("t10dif:app=1,ref=2", "t10dif:app=1,ref=2", 0xFF),
    ("t10dif:bg=0xffff", "t10dif", 0x3F),
    ("t10dif:bg=csum", "t10dif:bg=crc,app=5", 0x0F),
    ("crc32c", "crc32c:seed=ones", 0xFF),
    ("crc32", "crc32c", 0),
    ("crc64", "t10dif", 0),
    ("none", "crc64", 0),
])
def test_computed_copy_mask_is_the_pages_rule(mem, wire, want, capsys):
    """explain shows the copy mask the engine computes (one rule, engine/signature.py);
    both against the rule as written above."""
    cfg = explain.Config(explain.parse_domain(mem), explain.parse_domain(wire))
    spec = validate_sig_block_attr(explain.to_attr(cfg))
    assert computed_copy_mask(spec.mem, spec.wire) == spec.copy_mask == want
    doc = run_json(capsys, "--mem", mem, "--wire", wire)
    assert (doc["config"]["copy_mask"], doc["config"]["copy_mask_given"]) == (want, False)


def test_given_copy_mask_and_partial_check_mask(capsys):
    doc = run_json(capsys, "--mem", "t10dif", "--wire", "t10dif", "--copy-mask", "0x0f",
                   "--check-mask", "0x80")
    assert doc["config"]["copy_mask_given"] and doc["config"]["copy_mask"] == 0x0F
    assert [x["field"] for x in doc["rx"]["copied"]] == ["ref"]
    assert [x["field"] for x in doc["rx"]["generated"]] == ["guard", "app"]
    assert doc["rx"]["checked"] == [{"domain": "wire", "sig": "SIG", "field": "guard",
                                     "bytes": ["G1"]}]
    assert "(byte G1 only)" in doc["rx"]["steps"][1]["text"]


def test_crypto_without_signature_and_plain(capsys):
    doc = run_json(capsys, "--crypto", "aes-xts:encrypt_on_tx=0,order=before,dus=4096,key=128")
    assert doc["tx"]["stages"] == ["gather", "decrypt", "wire"]
    assert doc["config"]["crypto_stream"] == "memory"
    assert doc["layout"]["memory"]["image"] == "enc(data)"
    assert "AES-XTS-128" in doc["tx"]["steps"][1]["text"]
    doc = run_json(capsys, "--mem", "none", "--wire", "none")
    assert (doc["tx"]["stages"], doc["rx"]["stages"]) == (["gather", "wire"],
                                                          ["wire", "scatter"])


def test_a_check_on_ciphertext_is_warned_about(capsys):
    """Memory SIG with the crypto on the memory stream and TX encrypting: TX would check
    the memory PI after encrypting it. Not a table row; explain says what goes wrong."""
    doc = run_json(capsys, "--mem", "t10dif", "--check-mask", "0xff", "--crypto",
                   "aes-xts:encrypt_on_tx=1,order=after")
    assert doc["tx"]["stages"] == ["gather", "encrypt", "check", "strip", "wire"]
    assert any("checked where it is not in the clear" in w for w in doc["warnings"])


@pytest.mark.parametrize("argv, message", [
    (["--mem", "foo"], "argument --mem: unknown signature type 'foo'"),
    (["--wire", "t10dif:block=500"], "block=500: not an mlx5dv_block_size"),
    (["--mem", "t10dif:blk=512"], "unknown key 'blk' for t10dif"),
    (["--mem", "t10dif:app"], "'app' is not KEY=VALUE"),
    (["--mem", "crc32:seed=zz"], "seed='zz' is not a number"),
    (["--mem", "t10dif:flags=remap"], "unknown T10-DIF flag 'remap'"),
    (["--mem", "t10dif:bg_type=xor"], "bg_type='xor': the guard types are crc and csum"),
    (["--row", "K"], "argument --row: 'K' is not a row of the crypto table"),
    (["--row", "C", "--wire", "none"], "--row selects a whole configuration"),
    ([], "nothing to explain"),
    (["--mem", "crc32", "--check-mask", "0x100"], "check_mask and copy_mask are 8-bit masks"),
    (["--mem", "crc32", "--check-mask", "gard"], "'gard' is not a mask"),
    (["--crypto", "aes-gcm"], "unknown crypto standard 'aes-gcm'"),
    (["--crypto", "aes-xts:order=sideways"], "order='sideways': give before"),
    (["--crypto", "aes-xts:encrypt_on_tx=maybe"], "encrypt_on_tx='maybe': give 1 or 0"),
    (["--crypto", "aes-xts:dus=100"], "dus=100: not an mlx5dv_block_size"),
    (["--crypto", "aes-xts:key=192"], "AES-XTS keys are 128 or 256 bits"),
    (["--crypto", "none", "--check-mask", "0xff"], "--check-mask needs a signature domain"),
    (["--row", "A", "--check-mask", "0xff"], "--check-mask needs a signature domain"),
    (["--mem", "t10dif:bg=0x1234"], "would fail with EINVAL: memory domain T10DIF bg 0x1234 "
                                    "must be 0 or 0xFFFF"),
    (["--mem", "crc32:seed=7"], "would fail with EINVAL: memory domain CRC32 seed 0x7"),
    (["--mem", "crc32", "--wire", "t10dif", "--copy-mask", "0xff"],
     "would fail with EINVAL: MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK needs both domains"),
    (["--mem", "crc32:block=512", "--wire", "crc32:block=4096"],
     "would fail with EOPNOTSUPP: memory block size 512 and wire block size 4096 differ"),
])
def test_flag_errors_are_usage_errors(argv, message, capsys):
    assert main(["explain", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert captured.err.startswith(("softhca explain: ", "usage: softhca explain"))


def test_every_row_is_derived_not_written(capsys):
    """The rows only select configurations: a row's configuration given through
    explain.Config explains the same as --row."""
    for row in MAN_PAGE_TABLE:
        cfg = explain.row_config(row)
        doc = explain.explain(explain.Config(cfg.mem, cfg.wire, cfg.check_mask, None,
                                             cfg.crypto))
        assert doc["tx"] == run_json(capsys, "--row", row)["tx"]
        assert doc["config"]["row"] is None
