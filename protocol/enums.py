"""The enums of verbs.h and mlx5dv.h, with their C names and values.

Users port C and pyverbs code to softhca, so every name and number here is the
one in rdma-core's headers (docs/semantics.md section 1). Each enum is an IntEnum
whose member names drop the common C prefix; `C_NAMES` maps every full C name
(``IBV_ACCESS_REMOTE_READ``, ``MLX5DV_SIG_TYPE_T10DIF``, ...) to its value so
that ``from softhca.protocol.enums import *`` gives code that reads like C.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class SigType(IntEnum):
    """enum mlx5dv_sig_type"""

    T10DIF = 0
    CRC = 1


class SigT10difBgType(IntEnum):
    """enum mlx5dv_sig_t10dif_bg_type"""

    CRC = 0
    CSUM = 1


class SigCrcType(IntEnum):
    """enum mlx5dv_sig_crc_type"""

    CRC32 = 0
    CRC32C = 1
    CRC64_XP10 = 2


# PI bytes per block (mlx5dv_wr_set_mkey_sig_block(3)): a T10DIF's guard, app tag and
# ref tag, or the CRC.
T10DIF_PI_BYTES = 8
CRC_PI_BYTES = {SigCrcType.CRC32: 4, SigCrcType.CRC32C: 4, SigCrcType.CRC64_XP10: 8}


class BlockSize(IntEnum):
    """enum mlx5dv_block_size: the values are indexes, not byte counts."""

    SIZE_512 = 0
    SIZE_520 = 1
    SIZE_4048 = 2
    SIZE_4096 = 3
    SIZE_4160 = 4

    @property
    def nbytes(self) -> int:
        return BLOCK_SIZE_BYTES[self]


BLOCK_SIZE_BYTES = {
    BlockSize.SIZE_512: 512,
    BlockSize.SIZE_520: 520,
    BlockSize.SIZE_4048: 4048,
    BlockSize.SIZE_4096: 4096,
    BlockSize.SIZE_4160: 4160,
}


class SigT10difFlags(IntFlag):
    """enum mlx5dv_sig_t10dif_flags"""

    REF_REMAP = 1
    APP_ESCAPE = 2
    APP_REF_ESCAPE = 4


class SigMask(IntEnum):
    """enum mlx5dv_sig_mask: bit 7 is the first PI byte (mlx5dv_wr_set_mkey_sig_block(3))."""

    T10DIF_GUARD = 0xC0
    T10DIF_APPTAG = 0x30
    T10DIF_REFTAG = 0x0F
    CRC32 = 0xF0
    CRC32C = 0xF0  # same value as CRC32: an alias, as in mlx5dv.h
    CRC64_XP10 = 0xFF


class SigBlockAttrFlags(IntFlag):
    """enum mlx5dv_sig_block_attr_flags"""

    COPY_MASK = 1


class MkeyConfFlags(IntFlag):
    """enum mlx5dv_mkey_conf_flags"""

    RESET_SIG_ATTR = 1


class MkeyInitAttrFlags(IntFlag):
    """enum mlx5dv_mkey_init_attr_flags"""

    INDIRECT = 1
    BLOCK_SIGNATURE = 2
    CRYPTO = 4
    UPDATE_TAG = 8
    REMOTE_INVALIDATE = 16


class MkeyErrType(IntEnum):
    """enum mlx5dv_mkey_err_type: REFTAG is numerically before APPTAG, as in mlx5dv.h."""

    NO_ERR = 0
    BAD_GUARD = 1
    BAD_REFTAG = 2
    BAD_APPTAG = 3


class CryptoStandard(IntEnum):
    """enum mlx5dv_crypto_standard"""

    AES_XTS = 0


class SignatureCryptoOrder(IntEnum):
    """enum mlx5dv_signature_crypto_order"""

    SIGNATURE_AFTER_CRYPTO_ON_TX = 0
    SIGNATURE_BEFORE_CRYPTO_ON_TX = 1


class CryptoKeySize(IntEnum):
    """enum mlx5dv_crypto_key_size"""

    SIZE_128 = 0
    SIZE_256 = 1


class CryptoKeyPurpose(IntEnum):
    """enum mlx5dv_crypto_key_purpose"""

    AES_XTS = 0


class DekState(IntEnum):
    """enum mlx5dv_dek_state"""

    READY = 0
    ERROR = 1


class CryptoLoginState(IntEnum):
    """enum mlx5dv_crypto_login_state"""

    VALID = 0
    NO_LOGIN = 1
    INVALID = 2


class CryptoEnginesCaps(IntFlag):
    """enum mlx5dv_crypto_engines_caps"""

    AES_XTS = 1
    AES_XTS_SINGLE_BLOCK = 2
    AES_XTS_MULTI_BLOCK = 4


class CryptoWrappedImportMethodCaps(IntFlag):
    """enum mlx5dv_crypto_wrapped_import_method_caps"""

    AES_XTS = 1


class CryptoCapsFlags(IntFlag):
    """enum mlx5dv_crypto_caps_flags"""

    CRYPTO = 1
    WRAPPED_CRYPTO_OPERATIONAL = 2
    WRAPPED_CRYPTO_GOING_TO_COMMISSIONING = 4


class DekInitAttrMask(IntFlag):
    """enum mlx5dv_dek_init_attr_mask"""

    CRYPTO_LOGIN = 1


class Mlx5dvQpCreateFlags(IntFlag):
    """enum mlx5dv_qp_create_flags"""

    TUNNEL_OFFLOADS = 1
    TIR_ALLOW_SELF_LOOPBACK_UC = 2
    TIR_ALLOW_SELF_LOOPBACK_MC = 4
    DISABLE_SCATTER_TO_CQE = 8
    ALLOW_SCATTER_TO_CQE = 16
    PACKET_BASED_CREDIT_MODE = 32
    SIG_PIPELINING = 64


class EventType(IntEnum):
    """enum ibv_event_type (ibv_get_async_event(3))"""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    COMM_EST = 4
    SQ_DRAINED = 5
    PATH_MIG = 6
    PATH_MIG_ERR = 7
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10
    LID_CHANGE = 11
    PKEY_CHANGE = 12
    SM_CHANGE = 13
    SRQ_ERR = 14
    SRQ_LIMIT_REACHED = 15
    QP_LAST_WQE_REACHED = 16
    CLIENT_REREGISTER = 17
    GID_CHANGE = 18
    WQ_FATAL = 19


class WcStatus(IntEnum):
    """enum ibv_wc_status"""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WrOpcode(IntEnum):
    """enum ibv_wr_opcode"""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9
    TSO = 10
    DRIVER1 = 11
    ATOMIC_WRITE = 15


class WcOpcode(IntEnum):
    """enum ibv_wc_opcode; DRIVER1 is the completion of an MKEY configure WR."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    TSO = 7
    ATOMIC_WRITE = 9
    RECV = 128
    RECV_RDMA_WITH_IMM = 129
    DRIVER1 = 135


