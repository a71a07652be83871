"""``softhca explain``'s configuration: the attributes of mlx5dv_wr_set_mkey_sig_block(3)
and mlx5dv_wr_set_mkey_crypto(3) as the flags give them (or a row of the crypto page's
table), parsed, and checked by the engine's own rules; and the words a signature
domain is described in. tools/explain.py derives the pipelines from it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocol.attrs import T10DIF_PI_FIELDS, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    SigBlockAttrFlags,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
)
from ..protocol.errors import RDMAError
from . import crypto_table

if TYPE_CHECKING:
    from ..engine.signature import DomainSpec


def _signature():
    """engine/signature.py, the device's rules, when a configuration is explained: not
    when softhca's parser is built (`softhca --help` does not load the engine)."""
    from ..engine import signature

    return signature

TX, RX = "TX", "RX"
MEMORY, WIRE = "memory", "wire"
CRYPTO_PAGE = crypto_table.PAGE

BLOCK_SIZES = tuple(BLOCK_SIZE_BYTES.values())     # enum mlx5dv_block_size, in bytes

T10DIF_FLAG_NAMES = {f.name.lower(): f for f in SigT10difFlags}

# The CRC types by the names the flags use: (enum mlx5dv_sig_crc_type, the name of its
# PI field, the guard's description).
CRCS = {
    "crc32": (SigCrcType.CRC32, "crc32", "CRC32 (FC-PH, poly 0x04C11DB7)"),
    "crc32c": (SigCrcType.CRC32C, "crc32c", "CRC32C (iSCSI, poly 0x1EDC6F41)"),
    "crc64": (SigCrcType.CRC64_XP10, "crc64", "CRC64_XP10 (poly 0xAD93D23594C93659)"),
}
CRC_BY_TYPE = {t: (name, text) for name, (t, _, text) in CRCS.items()}
KIND_ALIASES = {"t10dif": "t10dif", "t10-dif": "t10dif", "dif": "t10dif", "crc32": "crc32",
                "crc32c": "crc32c", "crc64": "crc64", "crc64_xp10": "crc64",
                "crc64-xp10": "crc64"}

# check_mask / copy_mask names (bit 7 is PI byte 0; enum mlx5dv_sig_mask).
MASK_NAMES = {"guard": 0xC0, "app": 0x30, "apptag": 0x30, "app_tag": 0x30, "ref": 0x0F,
              "reftag": 0x0F, "ref_tag": 0x0F, "crc32": 0xF0, "crc32c": 0xF0, "crc": 0xF0,
              "crc64": 0xFF, "crc64_xp10": 0xFF, "all": 0xFF, "none": 0}

ORDERS = {"after": "SIGNATURE_AFTER_CRYPTO_ON_TX", "before": "SIGNATURE_BEFORE_CRYPTO_ON_TX"}
ORDER_ALIASES = {"after": "after", "0": "after", "signature_after_crypto_on_tx": "after",
                 "before": "before", "1": "before", "signature_before_crypto_on_tx": "before"}
BOOLS = {"1": True, "true": True, "yes": True, "on": True,
         "0": False, "false": False, "no": False, "off": False}


class ConfigError(ValueError):
    """A configuration the setters would refuse, or flags that do not describe one."""


# -- the configuration ------------------------------------------------------------------

@dataclass(frozen=True)
class PiField:
    name: str           # guard, app, ref; or the CRC's name
    label: str          # for sentences: "guard", "app tag", "CRC32C"
    first: int          # its first PI byte
    size: int
    byte_names: tuple[str, ...]


# -- a signature domain, as the engine validated it (engine/signature.py DomainSpec) -----

def is_t10dif(d: DomainSpec) -> bool:
    return d.sig_type == SigType.T10DIF


def title(d: DomainSpec) -> str:
    return "T10-DIF" if is_t10dif(d) else SigCrcType(d.crc_type).name


# A T10-DIF PI field's short name and its name in sentences; its bytes are named by the
# short name's initial and their significance (G1 G0, A1 A0, R3 R2 R1 R0).
T10DIF_FIELD_WORDS = {"guard": ("guard", "guard"), "app_tag": ("app", "app tag"),
                      "ref_tag": ("ref", "ref tag")}


def layout_fields(d: DomainSpec) -> list[PiField]:
    """The PI fields of a block in domain ``d``, with their bytes' names."""
    if is_t10dif(d):
        return [PiField(*T10DIF_FIELD_WORDS[f], lo, hi - lo,
                        tuple(f"{T10DIF_FIELD_WORDS[f][0][0].upper()}{hi - lo - 1 - i}"
                              for i in range(hi - lo)))
                for f, (lo, hi) in T10DIF_PI_FIELDS.items()]
    n = d.pi_size
    return [PiField(CRC_BY_TYPE[d.crc_type][0], title(d), 0, n,
                    tuple(f"C{n - 1 - i}" for i in range(n)))]


