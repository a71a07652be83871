"""Crypto login, wrapped DEK import and the device's crypto caps (docs/crypto-import.md).

Contracts: mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3), mlx5dv_dek_create(3),
mlx5dv_query_device(3). Expected wrapped bytes come from RFC 3394's own test vector or
from ``cryptography``'s key wrap called here, never from the code under test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap, aes_key_wrap

import softhca.client as sh
from softhca.engine.crypto_login import DeviceCrypto, login
from softhca.engine.hca import HCA
from softhca.engine.xts import xts_transform
from softhca.protocol.attrs import DEKInitAttr
from softhca.protocol.enums import CryptoLoginState, DekState
from softhca.protocol.errors import RDMAError
from softhca.tools.cli import main as cli_main

KEK = bytes(range(16))
CREDENTIAL = bytes(range(100, 140))
WRAPPED = {"mode": "wrapped", "import_kek": KEK.hex(), "credential": CREDENTIAL.hex(),
           "import_kek_id": 7, "credential_id": 3}
KEY128 = bytes(range(1, 33))
KEY256 = bytes(range(1, 65))
# mlx5dv.h: MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN, the crypto caps enums.
DEK_INIT_ATTR_CRYPTO_LOGIN = 1
ENGINES_AES_XTS, ENGINES_SINGLE_BLOCK, ENGINES_MULTI_BLOCK = 1, 2, 4
WRAPPED_IMPORT_METHOD_CAP_AES_XTS = 1
CAPS_CRYPTO, CAPS_WRAPPED_CRYPTO_OPERATIONAL = 1, 2


def cred() -> bytes:
    return aes_key_wrap(KEK, CREDENTIAL)


def errno_of(excinfo) -> str:
    return excinfo.value.errno_name


# -- the engine's model --------------------------------------------------------------

def test_key_wrap_is_rfc3394():
    # RFC 3394 section 4.1: 128 bits of key data wrapped with a 128-bit KEK.
    dev = DeviceCrypto(import_kek=bytes.fromhex("000102030405060708090A0B0C0D0E0F"))
    assert dev.wrap(bytes.fromhex("00112233445566778899AABBCCDDEEFF")) == bytes.fromhex(
        "1FA68B0A8112B447AEF34BD8FB5A7B829D3E862371D2CFE5")


def test_caps_follow_the_import_method():
    plain = DeviceCrypto().caps()
    wrapped = DeviceCrypto(wrapped=True).caps()
    for caps in (plain, wrapped):
        assert caps["failed_selftests"] == 0
        assert caps["crypto_engines"] == ENGINES_AES_XTS | ENGINES_SINGLE_BLOCK \
            | ENGINES_MULTI_BLOCK
    assert plain["wrapped_import_method"] == 0 and plain["flags"] == CAPS_CRYPTO
    assert wrapped["wrapped_import_method"] == WRAPPED_IMPORT_METHOD_CAP_AES_XTS
    assert wrapped["flags"] == CAPS_CRYPTO | CAPS_WRAPPED_CRYPTO_OPERATIONAL


@pytest.mark.parametrize("why, kwargs, errno", [
    ("wrong KEK", {"credential": aes_key_wrap(bytes(16), CREDENTIAL)}, "EINVAL"),
    ("wrong credential", {"credential": aes_key_wrap(KEK, bytes(40))}, "EINVAL"),
    ("wrong import_kek_id", {"import_kek_id": 8}, "EINVAL"),
    ("wrong credential_id", {"credential_id": 4}, "EINVAL"),
    ("short credential", {"credential": cred()[:40]}, "EINVAL"),
    ("comp_mask", {"comp_mask": 1}, "EINVAL"),
])
def test_login_refusals(why, kwargs, errno):
    dev = DeviceCrypto.from_dict(WRAPPED)
    args = {"credential": cred(), "import_kek_id": 7, "credential_id": 3, **kwargs}
    with pytest.raises(RDMAError) as e:
        login(dev, **args)
    assert errno_of(e) == errno


def test_login_on_a_plaintext_device_is_not_supported():
    with pytest.raises(RDMAError) as e:
        login(DeviceCrypto(), aes_key_wrap(DeviceCrypto().import_kek, DeviceCrypto().credential),
              0)
    assert errno_of(e) == "EOPNOTSUPP"


def wrapped_hca():
    hca = HCA("mlx5_0", DeviceCrypto.from_dict(WRAPPED))
    return hca, hca.alloc_pd(), login(hca.crypto, cred(), 7, 3)


@pytest.mark.parametrize("key, size", [(KEY128, 0), (KEY256, 1)])
def test_wrapped_dek_is_unwrapped_under_the_login_kek(key, size):
    hca, pd, lg = wrapped_hca()
    wrapped = aes_key_wrap(KEK, key)
    assert len(wrapped) == (40 if size == 0 else 72)     # test_mlx5_crypto.py: '!5Q', '!9Q'
    dek = hca.create_dek(DEKInitAttr(pd=pd, key_size=size, key=wrapped, opaque=b"dek"),
                         session_login=lg)
    half = len(key) // 2
    data = b"c" * 1024
    want = b""
    for unit in range(2):
        enc = Cipher(algorithms.AES(key), modes.XTS(unit.to_bytes(16, "little"))).encryptor()
        want += enc.update(data[unit * 512:(unit + 1) * 512]) + enc.finalize()
    assert dek.transform(data, 512, 0, 0, True) == want
    assert dek.opaque == b"dek" and dek.wrapped and key[:half] != key[half:]


def test_wrapped_dek_with_keytag():
    hca, pd, lg = wrapped_hca()
    tag = b"KEYTAG!!"
    dek = hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=aes_key_wrap(KEK, KEY128 + tag),
                                     has_keytag=True), session_login=lg)
    assert dek.keytag == tag and dek.key == KEY128


@pytest.mark.parametrize("why, attr, session", [
    ("outside a login", {}, False),
    ("plaintext key", {"key": KEY128}, True),
    ("wrapped under another KEK", {"key": aes_key_wrap(bytes(16), KEY128)}, True),
    ("128-bit size, 256-bit key", {"key": aes_key_wrap(KEK, KEY256)}, True),
    ("plaintext import asked of a wrapped device",
     {"comp_mask": DEK_INIT_ATTR_CRYPTO_LOGIN}, True),
    ("crypto_login without the comp_mask bit", {"crypto_login": "login"}, True),
    ("unknown comp_mask bit", {"comp_mask": 2}, True),
    ("opaque longer than char[8]", {"opaque": b"123456789"}, True),
    ("key_purpose other than AES_XTS", {"key_purpose": 1}, True),
])
def test_wrapped_dek_refusals(why, attr, session):
    hca, pd, lg = wrapped_hca()
    if attr.get("crypto_login") == "login":
        attr["crypto_login"] = lg
    base = {"pd": pd, "key_size": 0, "key": aes_key_wrap(KEK, KEY128)}
    with pytest.raises(RDMAError) as e:
        hca.create_dek(DEKInitAttr(**{**base, **attr}), session_login=lg if session else None)
    assert errno_of(e) == "EINVAL"
    assert not hca.deks


def test_plaintext_device_keeps_plaintext_import():
    hca = HCA("mlx5_0")
    pd = hca.alloc_pd()
    old = hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=KEY128))
    new = hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=KEY128,
                                     comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN))
    tagged = hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=KEY128 + b"TAGTAGTG",
                                        has_keytag=True))
    assert old.key == new.key == KEY128 and not old.wrapped
    assert tagged.key == KEY128 and tagged.keytag == b"TAGTAGTG"


def test_dek_table_is_bounded_by_log_max_num_deks(monkeypatch):
    import softhca.engine.hca as hca_module

    monkeypatch.setattr(hca_module, "LOG_MAX_NUM_DEKS", 1)
    hca = HCA("mlx5_0")
    pd = hca.alloc_pd()
    for _ in range(2):
        hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=KEY128))
    with pytest.raises(RDMAError) as e:
        hca.create_dek(DEKInitAttr(pd=pd, key_size=0, key=KEY128))
    assert errno_of(e) == "ENOMEM" and len(hca.deks) == 2


# -- through the daemon ----------------------------------------------------------------

async def test_query_mlx5_device_names_the_signature_caps():
    """struct mlx5dv_sig_caps as mlx5dv.h's *_caps enums spell what softhca computes:
    every mlx5dv_block_size, T10-DIF and CRC, both T10-DIF guards, all three CRCs."""
    async with sh.embedded() as node:
        ctx = await node.open_device()
        attr = await ctx.query_mlx5_device()
        # MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD 1 << 10, _CRYPTO_OFFLOAD 1 << 13
        assert attr["comp_mask"] == (1 << 10) | (1 << 13)
        assert attr["sig_caps"] == {"block_size": 0x1F, "block_prot": 0x3, "t10dif_bg": 0x3,
                                    "crc_type": 0x7}

async def test_login_session_as_test_mlx5_dek_management_uses_it():
    async with sh.embedded(crypto_config=WRAPPED) as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        caps = (await ctx.query_mlx5_device())["crypto_caps"]
        assert caps["wrapped_import_method"] & WRAPPED_IMPORT_METHOD_CAP_AES_XTS
        attr = sh.Mlx5DEKInitAttr(pd=pd, key_size=0, key=aes_key_wrap(KEK, KEY128),
                                  opaque=b"dek")
        with pytest.raises(sh.RDMAError) as e:
            await ctx.create_dek(attr)
        assert errno_of(e) == "EINVAL"
        assert await ctx.query_login_state() == CryptoLoginState.NO_LOGIN
        with pytest.raises(sh.RDMAError) as e:
            await ctx.crypto_login(aes_key_wrap(KEK, bytes(40)), 7, credential_id=3)
        assert errno_of(e) == "EINVAL"
        assert await ctx.query_login_state() == CryptoLoginState.NO_LOGIN
        await ctx.crypto_login(cred(), 7, credential_id=3)
        assert await ctx.query_login_state() == CryptoLoginState.VALID
        with pytest.raises(sh.RDMAError) as e:
            await ctx.crypto_login(cred(), 7, credential_id=3)
        assert errno_of(e) == "EEXIST"
        dek = await ctx.create_dek(attr)
        assert await dek.query() == (DekState.READY, b"dek")
        await ctx.crypto_logout()
        assert await ctx.query_login_state() == CryptoLoginState.NO_LOGIN
        # mlx5dv_dek_create(3): a wrapped DEK is queried only inside a valid login.
        with pytest.raises(sh.RDMAError) as e:
            await dek.query()
        assert errno_of(e) == "EINVAL"
        with pytest.raises(sh.RDMAError) as e:
            await ctx.crypto_logout()
        assert errno_of(e) == "ENOENT"
        await dek.close()
        # Another context of the same device has its own session.
        other = await node.open_device()
        await other.crypto_login(cred(), 7, credential_id=3)
        assert await ctx.query_login_state() == CryptoLoginState.NO_LOGIN
        # Closing a context ends its login: a wrapped DEK is no longer queryable.
        dek = await other.create_dek(sh.Mlx5DEKInitAttr(pd=await other.alloc_pd(),
                                                        key_size=0,
                                                        key=aes_key_wrap(KEK, KEY128)))
        assert (await dek.query())[0] == DekState.READY
        await node.request("close_device", ctx=other.handle)
        with pytest.raises(sh.RDMAError) as e:
            await dek.query()
        assert errno_of(e) == "EINVAL"


async def test_login_object_as_test_mlx5_crypto_wrapped_dek_uses_it():
    async with sh.embedded(crypto_config=WRAPPED) as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        lg = await ctx.create_crypto_login(cred(), 7, credential_id=3)
        assert await lg.query_state() == CryptoLoginState.VALID
        with pytest.raises(sh.RDMAError) as e:
            await ctx.create_crypto_login(cred(), 7, credential_id=3)
        assert errno_of(e) == "EEXIST"
        attr = sh.Mlx5DEKInitAttr(pd=pd, key_size=1, key=aes_key_wrap(KEK, KEY256))
        dek = await ctx.create_dek(attr, crypto_login=lg, comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN)
        assert (await dek.query())[0] == DekState.READY
        # The object is not the context's session; a DEK by the old API still needs one.
        with pytest.raises(sh.RDMAError) as e:
            await ctx.create_dek(attr)
        assert errno_of(e) == "EINVAL"
        # A login object of another context is refused.
        other = await node.open_device()
        with pytest.raises(sh.RDMAError) as e:
            await other.create_dek(sh.Mlx5DEKInitAttr(pd=await other.alloc_pd(), key_size=1,
                                                      key=aes_key_wrap(KEK, KEY256)),
                                   crypto_login=lg, comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN)
        assert errno_of(e) == "EINVAL"
        await lg.close()
        # A DEK outlives its login (mlx5dv_crypto_login_create(3)); querying it does not.
        with pytest.raises(sh.RDMAError) as e:
            await dek.query()
        assert errno_of(e) == "EINVAL"
        await dek.close()


async def test_plaintext_mode_through_the_daemon():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        caps = (await ctx.query_mlx5_device())["crypto_caps"]
        assert caps["wrapped_import_method"] == 0
        assert not caps["flags"] & CAPS_WRAPPED_CRYPTO_OPERATIONAL
        dev = DeviceCrypto()
        with pytest.raises(sh.RDMAError) as e:
            await ctx.crypto_login(aes_key_wrap(dev.import_kek, dev.credential), 0)
        assert errno_of(e) == "EOPNOTSUPP"
        with pytest.raises(sh.RDMAError) as e:
            await ctx.create_crypto_login(aes_key_wrap(dev.import_kek, dev.credential), 0)
        assert errno_of(e) == "EOPNOTSUPP"
        assert await ctx.query_login_state() == CryptoLoginState.NO_LOGIN
        # test_mlx5_crypto.py's plaintext DEK: comp_mask set, crypto_login NULL.
        dek = await ctx.create_dek(sh.Mlx5DEKInitAttr(pd=pd, key_size=0, key=KEY128,
                                                      opaque=b"pt"),
                                   comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN, crypto_login=None)
        assert await dek.query() == (DekState.READY, b"pt")


async def test_embedded_reads_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "crypto.json"
    path.write_text(json.dumps(WRAPPED))
    for value in (str(path), json.dumps({"mode": "wrapped"})):
        monkeypatch.setenv("SOFTHCA_CRYPTO_CONFIG", value)
        async with sh.embedded() as node:
            ctx = await node.open_device()
            assert (await ctx.query_mlx5_device())["crypto_caps"]["flags"] \
                & CAPS_WRAPPED_CRYPTO_OPERATIONAL
    monkeypatch.setenv("SOFTHCA_CRYPTO_CONFIG", json.dumps({"mode": "sealed"}))
    with pytest.raises(sh.RDMAError) as e:
        async with sh.embedded():
            pass
    assert errno_of(e) == "EINVAL" and "SOFTHCA_CRYPTO_CONFIG" in e.value.message
    # An explicit configuration wins over the environment.
    async with sh.embedded(crypto_config={"mode": "plaintext"}) as node:
        ctx = await node.open_device()
        assert (await ctx.query_mlx5_device())["crypto_caps"]["wrapped_import_method"] == 0


@pytest.mark.parametrize("config, words", [
    ('{"mode": "wrapped", "import_kek": "00"}', "import_kek"),
    ('{"mode": "wrapped", "colour": 1}', "unknown"),
    ("not json", "not JSON"),
])
def test_serve_refuses_a_bad_crypto_config(tmp_path, config, words):
    path = tmp_path / "crypto.json"
    path.write_text(config)
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                        "127.0.0.1:0", "--crypto-config", str(path)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert words in r.stderr


def test_serve_process_in_wrapped_mode(tmp_path):
    from test_serve import start

    path = tmp_path / "crypto.json"
    path.write_text(json.dumps(WRAPPED))
    proc, address = start(tmp_path, "--crypto-config", str(path))
    try:
        async def session():
            async with await sh.connect(address) as node:
                ctx = await node.open_device()
                caps = (await ctx.query_mlx5_device())["crypto_caps"]
                assert caps["flags"] & CAPS_WRAPPED_CRYPTO_OPERATIONAL
                await ctx.crypto_login(cred(), 7, credential_id=3)
                assert await ctx.query_login_state() == CryptoLoginState.VALID

        import asyncio

        asyncio.run(session())
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "mode=wrapped" in proc.stderr.read()


def test_serve_options_carry_the_crypto_config(tmp_path):
    from softhca.server import serve
    from softhca.tools.cli import build_parser

    path = tmp_path / "crypto.json"
    path.write_text(json.dumps(WRAPPED))
    args = build_parser().parse_args(["serve", "--crypto-config", str(path)])
    o = serve.options_from_args(args)
    assert o.crypto.wrapped and o.crypto.import_kek == KEK and o.crypto.import_kek_id == 7
    assert serve.options_from_args(build_parser().parse_args(["serve"])).crypto is None


# -- softhca crypto-test-info ----------------------------------------------------------

def test_crypto_test_info_file(tmp_path, capsys):
    config = tmp_path / "crypto.json"
    config.write_text(json.dumps(WRAPPED))
    out = tmp_path / "info.json"
    assert cli_main(["crypto-test-info", "--config", str(config), "--out", str(out)]) == 0
    info = json.loads(out.read_text())[0]
    # Unpacked as test_mlx5_crypto.py packs each field.
    assert aes_key_unwrap(KEK, struct.pack("!6Q", *info["credential"])) == CREDENTIAL
    key = struct.pack("8I", *info["plaintext_key"])
    key256 = struct.pack("16I", *info["plaintext_256_bits_key"])
    assert aes_key_unwrap(KEK, struct.pack("!5Q", *info["wrapped_key"])) == key
    assert aes_key_unwrap(KEK, struct.pack("!9Q", *info["wrapped_256_bits_key"])) == key256
    assert key[:16] != key[16:] and key256[:32] != key256[32:]
    enc512 = struct.pack("!64Q", *info["encrypted_data_for_512_c"])
    enc1024 = struct.pack("!128Q", *info["encrypted_data_for_1024_c"])
    assert enc1024[:512] == enc512
    for unit in range(2):
        dec = Cipher(algorithms.AES(key), modes.XTS(unit.to_bytes(16, "little"))).decryptor()
        assert dec.update(enc1024[unit * 512:(unit + 1) * 512]) + dec.finalize() == b"c" * 512
    # The engine's XTS agrees with cryptography's on the test's data and tweak.
    assert xts_transform(key, b"c" * 1024, 512, 0, 0, True) == enc1024
    assert "wrapped" in capsys.readouterr().out


def test_crypto_test_info_refuses_a_bad_config(tmp_path, capsys):
    config = tmp_path / "crypto.json"
    config.write_text('{"mode": "wrapped", "credential": "abcd"}')
    assert cli_main(["crypto-test-info", "--config", str(config), "--out",
                     str(tmp_path / "x")]) == 2
    assert "credential" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")


# -- test_mlx5_crypto.py's traffic with data validation, through the daemon ------------

async def crypto_traffic(node, info: dict, how: str, msg_size: int) -> None:
    """Mlx5CryptoTrafficTest.run_crypto_dek_test: a client and a server context on one
    device; the client's first half is plaintext sent through an MKEY encrypting on TX,
    its second half the test file's ciphertext sent through one decrypting on TX."""
    half = msg_size // 2
    players = []
    for _ in range(2):
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(64)
        qp = await pd.create_qp(sh.QPInitAttr(
            scq=cq, rcq=cq, cap=sh.QPCap(max_send_wr=16, max_recv_wr=16, max_inline_data=512),
            send_ops_flags=sh.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE))
        mr = await pd.reg_mr(msg_size, sh.IBV_ACCESS_LOCAL_WRITE)
        players.append((ctx, pd, cq, qp, mr))
    (cctx, cpd, ccq, cqp, cmr), (_, _, scq, sqp, smr) = players
    await cqp.connect(sqp.info())
    await sqp.connect(cqp.info())
    if how == "plaintext":
        key = struct.pack("8I", *info["plaintext_key"])
        dek = await cctx.create_dek(sh.Mlx5DEKInitAttr(pd=cpd, key=key, key_size=0),
                                    comp_mask=sh.MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN,
                                    crypto_login=None)
    else:
        cred_bytes = struct.pack("!6Q", *info["credential"])
        attr = sh.Mlx5DEKInitAttr(pd=cpd, key=struct.pack("!5Q", *info["wrapped_key"]),
                                  key_size=0)
        if how == "session":
            await cctx.crypto_login(cred_bytes, 0)
            dek = await cctx.create_dek(attr)
        else:
            login_obj = await cctx.create_crypto_login(cred_bytes, 0)
            dek = await cctx.create_dek(attr, crypto_login=login_obj,
                                        comp_mask=sh.MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN)
    mkeys = []
    for offset, encrypt_on_tx in ((0, True), (half, False)):
        mkey = await cpd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                                     | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO, 1)
        crypto = sh.Mlx5CryptoAttr(
            encrypt_on_tx=encrypt_on_tx, dek=dek, data_unit_size=sh.MLX5DV_BLOCK_SIZE_512,
            signature_crypto_order=sh.MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX,
            initial_tweak=struct.pack("!2Q", 0, 0))
        await cqp.post_mkey_configure(mkey, access=sh.IBV_ACCESS_LOCAL_WRITE,
                                      sges=[sh.SGE(cmr.addr + offset, half, cmr.lkey)],
                                      crypto=crypto,
                                      wr_flags=sh.IBV_SEND_SIGNALED | sh.IBV_SEND_INLINE)
        assert (await ccq.poll_n(1))[0].status == sh.IBV_WC_SUCCESS
        mkeys.append(mkey)
    field = "encrypted_data_for_512_c" if half == 512 else "encrypted_data_for_1024_c"
    encrypted = struct.pack(f"!{half // 8}Q", *info[field])
    await cmr.write(b"c" * half + encrypted)
    for _ in range(3):
        for offset in (0, half):
            await sqp.post_recv(sh.RecvWR(sg=[sh.SGE(smr.addr + offset, half, smr.lkey)]))
        for mkey in mkeys:
            await cqp.post_send(sh.SendWR(opcode=sh.IBV_WR_SEND, sg=[sh.SGE(0, half,
                                                                            mkey.lkey)]))
        assert all(w.status == sh.IBV_WC_SUCCESS for w in await ccq.poll_n(2))
        assert all(w.status == sh.IBV_WC_SUCCESS for w in await scq.poll_n(2))
        # validate_crypto_data: each half arrives as the other half of the client's.
        assert await smr.read() == encrypted + b"c" * half