class AccessFlags(IntFlag):
    """enum ibv_access_flags"""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 16
    ZERO_BASED = 32


class MwType(IntEnum):
    """enum ibv_mw_type"""

    TYPE_1 = 1
    TYPE_2 = 2


class ReregMrFlags(IntFlag):
    """enum ibv_rereg_mr_flags"""

    CHANGE_TRANSLATION = 1
    CHANGE_PD = 2
    CHANGE_ACCESS = 4


class QpState(IntEnum):
    """enum ibv_qp_state"""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


class QpAttrMask(IntFlag):
    """enum ibv_qp_attr_mask: which fields of struct ibv_qp_attr ibv_modify_qp applies"""

    STATE = 1 << 0
    CUR_STATE = 1 << 1
    EN_SQD_ASYNC_NOTIFY = 1 << 2
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    QKEY = 1 << 6
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    ALT_PATH = 1 << 14
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    PATH_MIG_STATE = 1 << 18
    CAP = 1 << 19
    DEST_QPN = 1 << 20


class QpType(IntEnum):
    """enum ibv_qp_type"""

    RC = 2
    UC = 3
    UD = 4


class SendFlags(IntFlag):
    """enum ibv_send_flags"""

    FENCE = 1
    SIGNALED = 2
    SOLICITED = 4
    INLINE = 8


class WcFlags(IntFlag):
    """enum ibv_wc_flags"""

    GRH = 1
    WITH_IMM = 2
    IP_CSUM_OK = 4
    WITH_INV = 8


class Mtu(IntEnum):
    """enum ibv_mtu"""

    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @property
    def nbytes(self) -> int:
        return 128 << self.value


