"""T10-DIF end to end across processes: the target is a `softhca serve` daemon.

mlx5dv_wr_set_mkey_sig_block(3) examples 2.1 and 2: the target's MKEY has a T10-DIF
*wire domain* every 4096 bytes and no memory domain. The initiator RDMA_WRITEs data with
its PI (the PI protects the data all the way from the initiator); the target checks each
block, strips the PI and stores the data alone. An RDMA_READ of the MKEY has a fresh
T10-DIF generated for every 4096 bytes.

Without options it starts its own target daemon, as you would on a storage node:

    softhca serve --listen 127.0.0.1:0 --token-file TOKEN --peer-token-file TOKEN \
                  --ready-file READY

on a free loopback port (port 0; the daemon writes the port it got to READY), the token
a fresh random one in a private file. With ``--target HOST:PORT [--token-file FILE]``
it uses a daemon you started instead, and with ``--initiator HOST:PORT`` a second one
as the initiator; otherwise the initiator is a daemon embedded in this process, with
the same token, which it also proves as the peer token of its wire link (the target
must have been started with ``--peer-token-file`` naming that file), listening on
the address that routes to the target (``sh.embedded(peer=...)``), so that a target on
another host or in a container can connect back; ``--listen IP`` names another.

Run: python examples/two_process.py [--target HOST:PORT [--initiator HOST:PORT]
                                     [--token-file FILE]] [--listen IP]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import Checks, rc_pair, t10dif_pi

import softhca.client as sh

BLOCK, PI = 4096, 8
N_BLOCKS = 4
BG, APP_TAG, REF_TAG = 0xFFFF, 0x5A5A, 0x1000     # the values of the man page's example

SIG = sh.Mlx5SigBlockAttr(
    mem=None,
    wire=sh.Mlx5SigBlockDomain(
        sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
        dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=BG, app_tag=APP_TAG,
                             ref_tag=REF_TAG, flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
        block_size=sh.MLX5DV_BLOCK_SIZE_4096),
    check_mask=0xFF)         # every byte of the PI: guard, app tag, ref tag


@contextlib.contextmanager
def serve_process(workdir: Path):
    """``softhca serve`` in a subprocess on a free loopback port; yields (address, token)."""
    token = secrets.token_hex(32).encode()
    token_file = workdir / "token"
    token_file.touch(mode=0o600)
    token_file.write_bytes(token + b"\n")
    ready, log = workdir / "ready", workdir / "serve.log"
    # `python -m softhca.tools.cli` is the `softhca` command, found without PATH.
    cmd = [sys.executable, "-m", "softhca.tools.cli", "serve", "--listen", "127.0.0.1:0",
           "--token-file", str(token_file), "--peer-token-file", str(token_file),
           "--ready-file", str(ready)]
    with open(log, "w") as log_out:
        proc = subprocess.Popen(cmd, stdout=log_out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"softhca serve did not start:\n{log.read_text()}")
            time.sleep(0.05)
        address = ready.read_text().strip()
        print(f"started softhca serve (pid {proc.pid}) on {address}")
        yield address, token
    finally:
        # SIGTERM: the daemon flushes every outstanding WR and closes its connections.
        proc.terminate()
        try:
            status = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        print(f"softhca serve stopped, exit status {status}")


async def run(target_address: str, initiator_address: str | None, token: bytes | None,
              listen: str | None) -> int:
    check = Checks()
    async with contextlib.AsyncExitStack() as stack:
        target_node = await stack.enter_async_context(
            await sh.connect(target_address, token=token))
        if initiator_address:
            initiator_node = await stack.enter_async_context(
                await sh.connect(initiator_address, token=token))
        else:
            initiator_node = await stack.enter_async_context(
                sh.embedded(token=token, host=listen, peer=target_address, peer_token=token))
        print(f"target daemon {target_node.address}, initiator daemon "
              f"{initiator_node.address}" + ("" if initiator_address else " (in this process)"))
        target, initiator = await rc_pair(target_node, initiator_node)

        disk, mkey = await target.mkey_over(N_BLOCKS * BLOCK, sig=SIG)

        # What the initiator sends: each block followed by its T10-DIF, ref tag
        # REF_TAG + block index (REF_REMAP).
        data = os.urandom(N_BLOCKS * BLOCK)
        image = b"".join(
            data[b * BLOCK:(b + 1) * BLOCK]
            + t10dif_pi(data[b * BLOCK:(b + 1) * BLOCK], bg=BG, app_tag=APP_TAG,
                        ref_tag=REF_TAG + b)
            for b in range(N_BLOCKS))
        src = await initiator.pd.reg_mr(len(image), sh.IBV_ACCESS_LOCAL_WRITE)
        await src.write(image)
        wc = await initiator.rdma_write(src, mkey.rkey)
        check(f"RDMA_WRITE of {len(image)} bytes, data and PI, completes", wc.status,
              sh.IBV_WC_SUCCESS)
        if wc.status != sh.IBV_WC_SUCCESS:
            print(f"      {wc}")      # its vendor_err says why, when the daemon knows
        check("the target daemon's memory holds the data alone", await disk.read(), data)
        # The writer's completion says nothing about the PI (a signature error is not a
        # transport error): only the target's mkey_check does.
        err = await mkey.mkey_check()
        print(f"      target mkey_check: {err}")
        check("the target's mkey_check after the WRITE", err.err_type, sh.MLX5DV_MKEY_NO_ERR)

        dst = await initiator.pd.reg_mr(len(image), sh.IBV_ACCESS_LOCAL_WRITE)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        check("RDMA_READ back completes", wc.status, sh.IBV_WC_SUCCESS)
        check("the initiator reads each block with a T10-DIF generated by the target (crcmod)",
              await dst.read(), image)
    return check.status()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", metavar="HOST:PORT",
                        help="a running `softhca serve` (default: start one)")
    parser.add_argument("--initiator", metavar="HOST:PORT",
                        help="with --target: a running daemon for the initiator (default: "
                        "one embedded in this process)")
    parser.add_argument("--token-file", metavar="FILE", help="the daemons' token")
    parser.add_argument("--listen", metavar="IP",
                        help="where this process's daemon listens for the target's packets "
                        "(default: this host's address on the route to the target)")
    args = parser.parse_args()
    if args.target:
        # As `softhca serve --token-file` reads it: trailing whitespace is not the token.
        token = Path(args.token_file).read_bytes().rstrip() if args.token_file else None
        return asyncio.run(run(args.target, args.initiator, token, args.listen))
    with tempfile.TemporaryDirectory() as tmp, serve_process(Path(tmp)) as (address, token):
        return asyncio.run(run(address, None, token, args.listen))


if __name__ == "__main__":
    sys.exit(main())
