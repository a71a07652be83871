"""``softhca crypto-test-info``: the JSON file rdma-core's test_mlx5_crypto.py reads.

The upstream crypto tests read ``MLX5_CRYPTO_TEST_INFO`` (default
/tmp/mlx5_crypto_test.txt): a JSON list whose first element holds, each as a list of
integers the test packs back into bytes,

- ``credential``: ``struct.pack('!6Q', ...)``, the device's credential wrapped under
  its import KEK (48 bytes);
- ``wrapped_key`` (``'!5Q'``, 40 bytes) and ``wrapped_256_bits_key`` (``'!9Q'``, 72):
  ENC(iv_64b + key1 + key2) of a 128- and a 256-bit AES-XTS key, no keytag;
- ``plaintext_key`` (``'8I'``, native order, 32 bytes) and ``plaintext_256_bits_key``
  (``'16I'``, 64): the same two keys in plaintext;
- ``encrypted_data_for_512_c`` (``'!64Q'``) and ``encrypted_data_for_1024_c``
  (``'!128Q'``): 512 and 1024 bytes of b'c' encrypted with the 128-bit key, data units
  of 512 bytes and initial tweak 0, the test's MKEY crypto attributes; unit k's tweak is
  the data unit sequence number k, 16 bytes little-endian (IEEE 1619, and
  mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each data_unit_size").

The two encrypted fields are computed with ``cryptography``'s own AES-XTS, one
context per data unit, never with the engine, so that the upstream data validation
checks the engine against an independent implementation.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

from . import oracle

# test_mlx5_crypto.py: MLX5DV_BLOCK_SIZE_512 data units, initial_tweak pack('!2Q', 0, 0).
DATA_UNIT = 512


def xts_key(n: int) -> bytes:
    """A random AES-XTS key of ``n`` bytes whose halves differ (IEEE 1619 refuses equal)."""
    while True:
        key = os.urandom(n)
        if key[:n // 2] != key[n // 2:]:
            return key


def encrypt_units(key: bytes, data: bytes, first_tweak: int = 0) -> bytes:
    """``data`` in DATA_UNIT units, unit k under tweak ``first_tweak + k``: the oracle's
    XTS, cryptography's own, never the engine."""
    return oracle.xts(key, data, DATA_UNIT, first_tweak, encrypt=True)


def test_info(device, key128: bytes | None = None, key256: bytes | None = None) -> dict:
    """The fields for ``device`` (an engine DeviceCrypto); the keys are random unless given."""
    key128 = key128 or xts_key(32)
    key256 = key256 or xts_key(64)
    return {
        "credential": list(struct.unpack("!6Q", device.wrapped_credential())),
        "wrapped_key": list(struct.unpack("!5Q", device.wrap(key128))),
        "plaintext_key": list(struct.unpack("8I", key128)),
        "wrapped_256_bits_key": list(struct.unpack("!9Q", device.wrap(key256))),
        "plaintext_256_bits_key": list(struct.unpack("16I", key256)),
        "encrypted_data_for_512_c": list(struct.unpack("!64Q", encrypt_units(key128,
                                                                             b"c" * 512))),
        "encrypted_data_for_1024_c": list(struct.unpack("!128Q", encrypt_units(key128,
                                                                               b"c" * 1024))),
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "crypto-test-info",
        help="write the MLX5_CRYPTO_TEST_INFO file rdma-core's test_mlx5_crypto.py reads",
        description="Write, for a device crypto configuration (the one given to `softhca "
        "serve --crypto-config` or SOFTHCA_CRYPTO_CONFIG), the JSON file rdma-core's "
        "test_mlx5_crypto.py reads through MLX5_CRYPTO_TEST_INFO: the credential wrapped "
        "under the import KEK, a 128- and a 256-bit AES-XTS key in plaintext and wrapped, "
        "and the expected ciphertext of 512 and 1024 bytes of 'c' (computed with "
        "cryptography's XTS, not the engine). See docs/crypto-import.md.")
    p.add_argument("--config", metavar="FILE",
                   help="the device crypto configuration (JSON; default: the built-in "
                   "import KEK and credential)")
    p.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..server.crypto_config import load_crypto_config

    try:
        device = load_crypto_config(args.config or {})
    except ValueError as e:
        print(f"softhca crypto-test-info: {e}", file=sys.stderr)
        return 2
    info = test_info(device)
    try:
        with open(args.out, "w") as f:
            json.dump([info], f)
            f.write("\n")
    except OSError as e:
        print(f"softhca crypto-test-info: cannot write {args.out}: {e.strerror}",
              file=sys.stderr)
        return 1
    mode = "wrapped" if device.wrapped else "plaintext"
    print(f"wrote {args.out} for a device in {mode} import method; run the upstream tests "
          f"with MLX5_CRYPTO_TEST_INFO={args.out}")
    return 0
