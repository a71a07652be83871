"""An AES-XTS volume: the target's memory holds only ciphertext, the wire only plaintext.

The target creates a DEK (mlx5dv_dek_create(3)) and an MKEY with crypto attributes
(mlx5dv_wr_set_mkey_crypto(3)) over its memory. With encrypt_on_tx false, data going
out through the MKEY (TX) is decrypted and data coming in (RX) is encrypted, so an
initiator that RDMA_WRITEs plaintext to the MKEY leaves ciphertext in the target's
memory and reads plaintext back.

Each data unit of 512 bytes is one XTS "sector": unit k of the MKEY uses the tweak
initial_tweak + k, as 16 little-endian bytes. The example checks the memory against
cryptography's own AES-XTS with those tweaks.

Run: python examples/xts_volume.py
"""

from __future__ import annotations

import asyncio
import os
import sys

from _common import Checks, rc_pair, xts

import softhca.client as sh

UNIT = 512
N_UNITS = 8
FIRST_SECTOR = 0x2000        # the volume's first sector number: the initial tweak


def new_key() -> bytes:
    # AES-256-XTS: key1 || key2, 64 bytes; equal halves are refused (IEEE 1619, FIPS).
    while True:
        key = os.urandom(64)
        if key[:32] != key[32:]:
            return key


async def main() -> int:
    check = Checks()
    key = new_key()
    async with sh.embedded() as target_node, sh.embedded() as initiator_node:
        target, initiator = await rc_pair(target_node, initiator_node)

        dek = await target.ctx.create_dek(sh.Mlx5DEKInitAttr(
            pd=target.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256, key=key))
        crypto = sh.Mlx5CryptoAttr(
            crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS,
            encrypt_on_tx=False,             # TX decrypts, RX encrypts
            data_unit_size=sh.MLX5DV_BLOCK_SIZE_512,
            initial_tweak=FIRST_SECTOR.to_bytes(16, "little"),
            dek=dek)
        volume, mkey = await target.mkey_over(N_UNITS * UNIT, crypto=crypto)

        plaintext = os.urandom(N_UNITS * UNIT)
        src = await initiator.pd.reg_mr(len(plaintext), sh.IBV_ACCESS_LOCAL_WRITE)
        await src.write(plaintext)
        wc = await initiator.rdma_write(src, mkey.rkey)
        check("RDMA_WRITE of plaintext completes", wc.status, sh.IBV_WC_SUCCESS)
        stored = await volume.read()
        check("the volume holds AES-XTS ciphertext, tweak = first sector + unit (cryptography)",
              stored, xts(key, plaintext, UNIT, FIRST_SECTOR, encrypt=True))

        dst = await initiator.pd.reg_mr(len(plaintext), sh.IBV_ACCESS_LOCAL_WRITE)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        check("RDMA_READ back completes", wc.status, sh.IBV_WC_SUCCESS)
        check("the initiator reads the plaintext", await dst.read(), plaintext)

        # A read of sectors 3..4 alone: the remote address on the MKEY is an offset, and
        # the tweak follows the unit's place in the MKEY, not in the transfer.
        part = await initiator.pd.reg_mr(2 * UNIT, sh.IBV_ACCESS_LOCAL_WRITE)
        wc = await initiator.rdma_read(part, mkey.rkey, remote_addr=3 * UNIT)
        check("RDMA_READ of units 3 and 4 completes", wc.status, sh.IBV_WC_SUCCESS)
        check("  and decrypts them with tweaks first sector + 3 and + 4", await part.read(),
              xts(key, stored[3 * UNIT:5 * UNIT], UNIT, FIRST_SECTOR + 3, encrypt=False))
    return check.status()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
