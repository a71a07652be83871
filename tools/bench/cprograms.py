"""``softhca bench --c``: unmodified C programs on softhca beside kernel TCP, both between
the same two network namespaces joined by a veth pair (namespaces.py), in one run.

Each side is one ``softhca run`` with its own embedded daemon. The server side runs
qperf's server and perftest's two servers at once; the client side runs, one after the
other, each program's client, its output between markers:

- qperf ``tcp_lat`` (64 B) and ``tcp_bw`` (64 KiB): kernel TCP between the two
  namespaces, the ceilings; the same qperf binary and server as the rows below;
- qperf ``-cm1`` ``rc_lat`` (64 B), ``rc_bw`` and ``rc_rdma_write_bw`` (64 KiB): RC
  through softhca's provider and librdmacm;
- perftest ``ib_send_lat -s 64`` (its typical latency) and ``ib_write_bw -s 1M``;
- iSER, where tgt and libiscsi are installed and ``make provider`` built
  provider/build/iscsicheck: tgtd (its iSER portal through softhca's librdmacm) on the
  server side, iscsicheck on the client side writing a LUN in 256 KiB WRITE(16)s, one
  in flight, then reading it back in READ(16)s; each pass timed by iscsicheck itself
  (MB/s of 1e6 bytes). Without them the iSER rows alone are skipped, saying why.

Latencies are one-way, half a round trip, in every program: qperf's ``latency`` and
perftest's ``t_typical`` alike. Units, as the programs print them: qperf's bandwidth
steps by 1000 (bytes/sec, KB/sec, MB/sec, GB/sec; src/qperf.c) and its times are ns, us,
ms or sec; perftest's "MB/sec" is 2^20 bytes a second (its format_factor 0x100000).
Every bandwidth here is converted to 1e6 bytes a second (MB/s), as the rest of the bench.

Numbers and ratios only; ``softhca bench goals`` judges them. Without root, the
provider or the programs, the section says why it was skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..native import PROVIDER_DIR, PROVIDER_LIB
from . import namespaces
from .common import sig4

KIB, MIB = 1 << 10, 1 << 20
LAT_SIZE = 64
BW_SIZE = 64 * KIB
WRITE_SIZE = MIB
QPERF_PORT = 19765          # qperf's listen port (its default)
SEND_LAT_PORT = 18515       # perftest's (its default)
WRITE_BW_PORT = 18516
PROGRAMS = ("qperf", "ib_send_lat", "ib_write_bw")
ISER_PROGRAMS = ("tgtd", "tgtadm")
ISCSICHECK = PROVIDER_DIR / "iscsicheck"
ISER_CHUNK = 256 * KIB
ISER_TARGET = "iqn.2026-11.org.softhca:bench"
ISER_INITIATOR = "iqn.2026-11.org.softhca:bench-client"
# (test, message size, -cm1): the TCP ceilings first, each beside its RC rows.
QPERF_TESTS = (("tcp_lat", LAT_SIZE, False), ("rc_lat", LAT_SIZE, True),
               ("tcp_bw", BW_SIZE, False), ("rc_bw", BW_SIZE, True),
               ("rc_rdma_write_bw", BW_SIZE, True))
# (ratio name, figure, ceiling): each a figure of the run over a TCP ceiling of the run.
RATIOS = (("rc_lat_to_tcp_lat", ("qperf", "rc_lat", "latency_us"), "tcp_lat"),
          ("ib_send_lat_to_tcp_lat", ("perftest", "ib_send_lat", "typical_us"), "tcp_lat"),
          ("rc_bw_to_tcp_bw", ("qperf", "rc_bw", "mb_s"), "tcp_bw"),
          ("rc_rdma_write_bw_to_tcp_bw", ("qperf", "rc_rdma_write_bw", "mb_s"), "tcp_bw"),
          ("ib_write_bw_to_tcp_bw", ("perftest", "ib_write_bw", "mb_s"), "tcp_bw"),
          ("iser_write_to_tcp_bw", ("iser", "write", "mb_s"), "tcp_bw"),
          ("iser_read_to_tcp_bw", ("iser", "read", "mb_s"), "tcp_bw"))
CEILING_FIELD = {"tcp_lat": "latency_us", "tcp_bw": "mb_s"}

SECTION = re.compile(r"^=== (\S+)\n(.*?)^=== \1 exit (\d+)$", re.M | re.S)
# qperf's figure line: "    latency  =  8.98 us", "    bw  =  1.18 GB/sec"
QPERF_FIGURE = re.compile(r"^\s+(latency|bw)\s+=\s+([\d.]+)\s+(\S+)\s*$", re.M)
QPERF_RATE = {"bytes/sec": 1.0, "KB/sec": 1e3, "MB/sec": 1e6, "GB/sec": 1e9, "TB/sec": 1e12}
QPERF_TIME_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "sec": 1e6}
# perftest's result row: "#bytes #iterations" then the figures
PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+(?:\s+[\d.]+)*)\s*$", re.M)
PERFTEST_MB = MIB / 1e6
# iscsicheck's figure lines: "wrote 67108864 bytes in 1.23 s (54.6 MB/s)"
ISCSICHECK_PASS = re.compile(r"^(wrote|read) (\d+) bytes in ([\d.]+) s \(([\d.]+) MB/s\)$",
                             re.M)


@dataclass(frozen=True)
class Plan:
    qperf_seconds: int      # qperf -t, per test
    send_lat_iterations: int
    write_bw_iterations: int
    iser_mib: int           # written, then read back, by iscsicheck


FULL = Plan(qperf_seconds=3, send_lat_iterations=1000, write_bw_iterations=1000, iser_mib=64)
QUICK = Plan(qperf_seconds=1, send_lat_iterations=100, write_bw_iterations=50, iser_mib=8)


class ParseError(ValueError):
    """A program's output without the figure it must print; the message quotes it."""