def flag_names(d: DomainSpec) -> list[str]:
    return [f.name for f in SigT10difFlags if d.flags & f]


def guard_text(d: DomainSpec) -> str:
    """How the guard (or the CRC) of a block is computed."""
    if is_t10dif(d):
        if d.bg_type == SigT10difBgType.CSUM:
            return f"IP checksum (RFC 1071, starting sum 0x{d.guard_seed:04x}) over the data"
        return f"CRC16 (T10-DIF, poly 0x8BB7, seed 0x{d.guard_seed:04x}) over the data"
    return (f"{CRC_BY_TYPE[d.crc_type][1]}, seed 0x{d.guard_seed:0{2 * d.pi_size}x}, "
            "over the data")


def field_value_text(d: DomainSpec, f: PiField) -> str:
    if f.name == "app":
        return f"app tag = 0x{d.app_tag:04x}"
    if f.name == "ref":
        if d.flags & SigT10difFlags.REF_REMAP:
            return f"ref tag = 0x{d.ref_tag:08x} + block index (REF_REMAP)"
        return f"ref tag = 0x{d.ref_tag:08x}"
    if f.name == "guard":
        return f"guard = {guard_text(d)}"
    return guard_text(d)


def domain_json(d: DomainSpec) -> dict:
    out: dict = {"sig_type": SigType(d.sig_type).name, "kind": title(d),
                 "block_size": d.block_size, "pi_size": d.pi_size}
    if is_t10dif(d):
        out.update(bg_type=SigT10difBgType(d.bg_type).name, bg=d.guard_seed,
                   app_tag=d.app_tag, ref_tag=d.ref_tag, flags=flag_names(d))
    else:
        out["seed"] = d.guard_seed
    return out


@dataclass(frozen=True)
class Crypto:
    """struct mlx5dv_crypto_attr, as far as the pipeline depends on it (AES-XTS)."""

    encrypt_on_tx: bool = False
    order: str = "after"        # after | before: SIGNATURE_*_CRYPTO_ON_TX
    dus: int = 512              # data_unit_size in bytes
    tweak: int = 0              # initial_tweak as an integer (16 bytes little-endian)
    key_bits: int = 256         # AES-XTS-128 (a 32-byte DEK) or -256 (64 bytes)

    def to_json(self) -> dict:
        return {"standard": "AES_XTS", "encrypt_on_tx": self.encrypt_on_tx,
                "signature_crypto_order": ORDERS[self.order], "data_unit_size": self.dus,
                "initial_tweak": f"0x{self.tweak:032x}", "key_bits": self.key_bits}


@dataclass(frozen=True)
class Config:
    """The attributes given: the sig setter's domains as struct mlx5dv_sig_block_domain
    (None: no signature there), its masks, and the crypto setter's."""

    mem: SigBlockDomain | None = None
    wire: SigBlockDomain | None = None
    check_mask: int = 0
    copy_mask: int | None = None        # given: MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK
    crypto: Crypto | None = None
    row: str | None = None

    @property
    def has_sig(self) -> bool:
        return self.mem is not None or self.wire is not None


def row_config(row: str, check_mask: int | None = None, copy_mask: int | None = None) -> Config:
    """The crypto table's row as a configuration (tools/crypto_table.py): the letter
    selects one, and its pipelines are derived like any other's."""
    r = crypto_table.CONFIGS[row.upper()]
    if check_mask is None:
        check_mask = 0xFF if r.mem_sig or r.wire_sig else 0
    order = "after" if r.order == SignatureCryptoOrder.SIGNATURE_AFTER_CRYPTO_ON_TX else "before"
    return Config(r.mem_sig, r.wire_sig, check_mask, copy_mask,
                  Crypto(r.encrypt_on_tx, order, r.unit, crypto_table.TWEAK), row.upper())


# -- parsing the flags ----------------------------------------------------------------

def _int(key: str, text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key}={text!r} is not a number "
                                         "(decimal or 0x...)") from None


