"""The benches' output: a JSON document to save and compare, and a table to read."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict

from .common import CONFIGS, DEFAULT_MTU, MIB, size_text
from .cprograms import c_table_rows
from .engine import Report
from .ucx import ucx_lines


def to_json(report: Report) -> str:
    doc = {
        "benchmark": "engine",
        "mib": report.mib,
        "data_bytes": report.data_bytes,
        "repeat": report.repeat,
        "statistic": "best",
        "unit": "MB/s (1e6 bytes of memory-domain data per second)",
        "machine": report.machine,
        "results": [asdict(r) for r in report.results],
    }
    return json.dumps(doc, indent=2)


def to_table(report: Report) -> str:
    m = report.machine
    head = ["name", "engine MB/s", "primitive", "MB/s", "engine/primitive"]
    rows = [[r.name, f"{r.engine_mb_s:.1f}", r.primitive, f"{r.primitive_mb_s:.1f}",
             f"{r.ratio:.3g}"] for r in report.results]
    compared = all(r.python_mb_s is not None for r in report.results) and report.results
    if compared:
        # The native engine's rows beside the Python engine's, same run.
        head += ["python MB/s", "native/python"]
        for row, r in zip(rows, report.results, strict=True):
            row += [f"{r.python_mb_s:.1f}", f"{r.native_over_python:.3g}"]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    right = {1, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    backends = ", ".join(f"{k} {v}" for k, v in m["guard_backends"].items())
    ratios = [r.ratio for r in report.results]
    out = [
        f"softhca bench engine: {report.data_bytes / MIB:g} MiB of data per run, best of "
        f"{report.repeat} after one warm-up",
        f"python {m['python']} ({m['implementation']}), {m['cpu_count']} CPUs, {m['platform']}",
        f"guard backends: {backends}",
        _engine_line(m),
        "",
        line(head),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
        "",
        f"MB/s = 1e6 bytes of memory-domain data per second; primitive = one call over the "
        f"whole buffer (a ceiling). median engine/primitive {statistics.median(ratios):.3g}",
    ]
    return "\n".join(out)

def _engine_line(m: dict) -> str:
    """Which engine ran: native (with its XTS) or Python (and why)."""
    name = m.get("engine_backend", "python")
    if name == "native":
        return (f"engine: native (softhca.accel._native, XTS {m.get('native_xts', '?')}); "
                "python MB/s: the same transform on the Python engine (SOFTHCA_ENGINE=python)")
    return f"engine: python ({m.get('python_because', 'SOFTHCA_ENGINE')})"


def e2e_to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2)


def table_lines(head: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if k < left else c.rjust(w)
                         for k, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _mtu(doc: dict, row: dict) -> int:
    """A row's path MTU; documents saved before rows carried one ran all at the setup's."""
    return row.get("path_mtu", doc.get("setup", {}).get("path_mtu", DEFAULT_MTU))


def _check_name(doc: dict, check: dict) -> str:
    mtu = _mtu(doc, check)
    return check["config"] + ("" if mtu == doc["setup"]["path_mtu"] else f" (MTU {mtu})")


def e2e_to_table(doc: dict) -> str:
    m, o = doc["machine"], doc["options"]
    uv = f"uvloop {m['uvloop']}" if m["uvloop"] else "no uvloop (asyncio)"
    lo = m["loopback"]
    out = [
        "softhca bench: two `softhca serve` processes on loopback, driven by this process "
        f"through softhca.client; path MTU {doc['setup']['path_mtu']} unless the MTU column "
        "says otherwise" + (" (--quick)" if o["quick"] else ""),
        f"machine: {m['cpu_model']}, {m['cpu_count']} cores, Python {m['python']} "
        f"({m['implementation']}), {uv}, loopback {lo['interface']} MTU {lo['mtu']}, load "
        f"average at start {' '.join(str(x) for x in m['load_average_at_start'])}",
        f"each goodput run: up to {o['seconds']:g} s or {o['mib']:g} MiB, up to {o['depth']} "
        f"WRs in flight (at most {o['inflight_mib']:g} MiB), posted in lists with the last "
        "WR signaled",
        "",
        "goodput, MB/s of application data; ceilings: TCP = asyncio stream between two "
        "processes, same wire bytes and message size, best of three;",
        "engine = the target's transform alone (softhca.engine, RX for WRITE/SEND, TX for "
        "READ); ratio = goodput / ceiling, /min = to the lower;",
        "CPU T/I/C = cores busy in the target daemon, the initiator daemon and this client "
        "while the row ran (1.00 = one core)",
    ]
    for config in CONFIGS:
        rows = []
        for g in doc["goodput"]:
            if g["config"] != config:
                continue
            c, r = g["ceilings"], g["ratio"]
            u = g["cpu"]
            rows.append([g["op"], size_text(g["size"]), str(_mtu(doc, g)), str(g["depth"]),
                         f"{g['mb_s']:.1f}",
                         f"{c['tcp_stream']:.1f}", f"{c['engine']:.1f}",
                         f"{r['tcp_stream']:.3g}", f"{r['engine']:.3g}", f"{r['min']:.3g}",
                         f"{u['target']:.2f}/{u['initiator']:.2f}/{u['client']:.2f}"])
        out += ["", f"[{config}] {doc['configs'][config]}"]
        out += table_lines(["op", "size", "MTU", "depth", "MB/s", "TCP MB/s", "engine MB/s",
                            "/TCP", "/engine", "/min", "CPU T/I/C"], rows, left=2)
    lat = doc["latency"]
    many = doc["many_qps"]
    w = doc["wire_counters"]
    checks = ", ".join(f"{_check_name(doc, c)} memory "
                       f"{'intact' if c['memory_intact'] else 'CHANGED'}"
                       + (f", MKEY error {c['mkey_error']}" if c["config"] != "plain" else "")
                       for c in doc["checks"])
    out += [
        "",
        f"latency: {lat['size']}-byte RDMA_WRITE, one outstanding, signaled, post_send to "
        f"its completion, {lat['samples']} samples: p50 {lat['p50_us']:.1f} us, p99 "
        f"{lat['p99_us']:.1f} us (min {lat['min_us']:.1f}, max {lat['max_us']:.1f}); one "
        f"control request's round trip: p50 {lat['control_rtt_p50_us']:.1f} us, p99 "
        f"{lat['control_rtt_p99_us']:.1f} us; ceiling: a {lat['size']}-byte asyncio TCP "
        f"round trip between two processes, p50 {lat['ceilings']['tcp_round_trip_p50_us']:.1f}"
        f" us, p99 {lat['ceilings']['tcp_round_trip_p99_us']:.1f} us (latency / TCP round "
        f"trip: p50 {lat['ratio']['p50_to_tcp_round_trip']:.2f}x, p99 "
        f"{lat['ratio']['p99_to_tcp_round_trip']:.2f}x)",
        *_chain_lines(lat),
        f"many QPs: {many['qp_pairs']} connected QP pairs ({many['qps']} QPs) over "
        f"{many['sessions']} control sessions: setup {many['setup_s']:.2f} s; "
        f"{many['completed']}/{many['messages']} {size_text(many['size'])} RDMA_WRITEs "
        f"completed ({'all' if many['all_completed'] else 'NOT ALL'}) in "
        f"{many['seconds']:.2f} s = {many['msg_per_s']:.0f} msg/s, {many['mb_s']:.1f} MB/s",
        f"integrity: {checks}",
        f"wire (goodput and latency runs): {w['packets_sent']} packets sent, "
        f"{w['retransmitted_packets']} retransmitted, {w['ack_timeouts']} ACK timeouts, "
        f"{w['rnr_retries']} RNR retries",
        *ucx_lines(doc),
        *_provider_lines(doc.get("provider")),
        *c_lines(doc),
        f"total {doc['total_seconds']:.1f} s",
    ]
    return "\n".join(out)


def c_lines(doc: dict) -> list[str]:
    """``--c``: C programs on softhca beside kernel TCP between two network namespaces
    (runs without --c have none)."""
    s = doc.get("c_programs")
    if s is None:
        return []
    if "skipped" in s:
        return [f"C programs (--c): skipped: {s['skipped']}"]
    p = s["setup"]["plan"]
    iser = s.get("iser") or {}
    skipped = [f"  iSER: skipped: {iser['skipped']}"] if "skipped" in iser else []
    return ["C programs (--c): qperf, perftest and iSER between two network namespaces "
            "(veth), each side under `softhca run` with its own daemon; ceilings: kernel TCP "
            "between the same namespaces, same qperf (tcp_lat 64 B, tcp_bw 64 KiB); latencies "
            f"one-way (half a round trip); qperf -t {p['qperf_seconds']} s a test, ib_send_lat "
            f"-n {p['send_lat_iterations']}, ib_write_bw -n {p['write_bw_iterations']}, "
            f"iscsicheck {p.get('iser_mib', '?')} MiB; ratio = figure / ceiling",
            *("  " + line for line in table_lines(["figure", "value", "TCP ceiling", "ratio"],
                                                  c_table_rows(s))), *skipped]


def _provider_lines(p: dict | None) -> list[str]:
    """``--provider``: perftest through the libibverbs provider, beside the client."""
    if p is None:
        return []
    if "skipped" in p:
        return [f"provider (perftest through libibverbs): skipped: {p['skipped']}"]
    bw, lat = p["ib_write_bw"], p["ib_send_lat"]
    line = (f"provider (perftest through libibverbs, each side its own daemon): ib_write_bw "
            f"{size_text(bw['size'])} x {bw['iterations']}: {bw['mb_s']:.1f} MB/s")
    if "client_mb_s" in bw:
        line += (f" (client's plain RDMA_WRITE {size_text(bw['size'])}: "
                 f"{bw['client_mb_s']:.1f} MB/s, ratio {bw['to_client']:.3g}; TCP ceiling "
                 f"{bw['tcp_stream_mb_s']:.1f} MB/s, ratio {bw['to_tcp_stream']:.3g})")
    return [line, f"  ib_send_lat {lat['size']} B x {lat['iterations']}: typical "
            f"{lat['typical_us']:.1f} us, average {lat['avg_us']:.1f} us, 99% "
            f"{lat['p99_us']:.1f} us (a SEND's one-way time, half a round trip; the "
            f"client's RDMA_WRITE latency above, a full round trip: p50 "
            f"{lat['client_p50_us']:.1f} us)"]


def _chain_lines(lat: dict) -> list[str]:
    """The latency beside the TCP chain of the same hops, and where its time goes
    (documents saved before these were measured have neither)."""
    c, r = lat.get("ceilings", {}), lat.get("ratio", {})
    if "tcp_chain_p50_us" not in c:
        return []
    out = [f"latency chain ceiling: {lat['size']} bytes along the same hops over asyncio TCP "
           "(client -> initiator process -> target process -> back through the initiator "
           f"-> client), p50 {c['tcp_chain_p50_us']:.1f} us, p99 {c['tcp_chain_p99_us']:.1f} "
           f"us (latency / chain: p50 {r['p50_to_tcp_chain']:.2f}x, p99 "
           f"{r['p99_to_tcp_chain']:.2f}x; goal p50 <= 2x)"]
    b = lat.get("breakdown")
    if b:
        out.append(f"latency breakdown (p50): post_send to its reply {b['post_send_p50_us']:.1f}"
                   f" us, then the pushed completion {b['completion_after_post_p50_us']:.1f} "
                   "us later (no poll request)" + _wakeup_text(b))
    return out


def _wakeup_text(b: dict) -> str:
    w = b.get("wakeups_per_sample")
    if not w:
        return ""
    return (f"; wake-ups per sample {w['total']:.2f} (target {w['target']:.2f}, initiator "
            f"{w['initiator']:.2f}, client {w['client']:.2f}; the TCP chain's: 4)")