def unavailable() -> str | None:
    why = namespaces.unavailable()
    if why:
        return why
    if not (PROVIDER_DIR / PROVIDER_LIB).is_file():
        return "the provider is not built (make provider)"
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian's qperf and perftest)"
    return None


def iser_unavailable() -> str | None:
    """Why the iSER rows cannot run here (the rest of the section may), or None."""
    missing = [p for p in ISER_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian's tgt)"
    if not ISCSICHECK.is_file():
        return (f"{ISCSICHECK} is not built (make provider builds it where libiscsi-dev's "
                "header is installed)")
    return None


# -- the programs' output ----------------------------------------------------------------

def sections(out: str) -> dict[str, tuple[int, str]]:
    """The client script's output by section: {name: (exit status, its output)}."""
    return {m.group(1): (int(m.group(3)), m.group(2)) for m in SECTION.finditer(out)}


def qperf_figure(out: str) -> tuple[str, float]:
    """One qperf test's figure: ("latency", microseconds) or ("bw", MB/s of 1e6 bytes)."""
    found = QPERF_FIGURE.findall(out)
    if len(found) != 1 or "failed" in out:
        raise ParseError(f"qperf printed no single figure:\n{out[-400:]}")
    name, value, unit = found[0]
    scale = (QPERF_TIME_US if name == "latency" else QPERF_RATE).get(unit)
    if scale is None:
        raise ParseError(f"qperf's unit {unit!r} is not one it prints:\n{out[-400:]}")
    return name, float(value) * scale / (1.0 if name == "latency" else 1e6)


def perftest_row(out: str, size: int, iterations: int) -> list[float]:
    """The figures of perftest's result row for ``size`` bytes and ``iterations``."""
    for m in PERFTEST_ROW.finditer(out):
        if int(m.group(1)) == size and int(m.group(2)) == iterations:
            return [float(x) for x in m.group(3).split()]
    raise ParseError(f"no row of {size} bytes x {iterations} in:\n{out[-400:]}")


def send_lat_figures(out: str, size: int, iterations: int) -> dict:
    # t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (usec)
    f = perftest_row(out, size, iterations)
    if len(f) < 6:
        raise ParseError(f"ib_send_lat's row has {len(f)} figures, not 7:\n{out[-400:]}")
    return {"size": size, "iterations": iterations, "typical_us": f[2], "avg_us": f[3],
            "p99_us": f[5]}


def write_bw_figures(out: str, size: int, iterations: int) -> dict:
    # BW peak, BW average (2^20 bytes/s), MsgRate (Mpps)
    f = perftest_row(out, size, iterations)
    if len(f) < 3:
        raise ParseError(f"ib_write_bw's row has {len(f)} figures, not 3:\n{out[-400:]}")
    return {"size": size, "iterations": iterations, "mb_s": round(f[1] * PERFTEST_MB, 1)}


def iscsicheck_figures(out: str, size: int) -> dict:
    """iscsicheck's two passes over ``size`` bytes, and its verdict on what it read."""
    passes = {m.group(1): m for m in ISCSICHECK_PASS.finditer(out)}
    if set(passes) != {"wrote", "read"} or "compare ok:" not in out:
        raise ParseError(f"iscsicheck printed no write and read figures, or no compare "
                         f"ok:\n{out[-400:]}")
    figures = {}
    for name, key in (("wrote", "write"), ("read", "read")):
        m = passes[name]
        if int(m.group(2)) != size:
            raise ParseError(f"iscsicheck {name} {m.group(2)} bytes, not {size}:\n{out[-400:]}")
        figures[key] = {"size": ISER_CHUNK, "bytes": size, "seconds": float(m.group(3)),
                        "mb_s": float(m.group(4))}
    return figures


# -- the run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Where:
    """The files the two scripts share (one temporary directory both sides see) and
    tgtd's control port (a UNIX socket of the host: a number no other run uses)."""

    tmp: Path
    iser: bool
    control: int

    @property
    def done(self) -> Path:     # the client side is through: tgtd may go
        return self.tmp / "client-done"

    @property
    def ready(self) -> Path:    # tgtd's target is set up
        return self.tmp / "tgtd-ready"

    @property
    def tgt_log(self) -> Path:  # what tgtd and tgtadm said
        return self.tmp / "tgtd.log"


def _iser_server(plan: Plan, w: Where) -> list[str]:
    lun = w.tmp / "lun1.img"
    adm = f"tgtadm -C {w.control} --lld iser"
    log = f">>{w.tgt_log} 2>&1"
    return [
        f"truncate -s {plan.iser_mib}M {lun}",
        f"tgtd -f -C {w.control} {log} & t=$!",
        # tgtadm answers once tgtd's control socket is up
        f"for i in $(seq 100); do {adm} --mode sys --op show >/dev/null 2>&1 && break; "
        "sleep 0.1; done",
        f"{adm} --mode target --op new --tid 1 --targetname {ISER_TARGET} {log}",
        f"{adm} --mode logicalunit --op new --tid 1 --lun 1 --backing-store {lun} {log}",
        f"{adm} --mode target --op bind --tid 1 --initiator-address ALL {log}",
        # tgt's rule for iSER: the initiator's name bound
        f"{adm} --mode target --op bind --tid 1 --initiator-name {ISER_INITIATOR} {log}",
        f"{adm} --mode sys --op show {log}",
        f"touch {w.ready}"]


def _server_script(plan: Plan, w: Where) -> str:
    send = f"ib_send_lat -p {SEND_LAT_PORT} -s {LAT_SIZE} -n {plan.send_lat_iterations}"
    write = f"ib_write_bw -p {WRITE_BW_PORT} -s {WRITE_SIZE} -n {plan.write_bw_iterations}"
    lines = ["#!/bin/sh", f"qperf -lp {QPERF_PORT} & q=$!", f"{send} & s=$!",
             f"{write} & w=$!", *(_iser_server(plan, w) if w.iser else []),
             'wait "$s"; echo "=== ib_send_lat-server exit $?"',
             'wait "$w"; echo "=== ib_write_bw-server exit $?"',
             'wait "$q"; echo "=== qperf-server exit $?"']
    if w.iser:
        # tgtd runs until it is killed; its sessions have ended with the client's side.
        # Its control socket and lock (tgt's TGT_IPC_DIR) would outlive it: removed.
        lines += [f"while [ ! -e {w.done} ]; do sleep 0.1; done", 'kill -KILL "$t"',
                  'wait "$t"', f"rm -f /var/run/tgtd/socket.{w.control} "
                  f"/var/run/tgtd/socket.{w.control}.lock"]
    return "\n".join([*lines, ""])


def _section(name: str, command: str) -> list[str]:
    return [f"echo '=== {name}'", f"{command} 2>&1", f'echo "=== {name} exit $?"']


def _client_script(plan: Plan, addr: str, w: Where) -> str:
    lines = ["#!/bin/sh"]
    for test, size, cm in QPERF_TESTS:
        lines += _section(test, f"qperf -lp {QPERF_PORT}{' -cm1' if cm else ''} -t "
                                f"{plan.qperf_seconds} -m {size} {addr} {test}")
    lines.append(f"qperf -lp {QPERF_PORT} {addr} quit >/dev/null 2>&1")
    lines += _section("ib_send_lat", f"ib_send_lat -p {SEND_LAT_PORT} -s {LAT_SIZE} -n "
                                     f"{plan.send_lat_iterations} {addr}")
    lines += _section("ib_write_bw", f"ib_write_bw -p {WRITE_BW_PORT} -s {WRITE_SIZE} -n "
                                     f"{plan.write_bw_iterations} {addr}")
    if w.iser:
        lines += _section("iscsicheck", f"{ISCSICHECK} {ISER_INITIATOR} "
                                        f"iser://{addr}/{ISER_TARGET}/1 {plan.iser_mib} "
                                        f"{ISER_CHUNK // KIB}")
    lines.append(f"touch {w.done}")
    return "\n".join([*lines, ""])


def _timeout(plan: Plan) -> float:
    # Each qperf test runs -t seconds plus its set-up; perftest's iterations on a loaded
    # machine take up to a few ms each (ib_send_lat) or tens of ms (1 MiB writes).
    return (60.0 + len(QPERF_TESTS) * (plan.qperf_seconds + 15)
            + plan.send_lat_iterations * 0.02 + plan.write_bw_iterations * 0.2
            + plan.iser_mib * 0.5)


def _run_programs(plan: Plan, iser: bool, progress) -> tuple[str, str]:
    """Both sides' output: the client's sections and the server's."""
    with tempfile.TemporaryDirectory(prefix="softhca-bench-c-") as tmp, \
            namespaces.two_namespaces() as pair:
        # tgtd takes a control port up to 32767; test_iser.py's are below 31000.
        w = Where(Path(tmp), iser, 31000 + os.getpid() % 1700)
        scripts = []
        for name, text in (("server.sh", _server_script(plan, w)),
                           ("client.sh", _client_script(plan, pair.server[1], w))):
            path = w.tmp / name
            path.write_text(text)
            path.chmod(0o755)
            scripts.append(str(path))
        progress("C programs: starting the servers (qperf, perftest" +
                 (", tgtd)" if iser else ")"))
        srv = pair.start(pair.server, ["sh", scripts[0]])
        for port in (QPERF_PORT, SEND_LAT_PORT, WRITE_BW_PORT):
            namespaces.wait_listening(srv, port)
        if iser:
            namespaces.wait_file(srv, w.ready)
        progress(f"C programs: qperf (-t {plan.qperf_seconds} each), perftest"
                 + (", iSER" if iser else ""))
        cli = pair.start(pair.client, ["sh", scripts[1]])
        done = namespaces.finish(cli, _timeout(plan))
        # The servers end once their clients did; a perftest server whose client never
        # came (the client side failed before it) would wait for good, so it is not
        # waited for then.
        came = all(sections(done.output).get(p, (1, ""))[0] == 0
                   for p in ("ib_send_lat", "ib_write_bw"))
        served = namespaces.finish(srv, 30.0 if came else 1.0).output
        if iser:
            served += "\n--- tgtd and tgtadm:\n" + _read(w.tgt_log)
    return done.output, served


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as e:
        return f"({path.name}: {e.strerror})"


def _figures(plan: Plan, out: str) -> dict:
    """The section's figures from the client's output; ParseError when one is missing."""
    found = sections(out)
    qperf: dict = {}
    for test, size, _ in QPERF_TESTS:
        text = _ran(found, test)
        name, value = qperf_figure(text)
        key = "latency_us" if name == "latency" else "mb_s"
        qperf[test] = {"size": size, key: round(value, 3 if name == "latency" else 1)}
    perftest = {
        "ib_send_lat": send_lat_figures(_ran(found, "ib_send_lat"), LAT_SIZE,
                                        plan.send_lat_iterations),
        "ib_write_bw": write_bw_figures(_ran(found, "ib_write_bw"), WRITE_SIZE,
                                        plan.write_bw_iterations)}
    return {"qperf": qperf, "perftest": perftest}


def _iser_figures(plan: Plan, out: str, served: str = "") -> dict:
    try:
        return iscsicheck_figures(_ran(sections(out), "iscsicheck"), plan.iser_mib * MIB)
    except ParseError as e:
        tgt = served.rpartition("--- tgtd and tgtadm:\n")[2] if served else ""
        return {"skipped": f"iscsicheck failed: {e}"[:600]
                + (f"\n--- tgtd and tgtadm said:\n{tgt[-400:]}" if tgt else "")}


def _ran(found: dict[str, tuple[int, str]], name: str) -> str:
    if name not in found:
        raise ParseError(f"{name} printed no section")
    status, text = found[name]
    if status:
        raise ParseError(f"{name} exited {status}:\n{text[-400:]}")
    return text


def ratios(section: dict) -> dict:
    """Each figure over its TCP ceiling of the same run (RATIOS)."""
    out = {}
    for name, (program, test, key), ceiling in RATIOS:
        if test not in section.get(program, {}):
            continue        # the iSER rows, skipped
        c = section["qperf"][ceiling][CEILING_FIELD[ceiling]]
        out[name] = sig4(section[program][test][key] / c) if c > 0 else None
    return out


def c_rows(quick: bool = False, progress=lambda _msg: None, plan: Plan | None = None) -> dict:
    """The section: its figures, their ratios and how it ran; or {"skipped": why}."""
    why = unavailable()
    if why:
        return {"skipped": why}
    plan = plan or (QUICK if quick else FULL)
    start = time.perf_counter()
    iser_why = iser_unavailable()
    try:
        out, served = _run_programs(plan, iser_why is None, progress)
    except (namespaces.NamespaceError, OSError) as e:
        return {"skipped": f"the C programs could not run: {e}"[:800]}
    try:
        section = _figures(plan, out)
    except ParseError as e:
        # The side that failed first is often the server (its daemon gone): both said.
        return {"skipped": f"a C program failed: {e}\n--- server side:\n"
                           f"{served[-400:]}"[:1200]}
    section["iser"] = ({"skipped": iser_why} if iser_why
                       else _iser_figures(plan, out, served))
    section["ratios"] = ratios(section)
    section["setup"] = {
        "namespaces": "two network namespaces joined by a veth pair, each side one "
                      "`softhca run` with its own daemon",
        "server": namespaces.SERVER_ADDR, "client": namespaces.CLIENT_ADDR,
        "wire_port": namespaces.WIRE_PORT, "plan": asdict(plan),
        "seconds": round(time.perf_counter() - start, 1)}
    return section


# -- the table ---------------------------------------------------------------------------

ROW_TEXT = {
    "rc_lat_to_tcp_lat": "qperf -cm1 rc_lat 64 B",
    "ib_send_lat_to_tcp_lat": "perftest ib_send_lat -s 64, typical",
    "rc_bw_to_tcp_bw": "qperf -cm1 rc_bw 64 KiB",
    "rc_rdma_write_bw_to_tcp_bw": "qperf -cm1 rc_rdma_write_bw 64 KiB",
    "ib_write_bw_to_tcp_bw": "perftest ib_write_bw -s 1M, average",
    "iser_write_to_tcp_bw": "iSER WRITE(16) 256 KiB, one in flight",
    "iser_read_to_tcp_bw": "iSER READ(16) 256 KiB, one in flight",
}


def c_table_rows(section: dict) -> list[list[str]]:
    """[figure, value, ceiling, ratio] per ratio of the section."""
    rows = []
    for name, (program, test, key), ceiling in RATIOS:
        if test not in section.get(program, {}):
            continue
        value = section[program][test][key]
        c = section["qperf"][ceiling][CEILING_FIELD[ceiling]]
        unit = "us" if key.endswith("_us") else "MB/s"
        r = section["ratios"].get(name)
        rows.append([ROW_TEXT[name], f"{value:.1f} {unit}", f"{ceiling} {c:.1f} {unit}",
                     "-" if r is None else f"{r:.3g}"])
    return rows