def _pairs(spec: str, what: str, keys: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key or not value.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not KEY=VALUE (in {what})")
        if key not in keys:
            raise argparse.ArgumentTypeError(f"unknown key {key!r} for {what}; the keys are: "
                                             + ", ".join(keys))
        if key in out:
            raise argparse.ArgumentTypeError(f"{key} given twice (in {what})")
        out[key] = value.strip()
    return out


T10DIF_KEYS = ("block", "block_size", "bg_type", "bg", "seed", "app", "app_tag", "ref",
               "ref_tag", "flags")
CRC_KEYS = ("block", "block_size", "seed")
CRYPTO_KEYS = ("encrypt_on_tx", "eot", "order", "signature_crypto_order", "dus",
               "data_unit_size", "tweak", "initial_tweak", "key", "key_bits")


def _block(key: str, text: str) -> int:
    value = _int(key, text)
    if value not in BLOCK_SIZES:
        raise argparse.ArgumentTypeError(
            f"{key}={text}: not an mlx5dv_block_size; the sizes are "
            + ", ".join(map(str, BLOCK_SIZES)) + " bytes")
    return value


def parse_domain(spec: str) -> SigBlockDomain | None:
    """``none``, ``t10dif:block=512,bg=crc,app=0x1234,ref=0x10,flags=ref_remap`` or
    ``crc32c:block=4096,seed=0xffffffff`` (also crc32, crc64)."""
    kind_text, _, rest = spec.partition(":")
    kind_text = kind_text.strip().lower()
    if kind_text == "none":
        if rest.strip():
            raise argparse.ArgumentTypeError("'none' takes no keys")
        return None
    kind = KIND_ALIASES.get(kind_text)
    if kind is None:
        raise argparse.ArgumentTypeError(
            f"unknown signature type {kind_text!r}; give t10dif, crc32, crc32c, crc64 or none "
            "(e.g. t10dif:block=512,app=0x1234 or crc32c:block=4096,seed=0xffffffff)")
    kv = _pairs(rest, kind_text, T10DIF_KEYS if kind == "t10dif" else CRC_KEYS)
    block = kv.get("block", kv.get("block_size"))
    if "block" in kv and "block_size" in kv:
        raise argparse.ArgumentTypeError("block and block_size name the same field")
    size = BLOCK_SIZES.index(_block("block", block) if block is not None else 512)
    if kind != "t10dif":
        return SigBlockDomain(sig_type=SigType.CRC, block_size=size,
                              crc=SigCrc(CRCS[kind][0], _crc_seed(kind, kv)))
    bg_type, bg = _t10dif_guard(kv)
    flags = _t10dif_flags(kv.get("flags", ""))
    dif = SigT10dif(bg_type=SigT10difBgType[bg_type.upper()], bg=bg,
                    app_tag=_either(kv, "app", "app_tag"), ref_tag=_either(kv, "ref", "ref_tag"),
                    flags=flags)
    return SigBlockDomain(sig_type=SigType.T10DIF, block_size=size, dif=dif)


def _crc_seed(kind: str, kv: dict[str, str]) -> int:
    """A CRC domain's seed: 0 unless given, as a number or as all ones."""
    if "seed" not in kv:
        return 0
    width = 64 if CRCS[kind][0] == SigCrcType.CRC64_XP10 else 32
    if kv["seed"].lower() in ("ones", "~0", "-1", "all"):
        return (1 << width) - 1
    return _int("seed", kv["seed"])


def _t10dif_guard(kv: dict[str, str]) -> tuple[str, int]:
    """The guard type and seed of a T10-DIF domain, from bg_type, bg (a type or a seed)
    and seed."""
    bg_type, bg = "crc", 0
    for key in ("bg_type", "bg"):
        if key not in kv:
            continue
        text = kv[key].lower()
        if text in ("crc", "csum"):
            if "bg_type" in kv and key == "bg":
                raise argparse.ArgumentTypeError("bg=crc|csum and bg_type both give the guard "
                                                 "type")
            bg_type = text
        elif key == "bg_type":
            raise argparse.ArgumentTypeError(f"bg_type={kv[key]!r}: the guard types are crc "
                                             "and csum")
        else:
            bg = _int("bg", kv[key])
    if "seed" in kv:
        if any(k == "bg" and kv[k].lower() not in ("crc", "csum") for k in kv):
            raise argparse.ArgumentTypeError("bg=<number> and seed both give the guard seed")
        bg = _int("seed", kv["seed"])
    return bg_type, bg


def _t10dif_flags(text: str) -> int:
    """T10-DIF flag names joined by '|' or '+' (with or without the enum's prefix)."""
    flags = 0
    for name in text.replace("+", "|").split("|"):
        name = name.strip().lower()
        name = name.removeprefix("mlx5dv_sig_t10dif_flag_")
        if name in ("", "0", "none"):
            continue
        if name not in T10DIF_FLAG_NAMES:
            raise argparse.ArgumentTypeError(
                f"unknown T10-DIF flag {name!r}; the flags are "
                + ", ".join(T10DIF_FLAG_NAMES) + " (join several with '|' or '+')")
        flags |= T10DIF_FLAG_NAMES[name]
    return flags


def _either(kv: dict[str, str], a: str, b: str) -> int:
    """The number under key ``a`` or its alias ``b`` (0 when neither), not both."""
    if a in kv and b in kv:
        raise argparse.ArgumentTypeError(f"{a} and {b} name the same field")
    return _int(a, kv[a]) if a in kv else _int(b, kv[b]) if b in kv else 0


def parse_mask(text: str) -> int:
    """A check_mask / copy_mask: a number, or names joined by ',', '|' or '+'
    (guard, app, ref, crc32, crc32c, crc64, all, none)."""
    try:
        value = int(text, 0)
    except ValueError:
        value = 0
        for name in text.replace("+", ",").replace("|", ",").split(","):
            name = name.strip().lower()
            if name not in MASK_NAMES:
                raise argparse.ArgumentTypeError(
                    f"{text!r} is not a mask: give a number (0x00..0xff, bit 7 is the first PI "
                    "byte) or names joined by ',' (guard, app, ref, crc32, crc32c, crc64, all, "
                    "none)") from None
            value |= MASK_NAMES[name]
    if not 0 <= value <= 0xFF:
        raise argparse.ArgumentTypeError(f"{text}: check_mask and copy_mask are 8-bit masks")
    return value


def parse_crypto(spec: str) -> Crypto | None:
    """``none`` or ``aes-xts:encrypt_on_tx=1,order=before,dus=520[,tweak=N][,key=256]``."""
    std, _, rest = spec.partition(":")
    std = std.strip().lower()
    if std == "none":
        if rest.strip():
            raise argparse.ArgumentTypeError("'none' takes no keys")
        return None
    if std not in ("aes-xts", "aes_xts", "xts"):
        raise argparse.ArgumentTypeError(f"unknown crypto standard {std!r}: the only one is "
                                         "aes-xts (e.g. aes-xts:encrypt_on_tx=1,order=before,"
                                         "dus=520), or none")
    kv = _pairs(rest, "aes-xts", CRYPTO_KEYS)
    for a, b in (("encrypt_on_tx", "eot"), ("order", "signature_crypto_order"),
                 ("dus", "data_unit_size"), ("tweak", "initial_tweak"), ("key", "key_bits")):
        if a in kv and b in kv:
            raise argparse.ArgumentTypeError(f"{a} and {b} name the same field")
        if b in kv:
            kv[a] = kv.pop(b)
    eot = False
    if "encrypt_on_tx" in kv:
        if kv["encrypt_on_tx"].lower() not in BOOLS:
            raise argparse.ArgumentTypeError(f"encrypt_on_tx={kv['encrypt_on_tx']!r}: give 1 "
                                             "or 0 (true/false)")
        eot = BOOLS[kv["encrypt_on_tx"].lower()]
    order = "after"
    if "order" in kv:
        order = ORDER_ALIASES.get(kv["order"].lower().replace("mlx5dv_", ""), "")
        if not order:
            raise argparse.ArgumentTypeError(
                f"order={kv['order']!r}: give before (SIGNATURE_BEFORE_CRYPTO_ON_TX) or after "
                "(SIGNATURE_AFTER_CRYPTO_ON_TX)")
    dus = _block("dus", kv["dus"]) if "dus" in kv else 512
    tweak = _int("tweak", kv["tweak"]) if "tweak" in kv else 0
    if not 0 <= tweak < 1 << 128:
        raise argparse.ArgumentTypeError("tweak: initial_tweak is 16 bytes")
    key_bits = _int("key", kv["key"]) if "key" in kv else 256
    if key_bits not in (128, 256):
        raise argparse.ArgumentTypeError(f"key={key_bits}: AES-XTS keys are 128 or 256 bits")
    return Crypto(eot, order, dus, tweak, key_bits)


def validate(cfg: Config) -> None:
    """The sig setter's rules (docs/semantics.md section 4), by the engine's own validation, so
    that explain refuses exactly what mlx5dv_wr_set_mkey_sig_block(3) would; the domains as
    the engine keeps them (None without a signature)."""
    if not cfg.has_sig:
        if cfg.check_mask:
            raise ConfigError("--check-mask needs a signature domain (--mem or --wire)")
        if cfg.copy_mask is not None:
            raise ConfigError("--copy-mask needs a signature in both domains (--mem and --wire)")
        return None
    try:
        return _signature().validate_sig_block_attr(to_attr(cfg))
    except RDMAError as e:
        raise ConfigError(f"mlx5dv_wr_set_mkey_sig_block would fail with {e.errno_name}: "
                          f"{e.message}") from None


def to_attr(cfg: Config) -> SigBlockAttr:
    """The configuration as a struct mlx5dv_sig_block_attr."""
    flags = SigBlockAttrFlags.COPY_MASK if cfg.copy_mask is not None else 0
    return SigBlockAttr(mem=cfg.mem, wire=cfg.wire, flags=flags, check_mask=cfg.check_mask,
                        copy_mask=cfg.copy_mask or 0)