class Mlx5dvQpExSendOps(IntFlag):
    """enum mlx5dv_qp_create_send_ops_flags"""

    WITH_MR_INTERLEAVED = 1
    WITH_MR_LIST = 2
    WITH_MKEY_CONFIGURE = 4
    WITH_RAW_WQE = 8
    WITH_MEMCPY = 16


# Each enum's C prefix: the C name of a member is PREFIX + member name.
_C_PREFIXES: list[tuple[type, str]] = [
    (SigType, "MLX5DV_SIG_TYPE_"),
    (SigT10difBgType, "MLX5DV_SIG_T10DIF_"),
    (SigCrcType, "MLX5DV_SIG_CRC_TYPE_"),
    (BlockSize, "MLX5DV_BLOCK_"),
    (SigT10difFlags, "MLX5DV_SIG_T10DIF_FLAG_"),
    (SigMask, "MLX5DV_SIG_MASK_"),
    (SigBlockAttrFlags, "MLX5DV_SIG_BLOCK_ATTR_FLAG_"),
    (MkeyConfFlags, "MLX5DV_MKEY_CONF_FLAG_"),
    (MkeyInitAttrFlags, "MLX5DV_MKEY_INIT_ATTR_FLAGS_"),
    (MkeyErrType, "MLX5DV_MKEY_SIG_"),
    (CryptoStandard, "MLX5DV_CRYPTO_STANDARD_"),
    (SignatureCryptoOrder, "MLX5DV_SIGNATURE_CRYPTO_ORDER_"),
    (CryptoKeySize, "MLX5DV_CRYPTO_KEY_"),
    (CryptoKeyPurpose, "MLX5DV_CRYPTO_KEY_PURPOSE_"),
    (DekState, "MLX5DV_DEK_STATE_"),
    (CryptoLoginState, "MLX5DV_CRYPTO_LOGIN_STATE_"),
    (CryptoEnginesCaps, "MLX5DV_CRYPTO_ENGINES_CAP_"),
    (CryptoWrappedImportMethodCaps, "MLX5DV_CRYPTO_WRAPPED_IMPORT_METHOD_CAP_"),
    (CryptoCapsFlags, "MLX5DV_CRYPTO_CAPS_"),
    (DekInitAttrMask, "MLX5DV_DEK_INIT_ATTR_"),
    (Mlx5dvQpCreateFlags, "MLX5DV_QP_CREATE_"),
    (EventType, "IBV_EVENT_"),
    (WcStatus, "IBV_WC_"),
    (WrOpcode, "IBV_WR_"),
    (WcOpcode, "IBV_WC_"),
    (AccessFlags, "IBV_ACCESS_"),
    (MwType, "IBV_MW_"),
    (ReregMrFlags, "IBV_REREG_MR_"),
    (QpState, "IBV_QPS_"),
    (QpAttrMask, "IBV_QP_"),
    (QpType, "IBV_QPT_"),
    (SendFlags, "IBV_SEND_"),
    (WcFlags, "IBV_WC_"),
    (Mtu, "IBV_"),
    (Mlx5dvQpExSendOps, "MLX5DV_QP_EX_"),
]

# C names that do not follow PREFIX + member: mlx5dv.h spells these out.
_C_SPECIAL = {
    "MLX5DV_MKEY_NO_ERR": MkeyErrType.NO_ERR,
    "MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD": MkeyErrType.BAD_GUARD,
    "MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG": MkeyErrType.BAD_REFTAG,
    "MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG": MkeyErrType.BAD_APPTAG,
}


def _c_names() -> dict[str, int]:
    names: dict[str, int] = {}
    for enum_cls, prefix in _C_PREFIXES:
        if enum_cls is MkeyErrType:
            continue
        # __members__ keeps aliases such as MLX5DV_SIG_MASK_CRC32C.
        for member_name, member in enum_cls.__members__.items():
            key = prefix + member_name
            if key in names and names[key] != member.value:
                raise AssertionError(f"C name clash: {key}")
            names[key] = member
    for key, member in _C_SPECIAL.items():
        names[key] = member
    return names


C_NAMES: dict[str, int] = _c_names()
globals().update(C_NAMES)
__all__ = [cls.__name__ for cls, _ in _C_PREFIXES] + ["BLOCK_SIZE_BYTES", "C_NAMES", *C_NAMES]
