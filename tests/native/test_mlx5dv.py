"""softhca's libmlx5.so.1 (provider/mlx5/) under ``softhca run``: its exported names and
versions against Debian's, and provider/tests/dvcheck.c, a C program built against
Debian's mlx5dv.h and linked with Debian's libmlx5, running the mlx5dv calls on a softhca
device. The values dvcheck prints (the T10-DIF PI an MKEY generated, the AES-XTS
ciphertext an MKEY produced) are checked here with crcmod and cryptography, never with
softhca's own code. perftest, which links libmlx5, still runs with this library loaded,
which its /proc/PID/maps shows."""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import crcmod
import native
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.keywrap import aes_key_wrap

DEBIAN_LIBMLX5 = Path("/usr/lib/x86_64-linux-gnu/libmlx5.so.1")
BLOCKS, BLOCK, PI = 4, 512, 8
# dvcheck's T10-DIF domain: app tag, first ref tag (incremented per block: REF_REMAP).
APP_TAG, REF_TAG = 0x5A5A, 0x1000
# T10-DIF's guard: CRC-16, polynomial 0x8BB7, not reflected, seed bg = 0 (T10 SBC-3).
t10dif_crc = crcmod.mkCrcFun(0x18BB7, initCrc=0, rev=False, xorOut=0)
_ports = itertools.count(23400)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable() or (None if native.DVCHECK.is_file() and native.LIBMLX5.is_file()
                                   else "provider/build/dvcheck or libmlx5.so.1 is not built "
                                        "(`make provider`)")
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("mlx5dv")) as p:
        yield p


def dvcheck(where, *args: str, run_args: tuple[str, ...] = ()) -> native.Done:
    r = where.run(where.server, [str(native.DVCHECK), *args], run_args=run_args)
    assert "dvcheck: FAIL" not in r.output, r.output
    assert r.returncode == 0, r.output
    return r


def hex_line(output: str, label: str) -> bytes:
    m = re.search(rf"^{label}: ([0-9a-f]+)$", output, re.M)
    assert m, output
    return bytes.fromhex(m.group(1))


def exported(lib: Path) -> set[tuple[str, str]]:
    """(name, version) of each function and version node ``lib`` defines (objdump -T)."""
    out = subprocess.run(["objdump", "-T", str(lib)], capture_output=True, text=True,
                         check=True).stdout
    syms = set()
    for line in out.splitlines():
        f = line.split()
        if "*UND*" in line or not (" DF " in line or " DO " in line) or len(f) < 2:
            continue
        syms.add((f[-1], f[-2].strip("()")))
    return syms


def test_exports_are_debians_names_and_versions():
    if not DEBIAN_LIBMLX5.is_file():
        pytest.skip(f"Debian's libmlx5 ({DEBIAN_LIBMLX5}) is not installed (ibverbs-providers)")
    if not native.LIBMLX5.is_file():
        pytest.skip("provider/build/libmlx5.so.1 is not built (`make provider`)")
    theirs, ours = exported(DEBIAN_LIBMLX5), exported(native.LIBMLX5)
    assert ("mlx5dv_init_obj", "MLX5_1.0") in theirs and ("_mlx5dv_mkey_check", "MLX5_1.20") in theirs
    assert ours == theirs, (sorted(theirs - ours), sorted(ours - theirs))
    soname = subprocess.run(["objdump", "-p", str(native.LIBMLX5)], capture_output=True,
                            text=True, check=True).stdout
    assert re.search(r"SONAME\s+libmlx5\.so\.1$", soname, re.M), soname


@pytest.mark.readme_row("`mlx5dv_is_supported`, `mlx5dv_open_device`")
@pytest.mark.readme_row("`mlx5dv_query_device`")
def test_caps_are_the_modelled_signature_and_crypto(where):
    r = dvcheck(where, "caps")
    caps = dict(re.findall(r"^caps: (\S+) (\d+)$", r.output, re.M))
    # mlx5dv.h: MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD 1 << 10, _CRYPTO_OFFLOAD 1 << 13;
    # STRIDING_RQ (1 << 2) was asked too and is not answered.
    assert int(caps["comp_mask"]) == (1 << 10) | (1 << 13), r.output
    assert int(caps["sig_caps.block_size"]) == 0b11111      # 512, 520, 4048, 4096, 4160
    assert int(caps["sig_caps.block_prot"]) == 0b11          # T10DIF, CRC
    assert int(caps["sig_caps.t10dif_bg"]) == 0b11           # CRC, CSUM
    assert int(caps["sig_caps.crc_type"]) == 0b111           # CRC32, CRC32C, CRC64_XP10
    assert int(caps["crypto_caps.crypto_engines"]) == 0b111  # AES_XTS, single, multi block
    assert int(caps["crypto_caps.flags"]) == 1               # CRYPTO; plaintext import
    assert int(caps["crypto_caps.wrapped_import_method"]) == 0