@pytest.mark.parametrize("how, msg_size", [("session", 1024), ("object", 1024),
                                           ("object", 2048), ("plaintext", 1024),
                                           ("plaintext", 2048)])
async def test_upstream_crypto_traffic_validates(tmp_path, how, msg_size):
    config = {"mode": "plaintext"} if how == "plaintext" else WRAPPED | {"import_kek_id": 0,
                                                                         "credential_id": 0}
    path = tmp_path / "crypto.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "info.json"
    assert cli_main(["crypto-test-info", "--config", str(path), "--out", str(out)]) == 0
    info = json.loads(out.read_text())[0]
    async with sh.embedded(crypto_config=str(path)) as node:
        await crypto_traffic(node, info, how, msg_size)


async def test_remaining_refusals():
    async with sh.embedded(crypto_config=WRAPPED) as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        # A login session is ended by crypto_logout, not destroyed as an object.
        await ctx.crypto_login(cred(), 7, credential_id=3)
        session = next(iter(node.daemon.sessions))
        handle = next(h for h, (kind, _) in session.verbs.objects.items() if kind == "crypto_login")
        with pytest.raises(sh.RDMAError) as e:
            await node.request("destroy_crypto_login", login=handle)
        assert errno_of(e) == "EINVAL"
        assert await ctx.query_login_state() == CryptoLoginState.VALID
        # crypto_login must be a login object (the client checks before sending).
        with pytest.raises(sh.RDMAError) as e:
            await ctx.create_dek(sh.Mlx5DEKInitAttr(pd=pd, key=aes_key_wrap(KEK, KEY128),
                                                    key_size=0),
                                 crypto_login="login", comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN)
        assert errno_of(e) == "EINVAL"
        # The daemon refuses a login handle that is the session, not an object.
        with pytest.raises(sh.RDMAError) as e:
            await node.request("create_dek", ctx=ctx.handle, pd=pd.handle, key_size=0,
                               key=aes_key_wrap(KEK, KEY128), has_keytag=False,
                               keytag=bytes(8), key_purpose=0, crypto_login=handle,
                               comp_mask=DEK_INIT_ATTR_CRYPTO_LOGIN)
        assert errno_of(e) == "EINVAL"
    with pytest.raises(sh.RDMAError) as e:
        async with sh.embedded(crypto_config={"mode": "wrapped", "import_kek": "00" * 15}):
            pass
    assert errno_of(e) == "EINVAL" and "import_kek" in e.value.message


@pytest.mark.parametrize("config, words", [
    ({"credential": "00" * 39}, "credential"),
    ({"import_kek_id": -1}, "import_kek_id"),
    ({"mode": "wrapped", "import_kek": "zz"}, "hex"),
    ([], "JSON object"),
])
def test_device_crypto_config_refusals(config, words):
    with pytest.raises(ValueError) as e:
        DeviceCrypto.from_dict(config)
    assert words in str(e.value)
