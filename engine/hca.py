"""The HCA and the objects it owns: PDs, MRs (host memory), DEKs, MKEYs.

The daemon is both the device and the host memory it DMAs into, so an MR here
owns its bytes: a numpy buffer at a virtual address the HCA hands out. Keys are
looked up in one table per HCA, as the device's MKEY table would be: an lkey or
rkey names an MR or an MKEY, and lkey == rkey for both (mlx5 gives one key).
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..protocol.attrs import DEKInitAttr
from ..protocol.enums import (
    AccessFlags,
    CryptoKeyPurpose,
    CryptoKeySize,
    DekState,
    MkeyInitAttrFlags,
)
from ..protocol.errors import RDMAError, einval
from . import backend
from .backend import NativeXts
from .crypto_login import (
    DEK_INIT_ATTR_CRYPTO_LOGIN,
    KEYTAG_BYTES,
    LOG_MAX_NUM_DEKS,
    CryptoLogin,
    DeviceCrypto,
    unwrap_dek,
)
from .memory import MR, PD
from .mkey import MKey
from .xts import XtsCipher, as_uint8

# Virtual addresses handed to MRs start here and stay page aligned, like a
# process's heap would; a nonzero base makes an offset mistaken for an address show.
VA_BASE = 0x7F0000000000
PAGE = 4096

# Access flags an MR may be registered with (ibv_reg_mr(3)); ZERO_BASED is not modelled.
# IBV_ACCESS_ON_DEMAND (1 << 6) is taken as engine/odp.py says.
MR_ACCESS = int(AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
             | AccessFlags.REMOTE_ATOMIC | AccessFlags.MW_BIND) | 1 << 6

# mlx5dv_create_mkey(3): the flags an MKEY may be created with.
MKEY_CREATE_FLAGS = int(MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE
                     | MkeyInitAttrFlags.CRYPTO | MkeyInitAttrFlags.UPDATE_TAG
                     | MkeyInitAttrFlags.REMOTE_INVALIDATE)

# ibv_query_device(3) max_mr_size: the largest memory domain an MR or MKEY maps.
MAX_MR_SIZE = 1 << 40

DEK_KEY_BYTES = {CryptoKeySize.SIZE_128: 32, CryptoKeySize.SIZE_256: 64}


@dataclass(eq=False)
class DEK:
    """A data encryption key (mlx5dv_dek_create(3)): key1 || key2 for AES-XTS."""

    pd: PD
    handle: int
    key_size: int
    key: bytes = field(repr=False)
    has_keytag: bool
    keytag: bytes
    state: int = DekState.READY
    # mlx5dv_dek_attr.opaque: plaintext metadata, returned by mlx5dv_dek_query.
    opaque: bytes = b""
    # Imported wrapped (querying it then needs a valid crypto login, mlx5dv_dek_create(3)).
    wrapped: bool = False

    # The key's cipher, made on first use and shared by every MKEY using this DEK: the
    # native accelerator's expanded key, or engine/xts.py XtsCipher's AES-ECB contexts
    # (contexts that are never finalized can be reused); engine/backend.py picks.
    _cipher: XtsCipher | NativeXts | None = field(default=None, init=False, repr=False,
                                                  compare=False)

    def transform(self, data, unit_size: int, first_unit: int, initial_tweak: int,
                  encrypt: bool, out: np.ndarray | None = None) -> bytes | np.ndarray:
        """XTS over ``data`` (engine/xts.py xts_transform). With ``out`` (a uint8 array of
        len(data) bytes) the result is written there and ``out`` returned; else bytes."""
        if self._cipher is None or not backend.is_current(self._cipher):
            self._cipher = backend.xts_cipher(self.key)
        src = as_uint8(data)
        if out is None and isinstance(self._cipher, NativeXts):
            # Straight into new bytes: no copy of a result array.
            return self._cipher.transform_into(src, unit_size, first_unit, initial_tweak,
                                               encrypt, None)
        result = out if out is not None else np.empty(len(src), dtype=np.uint8)
        self._cipher.transform_into(src, unit_size, first_unit, initial_tweak, encrypt, result)
        return result if out is not None else result.tobytes()


def check_mr_range(addr: int, length: int, verb: str = "ibv_reg_mr") -> None:
    """EINVAL for a registration whose iova range passes 2^64: its last byte would have
    no address (a device refuses it as the kernel refuses an address range that
    wraps)."""
    if addr + length > 1 << 64:
        raise einval(f"{verb}: iova {addr:#x} + length {length} passes 2^64")


def check_mr_access(access: int, verb: str = "ibv_reg_mr") -> None:
    """EINVAL for access flags an MR may not have (ibv_reg_mr(3))."""
    if access & ~MR_ACCESS:
        raise einval(f"{verb} access {access:#x} has flags outside {int(MR_ACCESS):#x}")
    # ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set,
    # then IBV_ACCESS_LOCAL_WRITE must be set too."
    for flag in (AccessFlags.REMOTE_WRITE, AccessFlags.REMOTE_ATOMIC):
        if access & flag and not access & AccessFlags.LOCAL_WRITE:
            raise einval(f"IBV_ACCESS_{flag.name} requires IBV_ACCESS_LOCAL_WRITE")


# The packets an RC requester may have unacknowledged (engine/rc_requester.py), by
# default: 1,024, 4 MiB at MTU 4096. rxe stops at 128 (RXE_MAX_UNACKED_PSNS), which
# ``serve --rc-window 128`` restores; an mlx5 device has no such small bound, and over
# our TCP links 128 held a 1 MiB READ to half its responses per round trip and a 1 MiB
# WRITE at MTU 1024 to 128 KiB in flight (docs/performance.md, "The RC window"). A
# go-back-N rewind resends at most one window, once per window (rc_completer.py).
DEFAULT_RC_WINDOW = 1024
# The bounds ``rc_window`` may take. At least 16 packets: the responder acknowledges every
# ACK_EVERY (16) packets and a message's last (rc_responder.py), and our packets carry no
# AckReq bit, so a smaller window would stall each message on the ACK timeout. At most
# 16,384: 64 MiB at MTU 4096 resent by one rewind, and far below half the 24-bit PSN
# space, where a late packet could no longer be told from an early one.
RC_WINDOW_MIN, RC_WINDOW_MAX = 16, 16384


# Key indexes: the upper 24 bits of an lkey / rkey.
_KEY_INDEXES = 1 << 24


class HCA:
    """One simulated mlx5 device (``mlx5_0``) and the host memory behind it."""

    def __init__(self, name: str = "mlx5_0", crypto: DeviceCrypto | None = None, *,
                 strict_blocks: bool = False, rc_window: int = DEFAULT_RC_WINDOW) -> None:
        if not RC_WINDOW_MIN <= rc_window <= RC_WINDOW_MAX:
            raise einval(f"rc_window {rc_window}: packets in [{RC_WINDOW_MIN}, "
                         f"{RC_WINDOW_MAX}] are expected")
        self.name = name
        # The unacknowledged packets each of its RC requesters may have on the wire.
        self.rc_window = rc_window
        # The crypto import method, KEK and credential, fixed for the device's life.
        self.crypto = crypto or DeviceCrypto()
        # docs/blocks.md: with strict_blocks a signature MKEY's layout and every
        # transfer through it must be whole protection blocks; without, a trailing
        # partial block passes as plain data and is only counted.
        self.strict_blocks = strict_blocks
        self.partial_blocks = {"partial_block_transfers": 0, "partial_block_layouts": 0}
        self._handles = itertools.count(1)
        # Key index in the upper 24 bits, an 8-bit variant in the lower, as mlx5 keys
        # look. Both are drawn at random from their whole space, and an index is never
        # given twice while its key lives: a key learnt from one's own registration
        # says nothing of a neighbour's (counted indexes left only the variant to
        # guess). Never index 0, so that a zero key is always unknown.
        self._live_indexes: set[int] = set()
        self._next_va = VA_BASE
        self.keys: dict[int, object] = {}
        self.pds: dict[int, PD] = {}
        self.deks: dict[int, DEK] = {}

    # -- allocation ---------------------------------------------------------
    def new_key(self) -> int:
        """A fresh lkey/rkey: a random key index in use by no live MR or MKEY of this
        device, and a random variant. The caller's table entry (``keys``) and
        ``release_key`` keep the index reserved exactly while the key lives."""
        if len(self._live_indexes) >= _KEY_INDEXES - 1:
            raise RDMAError("ENOMEM", f"{self.name} has no free key index")
        while True:
            index = secrets.randbelow(_KEY_INDEXES - 1) + 1
            if index not in self._live_indexes:
                self._live_indexes.add(index)
                return (index << 8) | secrets.randbelow(256)

    def release_key(self, key: int) -> None:
        """The key's object is gone: its index may be drawn again."""
        if self.keys.pop(key, None) is not None:
            self._live_indexes.discard(key >> 8)

    def alloc_pd(self) -> PD:
        pd = PD(self, next(self._handles))
        self.pds[pd.handle] = pd
        return pd

    def reg_mr(self, pd: PD, length: int, access: int, at: tuple[int, Any] | None = None
               ) -> MR:
        """ibv_reg_mr(3): ``length`` bytes of fresh device-side memory, or with ``at``
        (address, buffer) the caller's ``length`` bytes, registered at that address."""
        if length <= 0:
            raise einval(f"ibv_reg_mr length {length} must be positive")
        check_mr_access(access)
        if at is not None:
            check_mr_range(at[0], length)
        addr, buf = self.fresh_memory(length) if at is None else at
        mr = MR(pd, addr, length, access, self.new_key(), buf)
        self.keys[mr.lkey] = mr
        return mr

    def fresh_memory(self, length: int) -> tuple[int, np.ndarray]:
        """``length`` zeroed bytes of the device's host memory and their address."""
        addr, buf = self._next_va, np.zeros(length, dtype=np.uint8)
        self._next_va += (length + PAGE - 1) // PAGE * PAGE + PAGE
        return addr, buf

    def dereg_mr(self, mr: MR) -> None:
        mr.valid = False
        self.release_key(mr.lkey)

    def create_dek(self, attr: DEKInitAttr, session_login: CryptoLogin | None = None) -> DEK:
        """mlx5dv_dek_create(3). The key is plaintext or wrapped as the crypto login says:
        with MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN, ``attr.crypto_login`` (None: plaintext);
        without it (the old API), the context's login session ``session_login`` on a
        wrapped-import device, plaintext otherwise (docs/crypto-import.md)."""
        pd = attr.pd
        if not isinstance(pd, PD) or pd.hca is not self:
            raise einval("mlx5dv_dek_create needs a PD of this device")
        want = DEK_KEY_BYTES.get(attr.key_size)
        if want is None:
            raise einval(f"key_size {attr.key_size} is not MLX5DV_CRYPTO_KEY_SIZE_128 or _256")
        if attr.key_purpose != CryptoKeyPurpose.AES_XTS:
            raise einval(f"key_purpose {attr.key_purpose} is not "
                         "MLX5DV_CRYPTO_KEY_PURPOSE_AES_XTS")
        lg = self._dek_login(attr, session_login)
        if len(attr.opaque) > 8:
            raise einval(f"opaque is char[8], got {len(attr.opaque)} bytes")
        if len(self.deks) >= 1 << LOG_MAX_NUM_DEKS:
            raise RDMAError("ENOMEM", f"{self.name} holds {len(self.deks)} DEKs, its "
                                      f"log_max_num_deks is {LOG_MAX_NUM_DEKS}")
        key, keytag = self._dek_key(attr, lg, want)
        dek = DEK(pd, next(self._handles), attr.key_size, key, bool(attr.has_keytag),
                  keytag if attr.has_keytag else bytes(8), opaque=bytes(attr.opaque),
                  wrapped=self.crypto.wrapped)
        self.deks[dek.handle] = dek
        return dek

    def _dek_login(self, attr: DEKInitAttr,
                   session_login: CryptoLogin | None) -> CryptoLogin | None:
        """The crypto login a DEK is created under (None: none, plaintext import)."""
        if attr.comp_mask & ~DEK_INIT_ATTR_CRYPTO_LOGIN:
            raise einval(f"comp_mask {attr.comp_mask:#x} has bits other than "
                         "MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN")
        if attr.comp_mask & DEK_INIT_ATTR_CRYPTO_LOGIN:
            lg = attr.crypto_login
        elif attr.crypto_login is not None:
            raise einval("crypto_login must be NULL when MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN is "
                         "not set in comp_mask")
        else:
            lg = session_login if self.crypto.wrapped else None
        if lg is not None and not isinstance(lg, CryptoLogin):
            raise einval("crypto_login is not a crypto login object of this device")
        return lg

    def _dek_key(self, attr: DEKInitAttr, lg: CryptoLogin | None,
                 want: int) -> tuple[bytes, bytes | None]:
        """The DEK's key (key1 || key2, unwrapped if it came wrapped) and keytag."""
        key = bytes(attr.key)
        keytag = bytes(attr.keytag) if attr.has_keytag else None
        if self.crypto.wrapped:
            if lg is None:
                raise einval("this device imports DEKs wrapped only "
                             "(MLX5DV_CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS): create the DEK "
                             "in a crypto login session (mlx5dv_crypto_login) or with a crypto "
                             "login object (MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN)")
            if lg.device is not self.crypto:
                raise einval("crypto_login belongs to another device")
            key, tag = unwrap_dek(lg, key, attr.key_size, bool(attr.has_keytag))
            keytag = tag if tag is not None else keytag
        elif lg is not None:
            raise einval("this device imports DEKs in plaintext only: crypto_login must be NULL")
        elif attr.has_keytag and len(key) == want + KEYTAG_BYTES:
            # mlx5dv_dek_create(3)'s table: a plaintext key with a keytag is
            # key1 + key2 + keytag_64b.
            key, keytag = key[:want], key[want:]
        if len(key) != want:
            raise einval(f"an AES-XTS DEK of key_size {attr.key_size} takes {want} bytes "
                         f"(key1 || key2), got {len(key)}")
        # IEEE 1619-2007 5.1 / FIPS-mode devices and OpenSSL refuse key1 == key2.
        if key[:want // 2] == key[want // 2:]:
            raise einval("AES-XTS key halves must differ (key1 == key2 is refused)")
        if attr.has_keytag and len(keytag) != KEYTAG_BYTES:
            raise einval("a DEK keytag is 8 bytes")
        return key, keytag

    def destroy_dek(self, dek: DEK) -> None:
        dek.state = DekState.ERROR
        self.deks.pop(dek.handle, None)

    def create_mkey(self, pd: PD, create_flags: int, max_entries: int) -> MKey:
        if not create_flags & MkeyInitAttrFlags.INDIRECT:
            raise einval("mlx5dv_create_mkey needs MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT")
        if create_flags & ~MKEY_CREATE_FLAGS:
            raise einval(f"create_flags {create_flags:#x} has unknown flags")
        if max_entries <= 0:
            raise einval(f"max_entries {max_entries} must be positive")
        mkey = MKey(pd, self.new_key(), int(create_flags), int(max_entries))
        self.keys[mkey.lkey] = mkey
        return mkey

    def destroy_mkey(self, mkey: MKey) -> None:
        mkey.invalidate()
        self.release_key(mkey.lkey)
