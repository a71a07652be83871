"""The pyverbs bridge (client/pyverbs/_sync.py) under misuse: first use from 8 threads
at once, a call from the bridge's own loop thread, Ctrl-C and a timeout in the middle of
a call, a fork after first use, and objects left open at exit.

The bridge is per process, so each case runs in a fresh interpreter; it prints what it
measured as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def run_case(code: str, timeout: float = 60) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-X", "dev", "-c", textwrap.dedent(code)],
                       capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[-1]), r.stderr


def test_eight_threads_first_use_start_one_embedded_daemon():
    out, err = run_case("""
        import json, threading
        import softhca.server.daemon as d
        made = []
        init = d.Daemon.__init__
        def counting(self, *a, **k):
            made.append(1)
            init(self, *a, **k)
        d.Daemon.__init__ = counting
        from softhca.client.pyverbs import _sync
        from softhca.client.pyverbs.device import Context
        barrier = threading.Barrier(8)
        addresses, errors = [], []
        def first_use():
            barrier.wait()
            try:
                ctx = Context(name="mlx5_0")
                addresses.append(_sync.target()[0])
                ctx.close()
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=first_use) for _ in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(json.dumps({"daemons": len(made), "addresses": sorted(set(addresses)),
                          "contexts": len(addresses), "errors": errors}))
    """)
    print(f"\n8 threads' first use: {out['daemons']} embedded daemon(s), addresses "
          f"{out['addresses']}, {out['contexts']} contexts opened, errors {out['errors']}")
    assert out["daemons"] == 1 and len(out["addresses"]) == 1 and out["contexts"] == 8
    assert "never awaited" not in err


def test_loop_thread_ctrl_c_timeout_fork_and_exit():
    out, err = run_case("""
        import asyncio, json, os, signal, threading, time, errno
        from softhca.client.pyverbs import _sync
        from softhca.client.pyverbs.device import Context
        from softhca.client.pyverbs.pd import PD
        from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
        res = {}
        ctx = Context(name="mlx5_0")
        pd = PD(ctx)                     # left open at exit, as a careless program does
        # A call from the loop's own thread.
        box = []
        def on_loop():
            try:
                _sync.run(asyncio.sleep(0))
                box.append("ran")
            except PyverbsRDMAError as e:
                box.append((e.error_code, str(e)))
        _sync._loop.call_soon_threadsafe(on_loop)
        time.sleep(0.3)
        res["loop_thread"] = [box[0][0] == errno.EDEADLK, box[0][1][:60]]
        # A timeout: the coroutine is cancelled.
        state = {}
        async def slow(tag):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                state[tag] = "cancelled"
                raise
        t0 = time.perf_counter()
        try:
            _sync.run(slow("timeout"), "Failed to wait", timeout=0.3)
        except PyverbsRDMAError as e:
            res["timeout"] = [e.error_code == errno.ETIMEDOUT, round(time.perf_counter() - t0, 2)]
        time.sleep(0.1)
        res["timeout_coroutine"] = state.get("timeout")
        # Ctrl-C in the middle of a call.
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            _sync.run(slow("ctrl-c"))
        except KeyboardInterrupt:
            res["ctrl_c"] = "KeyboardInterrupt"
        time.sleep(0.1)
        res["ctrl_c_coroutine"] = state.get("ctrl-c")
        # fork after first use: the child's call fails at once with EIO naming fork.
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            t0 = time.perf_counter()
            try:
                PD(ctx)
                msg = "no error"
            except PyverbsRDMAError as e:
                msg = f"{e.error_code} {'fork' in str(e)} {time.perf_counter() - t0:.3f}"
            os.write(w, msg.encode())
            os._exit(0)
        os.waitpid(pid, 0)
        res["fork_child"] = os.read(r, 200).decode()
        res["parent_after_fork"] = PD(ctx) is not None
        print(json.dumps(res))
    """)
    print(f"\npyverbs bridge: {out}; 'never awaited' warnings at exit: "
          f"{err.count('never awaited')}")
    assert out["loop_thread"][0] is True
    assert out["timeout"][0] is True and out["timeout"][1] < 2.0
    assert out["timeout_coroutine"] == "cancelled"
    assert out["ctrl_c"] == "KeyboardInterrupt" and out["ctrl_c_coroutine"] == "cancelled"
    code, names_fork, took = out["fork_child"].split()
    assert code == "5" and names_fork == "True" and float(took) < 1.0       # EIO
    assert out["parent_after_fork"] is True
    assert "never awaited" not in err and "Task was destroyed" not in err, err