@pytest.mark.readme_row("`mlx5dv_create_qp` (RC)")
@pytest.mark.readme_row("`mlx5dv_qp_ex_from_ibv_qp_ex`; `mlx5dv_wr_mkey_configure`")
@pytest.mark.readme_row("`mlx5dv_create_mkey`, `mlx5dv_destroy_mkey`")
def test_t10dif_memory_domain_generates_the_pi(where):
    """An RDMA WRITE of 4 blocks into an MKEY whose memory domain is T10-DIF (its QP
    connected to itself), in the batch that configures it: the memory holds each block
    followed by its PI; reading back through the MKEY strips the PI, and
    mlx5dv_mkey_check finds nothing."""
    r = dvcheck(where, "sig")
    check_t10dif_memory(hex_line(r.output, "data"))
    for line in ("the configure WR completes first: wr_id 1 opcode 135",
                 "the RDMA READ through the MKEY brings the data without PI: success, 0 bytes",
                 "mlx5dv_mkey_check: 0, err_type 0 (MLX5DV_MKEY_NO_ERR)"):
        assert f"dvcheck: ok: {line}" in r.output, r.output


def check_t10dif_memory(mem: bytes) -> None:
    """dvcheck's 4 blocks, each followed by the PI mlx5dv_wr_set_mkey_sig_block(3) and
    T10 SBC-3 give it: guard = CRC-16 T10-DIF of the block (seed 0), the app tag, the ref
    tag plus the block's index (REF_REMAP), big-endian."""
    assert len(mem) == BLOCKS * (BLOCK + PI)
    src = bytes((i * 7 + (i >> 9) * 13 + 1) & 0xFF for i in range(BLOCKS * BLOCK))
    for b in range(BLOCKS):
        blk = mem[b * (BLOCK + PI):(b + 1) * (BLOCK + PI)]
        data, pi = blk[:BLOCK], blk[BLOCK:]
        assert data == src[b * BLOCK:(b + 1) * BLOCK], f"block {b}"
        assert int.from_bytes(pi[0:2], "big") == t10dif_crc(data), f"block {b} guard"
        assert int.from_bytes(pi[2:4], "big") == APP_TAG, f"block {b} app tag"
        assert int.from_bytes(pi[4:8], "big") == REF_TAG + b, f"block {b} ref tag"


def test_t10dif_mkey_written_by_a_peer(where):
    """The same MKEY on the server, written by the client's RDMA WRITE from the other
    network namespace, through both daemons: the server's memory holds the blocks and
    the PI its MKEY generated, and mlx5dv_mkey_check finds nothing."""
    port = next(_ports)
    srv, cli = where.pair([str(native.DVCHECK), "sig-peer", str(port)],
                          [str(native.DVCHECK), "sig-peer", str(port), where.server.addr],
                          port)
    for r in (srv, cli):
        assert r.returncode == 0 and "dvcheck: FAIL" not in r.output, srv.output + cli.output
    assert "dvcheck: ok: client: the RDMA WRITE into the peer's MKEY completes: success" \
        in cli.output, cli.output
    assert "dvcheck: ok: server: mlx5dv_mkey_check: 0, err_type 0" in srv.output, srv.output
    check_t10dif_memory(hex_line(srv.output, "data"))


@pytest.mark.readme_row("`mlx5dv_qp_ex_from_ibv_qp_ex`; `mlx5dv_wr_mkey_configure`")
def test_mr_interleaved_and_mr_list_layouts(where):
    """mlx5dv_wr_post(3): an interleaved layout is its entries' bytes_count bytes, entry
    after entry, repeated repeat_count times, repetition r of an entry starting
    r * (bytes_count + bytes_skip) after its addr; a list layout is its SGEs end to end.
    dvcheck's buffer holds byte i = 5 i + 3."""
    r = dvcheck(where, "layouts")
    buf = bytes((5 * i + 3) & 0xFF for i in range(4096))
    entries = [(0, 16, 48), (1000, 8, 8)]            # (offset, bytes_count, bytes_skip)
    want = b"".join(buf[off + rep * (n + skip):off + rep * (n + skip) + n]
                    for rep in range(3) for off, n, skip in entries)
    assert hex_line(r.output, "interleaved") == want
    assert hex_line(r.output, "list") == buf[100:150] + buf[3000:3030]
    assert ("dvcheck: ok: mlx5dv_wr_mkey_configure on a QP without "
            "MLX5DV_QP_EX_WITH_MKEY_CONFIGURE: ibv_wr_complete Operation not supported") \
        in r.output, r.output


