"""The device's crypto import method, crypto login and wrapped DEK import.

mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3) and mlx5dv_dek_create(3)
describe the contract; the device side (how the firmware checks a credential and
unwraps a key) is in the mlx5 PRM, which is not public. The model here is ours and
docs/crypto-import.md writes it down:

- The import method is fixed when the daemon starts (``DeviceCrypto``): plaintext
  (DEKs are given as key1 || key2) or wrapped (DEKs are given AES-key-wrapped,
  RFC 3394 / NIST SP 800-38F with the default IV 0xA6A6A6A6A6A6A6A6, under the
  device's import KEK).
- The device stores one credential (40 bytes) and one import KEK, each with an id.
  A login presents the credential wrapped under the import KEK (48 bytes, the
  ``char credential[48]`` of struct mlx5dv_crypto_login_attr); it succeeds when the
  ids name the stored ones, the wrap's integrity check passes and the unwrapped
  bytes equal the stored credential.
- A wrapped DEK's key field is ENC(iv_64b + key1 + key2 [+ keytag_64b]), the table
  of mlx5dv_dek_create(3), unwrapped under the import KEK of the login it is
  created in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.keywrap import (
    InvalidUnwrap,
    aes_key_unwrap,
    aes_key_wrap,
)

from ..protocol.enums import (
    CryptoCapsFlags,
    CryptoEnginesCaps,
    CryptoKeySize,
    CryptoLoginState,
    CryptoWrappedImportMethodCaps,
    DekInitAttrMask,
)
from ..protocol.errors import RDMAError, einval

# struct mlx5dv_crypto_login_attr: char credential[48], the wrap of 40 bytes.
CREDENTIAL_BYTES = 40
WRAPPED_CREDENTIAL_BYTES = CREDENTIAL_BYTES + 8
KEK_BYTES = (16, 32)
KEYTAG_BYTES = 8
# RFC 3394 adds one 64-bit block (the integrity check value) to what it wraps.
WRAP_OVERHEAD = 8
XTS_KEY_BYTES = {CryptoKeySize.SIZE_128: 32, CryptoKeySize.SIZE_256: 64}

CRYPTO_ENGINES_CAP_AES_XTS = int(CryptoEnginesCaps.AES_XTS)
CRYPTO_ENGINES_CAP_AES_XTS_SINGLE_BLOCK = int(CryptoEnginesCaps.AES_XTS_SINGLE_BLOCK)
CRYPTO_ENGINES_CAP_AES_XTS_MULTI_BLOCK = int(CryptoEnginesCaps.AES_XTS_MULTI_BLOCK)
CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS = int(CryptoWrappedImportMethodCaps.AES_XTS)
CRYPTO_CAPS_CRYPTO = int(CryptoCapsFlags.CRYPTO)
CRYPTO_CAPS_WRAPPED_CRYPTO_OPERATIONAL = int(CryptoCapsFlags.WRAPPED_CRYPTO_OPERATIONAL)
DEK_INIT_ATTR_CRYPTO_LOGIN = int(DekInitAttrMask.CRYPTO_LOGIN)

# The DEKs one device holds: reported as log_max_num_deks and enforced (ENOMEM).
LOG_MAX_NUM_DEKS = 16


def _default(label: bytes, n: int) -> bytes:
    # Fixed, documented defaults: a simulator's KEK protects nothing, and a default
    # lets `softhca serve --crypto-config` name only the mode.
    return hashlib.sha512(b"softhca " + label).digest()[:n]


DEFAULT_IMPORT_KEK = _default(b"import KEK", 16)
DEFAULT_CREDENTIAL = _default(b"credential", CREDENTIAL_BYTES)


@dataclass(frozen=True)
class DeviceCrypto:
    """The crypto configuration a device starts with (docs/crypto-import.md)."""

    wrapped: bool = False
    import_kek: bytes = field(default=DEFAULT_IMPORT_KEK, repr=False)
    credential: bytes = field(default=DEFAULT_CREDENTIAL, repr=False)
    import_kek_id: int = 0
    credential_id: int = 0

    def __post_init__(self) -> None:
        if len(self.import_kek) not in KEK_BYTES:
            raise ValueError(f"import_kek is {len(self.import_kek)} bytes; an AES key wrap "
                             "KEK is 16 or 32")
        if len(self.credential) != CREDENTIAL_BYTES:
            raise ValueError(f"credential is {len(self.credential)} bytes; the device's "
                             f"credential is {CREDENTIAL_BYTES} (48 once wrapped)")
        for name in ("import_kek_id", "credential_id"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 32:
                raise ValueError(f"{name} {v!r} is not a 32-bit unsigned id")

    @classmethod
    def from_dict(cls, d: dict) -> DeviceCrypto:
        """The JSON form: {"mode": "plaintext" | "wrapped", "import_kek": hex,
        "credential": hex, "import_kek_id": int, "credential_id": int}, all optional."""
        if not isinstance(d, dict):
            raise ValueError("a crypto configuration is a JSON object")
        known = {"mode", "import_kek", "credential", "import_kek_id", "credential_id"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"unknown crypto configuration field(s): {', '.join(sorted(extra))}"
                             f"; the fields are {', '.join(sorted(known))}")
        mode = d.get("mode", "plaintext")
        if mode not in ("plaintext", "wrapped"):
            raise ValueError(f"mode {mode!r} is not 'plaintext' or 'wrapped'")
        kw: dict = {"wrapped": mode == "wrapped"}
        for name in ("import_kek", "credential"):
            if name in d:
                try:
                    kw[name] = bytes.fromhex(d[name])
                except (TypeError, ValueError):
                    raise ValueError(f"{name} must be a hex string") from None
        for name in ("import_kek_id", "credential_id"):
            if name in d:
                kw[name] = d[name]
        return cls(**kw)

    def caps(self) -> dict:
        """struct mlx5dv_crypto_caps as mlx5dv_query_device(3) fills it."""
        flags = CRYPTO_CAPS_CRYPTO
        if self.wrapped:
            flags |= CRYPTO_CAPS_WRAPPED_CRYPTO_OPERATIONAL
        return {"failed_selftests": 0,
                # The engine runs any number of data units per WR (multi block) as well as one.
                "crypto_engines": int(CRYPTO_ENGINES_CAP_AES_XTS
                                      | CRYPTO_ENGINES_CAP_AES_XTS_SINGLE_BLOCK
                                      | CRYPTO_ENGINES_CAP_AES_XTS_MULTI_BLOCK),
                "wrapped_import_method": int(CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS
                                             if self.wrapped else 0),
                "log_max_num_deks": LOG_MAX_NUM_DEKS,
                "flags": int(flags)}

    # -- what a client or a test tool computes with the device's secrets -------------
    def wrap(self, plaintext: bytes) -> bytes:
        """ENC(iv_64b + plaintext) under the import KEK (what a crypto officer hands out)."""
        return aes_key_wrap(self.import_kek, plaintext)

    def wrapped_credential(self) -> bytes:
        return self.wrap(self.credential)


@dataclass(eq=False)
class CryptoLogin:
    """A crypto login session (mlx5dv_crypto_login) or object (mlx5dv_crypto_login_create)."""

    device: DeviceCrypto
    import_kek: bytes = field(repr=False)
    state: int = CryptoLoginState.VALID

    def unwrap(self, wrapped: bytes, what: str) -> bytes:
        if self.state != CryptoLoginState.VALID:
            raise einval(f"{what}: the crypto login is not MLX5DV_CRYPTO_LOGIN_STATE_VALID")
        try:
            return aes_key_unwrap(self.import_kek, wrapped)
        except (InvalidUnwrap, ValueError):
            raise einval(f"{what}: the key does not unwrap under the login's import KEK "
                         "(AES key wrap integrity check failed)") from None


def login(device: DeviceCrypto, credential: bytes, import_kek_id: int, credential_id: int = 0,
          comp_mask: int = 0, verb: str = "mlx5dv_crypto_login") -> CryptoLogin:
    """Check a login's attributes as the device would; EINVAL naming the one that fails
    (mlx5dv_crypto_login(3) ERRORS: "one or more of credential, credential_id and
    import_kek_id are invalid"). Nothing is created on a refusal."""
    if not device.wrapped:
        raise RDMAError("EOPNOTSUPP", f"{verb}: this device's crypto is in plaintext import "
                                      "method (no MLX5DV_CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS)"
                                      "; a crypto login exists only for wrapped import")
    if comp_mask:
        raise einval(f"{verb}: comp_mask {comp_mask:#x} must be 0")
    if credential_id != device.credential_id:
        raise einval(f"{verb}: credential_id {credential_id} is not a credential stored on "
                     "the device")
    if import_kek_id != device.import_kek_id:
        raise einval(f"{verb}: import_kek_id {import_kek_id} is not an import KEK stored on "
                     "the device")
    credential = bytes(credential)
    if len(credential) != WRAPPED_CREDENTIAL_BYTES:
        raise einval(f"{verb}: the wrapped credential is {WRAPPED_CREDENTIAL_BYTES} bytes, "
                     f"got {len(credential)}")
    try:
        plain = aes_key_unwrap(device.import_kek, credential)
    except (InvalidUnwrap, ValueError):
        raise einval(f"{verb}: the credential does not unwrap under import KEK "
                     f"{import_kek_id} (AES key wrap integrity check failed)") from None
    if plain != device.credential:
        raise einval(f"{verb}: the credential does not match credential {credential_id} "
                     "stored on the device")
    return CryptoLogin(device, device.import_kek)


def unwrap_dek(lg: CryptoLogin, key: bytes, key_size: int,
               has_keytag: bool) -> tuple[bytes, bytes | None]:
    """(key1 || key2, keytag or None) from a wrapped DEK key field (mlx5dv_dek_create(3)
    table: ENC(iv_64b + key1 + key2 [+ keytag_64b]))."""
    want = XTS_KEY_BYTES[key_size] + (KEYTAG_BYTES if has_keytag else 0)
    if len(key) != want + WRAP_OVERHEAD:
        raise einval(f"a wrapped AES-XTS DEK of key_size {key_size}"
                     f"{' with a keytag' if has_keytag else ''} is {want + WRAP_OVERHEAD} "
                     f"bytes (ENC(iv_64b + {want} bytes)), got {len(key)}")
    plain = lg.unwrap(bytes(key), "mlx5dv_dek_create")
    n = XTS_KEY_BYTES[key_size]
    return plain[:n], (plain[n:] if has_keytag else None)