def test_aes_xts_through_a_crypto_mkey(where):
    """An RDMA READ through an MKEY with crypto (encrypt on TX, 512-byte data units)
    brings the memory's bytes encrypted: unit k with tweak initial_tweak + k (little
    endian), by cryptography's AES-256-XTS."""
    key = secrets.token_bytes(64)
    tweak = (0x1234).to_bytes(16, "little")
    r = dvcheck(where, "crypto", key.hex(), tweak.hex())
    plain, cipher = hex_line(r.output, "plain"), hex_line(r.output, "cipher")
    assert len(plain) == len(cipher) == BLOCKS * BLOCK
    for k in range(BLOCKS):
        t = (int.from_bytes(tweak, "little") + k).to_bytes(16, "little")
        enc = Cipher(algorithms.AES(key), modes.XTS(t)).encryptor()
        want = enc.update(plain[k * BLOCK:(k + 1) * BLOCK]) + enc.finalize()
        assert cipher[k * BLOCK:(k + 1) * BLOCK] == want, f"data unit {k}"


@pytest.mark.readme_row("`mlx5dv_wr_set_dc_addr`")
@pytest.mark.readme_row("`mlx5dv_create_mkey`, `mlx5dv_destroy_mkey`")
@pytest.mark.readme_row("`mlx5dv_init_obj`, `mlx5dv_create_cq`")
def test_bad_input_gets_the_man_pages_errno(where):
    r = dvcheck(where, "bad")
    for line in (
            "3 setters announced, 2 called: ibv_wr_complete fails Invalid argument",
            "1 setter announced, 2 called: ibv_wr_complete fails Invalid argument",
            "a setter with no configure: ibv_wr_complete fails Invalid argument",
            "RDMA WRITE + a configure missing a setter: ibv_wr_complete fails Invalid "
            "argument and nothing completes (0)",
            "sig_block on an MKEY without BLOCK_SIGNATURE: ibv_wr_complete fails Invalid "
            "argument",
            "RDMA WRITE + a configure the daemon refuses: ibv_wr_complete fails Invalid "
            "argument, the WRITE before it completes (wr_id 55, success)",
            "mlx5dv_wr_set_dc_addr: ibv_wr_complete fails Operation not supported",
            "mlx5dv_mkey_check of an MKEY without BLOCK_SIGNATURE: Invalid argument",
            "mlx5dv_create_flow_matcher: NULL, errno Operation not supported",
            "mlx5dv_init_obj: Operation not supported",
            "mlx5dv_create_qp of a DCI: NULL, errno Operation not supported",
            "mlx5dv_create_qp with MLX5DV_QP_EX_WITH_RAW_WQE: NULL, errno Operation not "
            "supported",
            "2049 MKEY configure calls in one batch: ibv_wr_complete Cannot allocate memory"):
        assert f"dvcheck: ok: {line}" in r.output, r.output
    # each refusal says why, on stderr
    assert "softhca: mlx5dv_wr_mkey_configure: EINVAL: 3 setters announced, 2 called" in r.output
    assert "softhca libmlx5: mlx5dv_create_flow_matcher: EOPNOTSUPP" in r.output
    assert "ibv_wr_complete: ENOMEM: more than 2048 MKEY configure calls in a row" in r.output


@pytest.mark.readme_row("`mlx5dv_init_obj`, `mlx5dv_create_cq`")
def test_without_the_provider_every_call_is_unsupported():
    """Without softhca run no provider is loaded: softhca's libmlx5 (taken first from
    LD_LIBRARY_PATH, as its own log lines show) answers each call as on a device it does
    not support, as the man pages say (EOPNOTSUPP; NULL with errno; -1 with errno)."""
    if not (native.DVCHECK.is_file() and native.LIBMLX5.is_file()):
        pytest.skip("provider/build/dvcheck or libmlx5.so.1 is not built (`make provider`)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RDMAV_", "SOFTHCA_"))}
    env["LD_LIBRARY_PATH"] = str(native.LIBMLX5.parent)
    r = subprocess.run([str(native.DVCHECK), "absent"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("dvcheck: ok:") == 8, r.stdout
    assert "softhca libmlx5: mlx5dv_create_mkey: EOPNOTSUPP" in r.stderr, r.stderr


@pytest.mark.readme_row("`mlx5dv_crypto_login`, `_login_query_state`")
def test_dek_and_crypto_login_on_a_wrapped_import_device(where, tmp_path):
    """A device importing DEKs wrapped (softhca run --crypto-config): a DEK outside a
    crypto login is EINVAL; a login session with the credential wrapped under the import
    KEK (RFC 3394, by cryptography) takes a wrapped DEK; so does a login object."""
    kek, credential = secrets.token_bytes(16), secrets.token_bytes(40)
    cfg = tmp_path / "crypto.json"
    cfg.write_text(json.dumps({"mode": "wrapped", "import_kek": kek.hex(),
                               "credential": credential.hex()}))
    key = secrets.token_bytes(64)
    r = dvcheck(where, "dek", aes_key_wrap(kek, credential).hex(), aes_key_wrap(kek, key).hex(),
                run_args=("--crypto-config", str(cfg)))
    for line in (
            "before a login: state 1 (NO_LOGIN)",
            "mlx5dv_dek_create outside a crypto login on a wrapped-import device: NULL, "
            "Invalid argument",
            "mlx5dv_crypto_login: Success", "a second mlx5dv_crypto_login: File exists",
            "in the session: state 0 (VALID)", "mlx5dv_dek_create in the session: a DEK",
            "mlx5dv_dek_query: 0, state 0 (READY), opaque dvcheck!",
            "mlx5dv_crypto_logout: Success",
            "mlx5dv_crypto_logout with no session: No such file or directory",
            "mlx5dv_crypto_login_create: an object",
            "mlx5dv_crypto_login_query: 0, state 0 (VALID)",
            "mlx5dv_dek_create with the login object: a DEK",
            "mlx5dv_dek_create of a damaged wrapped key: Invalid argument",
            "mlx5dv_crypto_login_destroy: Success"):
        assert f"dvcheck: ok: {line}" in r.output, r.output


@pytest.mark.readme_row("`ibv_modify_qp` to SQD")
def test_signature_pipelining_sqd_and_sq_drained(where):
    r = dvcheck(where, "pipelining")
    for line in ("ibv_modify_qp to SQD with en_sqd_async_notify: Success",
                 "ibv_get_async_event: send queue drained on the QP",
                 "mlx5dv_qp_cancel_posted_send_wrs in SQD with nothing posted: 0",
                 "mlx5dv_qp_cancel_posted_send_wrs outside SQD: -22 (-EINVAL)"):
        assert f"dvcheck: ok: {line}" in r.output, r.output


@pytest.mark.parametrize("program", ["ib_write_bw", "ib_read_bw"])
def test_perftest_runs_with_softhcas_libmlx5(where, program):
    """perftest links libmlx5.so.1: under softhca run the loader takes softhca's, and
    the run completes on both sides. The server program's /proc/PID/maps names
    provider/build/libmlx5.so.1, which nothing but the program's own dependency on
    libmlx5.so.1 loads. (Debian's file is mapped too, but as libibverbs' mlx5 provider,
    which libibverbs dlopens by its full path from /usr/lib/.../libibverbs/ for every
    driver it is configured with; it matches no softhca device.)"""
    if native.unavailable(program):
        pytest.skip(native.unavailable(program))
    port = next(_ports)
    args = [program, "-p", str(port), "-n", "200", "-s", "4096"]
    maps: list[str] = []

    def look() -> None:
        pids = native.processes_of(program, "-p", str(port))
        assert pids, f"no {program} -p {port} process"
        maps.extend(Path(f"/proc/{pid}/maps").read_text() for pid in pids)

    srv, cli = where.pair(args, [*args, where.server.addr], port, on_listening=look)
    assert srv.returncode == 0 and cli.returncode == 0, srv.output + cli.output
    mapped = {line.split()[-1] for m in maps for line in m.splitlines() if "/" in line}
    assert str(native.LIBMLX5) in mapped, sorted(p for p in mapped if "mlx5" in p)
    rows = re.findall(r"^\s*4096\s+200\s+[\d.]+\s+([\d.]+)", cli.output, re.M)
    assert rows and float(rows[0]) > 0, cli.output


@pytest.mark.readme_row("`mlx5dv_create_qp` (RC)")
def test_perftest_dc_is_refused_by_mlx5dv_create_qp(where):
    """perftest's DC connection type goes through mlx5dv_create_qp with a DC init
    attribute: softhca's libmlx5 answers EOPNOTSUPP (saying why) and the program stops."""
    if native.unavailable("ib_write_bw"):
        pytest.skip(native.unavailable("ib_write_bw"))
    port = next(_ports)
    args = ["ib_write_bw", "-c", "DC", "-p", str(port), "-n", "10"]
    srv, cli = where.pair(args, [*args, where.server.addr], port, timeout=60)
    assert cli.returncode != 0 and srv.returncode != 0, srv.output + cli.output
    assert ("softhca: mlx5dv_create_qp: EOPNOTSUPP: comp_mask 0x2 (DC, DCI streams) is not "
            "modelled") in cli.output, cli.output
