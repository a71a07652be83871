"""Every code block of the README and every command of docs/*.md runs as printed, or is
listed here with the reason it cannot run in this test.

A command is one logical line of a ``sh`` block (continuation lines joined, its trailing
comment kept: bash reads it as the reader would). Each one is in exactly one of:

- ``RUN``: run here with bash, as written, from a scratch directory that holds links to
  the repository's ``examples/``, ``docs/`` and ``.venv/`` (``make`` ones from the
  repository), ``softhca`` and ``python`` being the venv's; it must exit 0;
- ``TUTORIAL_SESSION``: docs/tutorial.md sections 7 to 9, two daemons and what the
  reader runs against them, run as one bash session (``test_the_tutorials_daemon_session``)
  with the daemons on free ports instead of 4791 and 4792;
- ``ELSEWHERE``: run by another test, which is named (and must exist);
- ``CANNOT``: cannot run here, with the reason.

A block or command added to the docs fails ``test_every_command_is_accounted_for`` until
it is put in one of them. The README's other blocks: its Python blocks run (or are run
elsewhere, named), its ini block is the scratch project's (tests/tools/test_scratch_project.py).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_SUITE = "the whole suite, which this test is part of"
_FULL_BENCH = ("a full bench run, about 50 s on two cores (docs/performance.md); "
               "`softhca bench --quick` below runs the same code, and "
               "tests/tools/test_bench.py the --compare and --json paths")
_UPSTREAM = "tests/pyverbs/test_upstream_pyverbs.py (rdma-core's tests from Debian's package)"
_NATIVE = "root and Debian's verbs programs in network namespaces: tests/native runs them"
_PLACEHOLDER = ("HOST:PORT stands for the reader's daemon; the tutorial's session below "
                "runs the same command against real ones")

_ONE_MACHINE = ("tests/native/test_one_machine.py (two softhca runs on one machine, as root, "
                "in a network namespace with only lo)")

PEER_TOKEN = "(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > peer-token)"

RUN = {
    "make demo": "20 examples: 20 PASS, 0 FAIL",
    "python -m softhca --version": "softhca ",
    PEER_TOKEN: "",
    "softhca explain --row C": "",
    "softhca demo --html report.html": "20 examples: 20 PASS, 0 FAIL",
    "softhca demo faults": "PASS",
    "softhca explain --wire t10dif:block=4096,bg=0xffff,app=0x5a5a,ref=0x1000,"
    "flags=ref_remap --check-mask 0xff": "",
    'softhca demo --only "sig_block 1"': "1 example: 1 PASS, 0 FAIL",
    "softhca explain --mem crc32:block=512,seed=0xffffffff --check-mask crc32": "",
    'softhca demo --only "sig_block 1.1"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "sig_block 2"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "sig_block 2.1"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "crypto 1"': "1 example: 1 PASS, 0 FAIL",
    "softhca explain --row F": "",
    'softhca demo --only "crypto 1.1"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "crypto 2"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "crypto 2.1"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "mkey_configure list"': "1 example: 1 PASS, 0 FAIL",
    'softhca demo --only "mkey_configure interleaved"': "1 example: 1 PASS, 0 FAIL",
    "softhca demo faults --list": "guard",
    "softhca demo faults --only guard": "PASS",
    "softhca demo faults --html faults.html": "PASS",
    ".venv/bin/softhca bench --quick": "goodput",
    ".venv/bin/softhca bench engine --json-out new-engine.json --compare "
    "docs/performance-engine.json": "engine/primitive",
    ".venv/bin/softhca bench --help": "usage: softhca bench",
    "make accel                          # the native engine alone (make test and make bench "
    "build it)": "",
    "SOFTHCA_ENGINE=python .venv/bin/softhca bench engine --mib 0.25 --repeat 1": "engine: python",
    ".venv/bin/softhca bench goals docs/performance.json docs/performance-engine.json":
        "64-byte RDMA_WRITE p50 / TCP chain",
}

TUTORIAL_SESSION = {
    "softhca serve --listen 127.0.0.1:4791 --peer-token-file peer-token &",
    "softhca serve --listen 127.0.0.1:4792 --peer-token-file peer-token &",
    "softhca trace --target 127.0.0.1:4791 --no-color --seconds 6 &",
    "python examples/two_process.py --target 127.0.0.1:4791 --initiator 127.0.0.1:4792",
    "softhca faults add --daemon-wide action=corrupt opcode=RDMA_WRITE block=2 "
    "block_size=4104 field=guard xor=0x1 count=1 --target 127.0.0.1:4792",
    "softhca faults list --target 127.0.0.1:4792",
    "softhca faults clear --target 127.0.0.1:4792",
    "softhca capture --target 127.0.0.1:4792 --out write.pcap --seconds 6 &",
    "tshark -r write.pcap",
    "tshark -r write.pcap -T fields -e frame.number -e infiniband.bth.opcode -e "
    "infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.reth.dmalen",
}

ELSEWHERE = {
    "make test": "tests/ (" + _SUITE + ")",
    "make test-unit": "tests/unit (" + _SUITE + ")",
    "pip install /path/to/softhca": "tests/tools/test_scratch_project.py (the checkout's wheel "
                                    "into a fresh venv; /path/to/softhca is the checkout)",
    "pip wheel --no-deps -w dist /path/to/softhca": "tests/tools/test_scratch_project.py",
    "pip install dist/softhca-*.whl": "tests/tools/test_scratch_project.py",
    "mkdir -p /tmp/pv && cd /tmp/pv && apt-get download python3-pyverbs && dpkg -x "
    "python3-pyverbs_*.deb x": "tests/pyverbs/test_upstream_pyverbs.py (downloads Debian's "
                               "python3-pyverbs and runs rdma-core's tests on softhca)",
    "cd x/usr/share/doc/rdma-core/tests && gunzip -f *.gz": _UPSTREAM,
    "export PYTHONPATH=$(softhca pyverbs path)": _UPSTREAM,
    "python run_tests.py -v test_mlx5_mkey              # the MKEY tests": _UPSTREAM,
    "softhca crypto-test-info --out /tmp/pv/crypto.json  # credential, keys and ciphertexts":
        _UPSTREAM,
    "SOFTHCA_CRYPTO_CONFIG='{\"mode\": \"wrapped\"}' MLX5_CRYPTO_TEST_INFO=/tmp/pv/crypto.json"
    "   python run_tests.py -v test_mlx5_crypto          # wrapped DEK import": _UPSTREAM,
    "SOFTHCA_CRYPTO_CONFIG='{\"mode\": \"plaintext\"}' MLX5_CRYPTO_TEST_INFO=/tmp/pv/crypto"
    ".json   python run_tests.py -v test_mlx5_crypto          # plaintext DEKs": _UPSTREAM,
    "python run_tests.py                                # every module": _UPSTREAM,
    "python /tmp/pv/x/usr/share/doc/python3-pyverbs/examples/ib_devices.py": _UPSTREAM,
    "(cd ~/.cache/softhca-upstream/v55/tests && PYTHONPATH=$(\"$OLDPWD\"/.venv/bin/softhca "
    "pyverbs path)   \"$OLDPWD\"/.venv/"
    "bin/softhca run -- \"$OLDPWD\"/.venv/bin/python run_tests.py -v test_rdmacm)":
        "tests/pyverbs/test_upstream_rdmacm.py (the same run_tests.py -v test_rdmacm inside "
        "softhca run, for v44, v55 and v59)",
    "make images": "tests/containers/test_compose.py",
    "docker-compose -p softhca-twonode -f docker/compose.yaml up --exit-code-from initiator":
        "tests/containers/test_compose.py",
    "docker-compose -p softhca-twonode -f docker/compose.yaml down -v":
        "tests/containers/test_compose.py",
    ".venv/bin/softhca run -- ibv_devinfo -v": "tests/native/test_verbs_programs.py",
    ".venv/bin/softhca run --peer-token-file peer-token --listen 127.0.0.1:0 -- "
    "ibv_rc_pingpong -g 0 &": _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token --listen 127.0.0.1:0 -- "
    "ibv_rc_pingpong -g 0 127.0.0.1": _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token --listen 127.0.0.1:0 -- "
    "rping -s -v -C 3 &": _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token --listen 127.0.0.1:0 -- "
    "rping -c -v -C 3 -a 127.0.0.1": _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token -- ibv_rc_pingpong -g 0 &":
        _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token -- ibv_rc_pingpong -g 0 127.0.0.1":
        _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token -- rping -s -v -C 3 &": _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token -- rping -c -v -C 3 -a 127.0.0.1":
        _ONE_MACHINE,
    ".venv/bin/softhca run --peer-token-file peer-token -- ib_write_bw   "
    "# and on the other side:": "tests/native/test_perftest.py",
    ".venv/bin/softhca run --peer-token-file peer-token -- ib_write_bw 127.0.0.1":
        "tests/native/test_perftest.py",
    "make provider                       # the provider, softhca's libmlx5 and examples/c":
        "tests/ (`make test` builds the provider first; " + _SUITE + ")",
    ".venv/bin/softhca run --peer-token-file peer-token --trace trace.txt --     "
    "examples/c/build/sig_block_2 -p 18515 &": "tests/native/test_c_examples.py",
    ".venv/bin/softhca run --peer-token-file peer-token --     examples/c/build/sig_block_2 "
    "-p 18515 127.0.0.1": "tests/native/test_c_examples.py",
    "cat trace.txt                       # the target daemon's stages: the T10-DIF it "
    "generated": "tests/native/test_c_examples.py (test_trace_shows_a_c_programs_blocks)",
    ".venv/bin/softhca bench --c --json-out c.json":
        "tests/native/test_bench_c_section.py (the --c section, quick; the rest of the bench is "
        "tests/tools/test_bench.py's --quick run)",
}

CANNOT = {
    "softhca serve --listen 0.0.0.0:4791 --hca mlx5_0 --token-file /etc/softhca/token":
        "a daemon in the foreground on every address's port 4791 with a token in /etc; "
        "tests/tools/test_serve.py starts it with a token file on a free port",
    "PYTHONPATH=$(softhca pyverbs path) python my_script.py       # embedded daemon, mlx5_0":
        "my_script.py is the reader's program; tests/pyverbs runs pyverbs code both ways",
    "SOFTHCA_TARGET=10.200.0.1:4791 SOFTHCA_TOKEN_FILE=token   PYTHONPATH=$(softhca pyverbs "
    "path) python my_script.py     # a running softhca serve":
        "10.200.0.1 is the compose target (tests/containers/test_compose.py)",
    ".venv/bin/softhca serve --listen 10.200.0.1:4791 --unix /run/softhca.sock &":
        "10.200.0.1 is another host's address; " + _NATIVE,
    ".venv/bin/softhca run --target /run/softhca.sock -- ./my_verbs_program":
        "./my_verbs_program is the reader's program; " + _NATIVE,
    "softhca trace --target HOST:PORT        # live: every pipeline stage of every transfer, "
    "blocks colored by field": _PLACEHOLDER,
    "softhca capture --target HOST:PORT --out wire.pcap   # RoCEv2 frames Wireshark/tshark "
    "decode": _PLACEHOLDER,
    "softhca serve --capture wire.pcap ...   # the same, written by the daemon itself":
        "'...' stands for the daemon's other options (tests/tools/test_capture.py)",
    "softhca faults add --daemon-wide --target HOST:PORT action=corrupt opcode=RDMA_WRITE "
    "block=3     block_size=520 field=guard xor=0x1                # icrc=stale makes it a "
    "link error instead": _PLACEHOLDER,
    "softhca faults list --target HOST:PORT                # rules with how often they "
    "fired, and counters": _PLACEHOLDER,
    "softhca serve --faults rules.json ...                 # rules from the start":
        "rules.json and '...' are the reader's (tests/tools/test_serve.py)",
    "make bench                          # the table, about 50 s": _FULL_BENCH,
    'make bench BENCH_ARGS="--json"      # the same as a JSON document': _FULL_BENCH,
    "SOFTHCA_ENGINE=python .venv/bin/softhca bench --json-out python.json": _FULL_BENCH,
    ".venv/bin/softhca bench --json-out new.json --compare docs/performance.json": _FULL_BENCH,
    ".venv/bin/softhca bench --compare old.json new.json   # two saved runs, nothing runs":
        "old.json and new.json are two saved runs of the reader's (tests/tools/test_bench.py)",
    ".venv/bin/softhca bench --compare old.json new-1.json new-2.json new-3.json   # each "
    "row's median": "the files are saved runs of the reader's (tests/tools/test_bench.py, "
    "test_compare_reads_several_new_runs_as_each_rows_median)",
    ".venv/bin/softhca bench --no-trains # the daemons without packet trains, to compare":
        _FULL_BENCH,
}


def _logical_lines(block: str) -> list[str]:
    out, cur = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1]
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def _key(command: str) -> str:
    """A command as the tables name it: without a trailing comment, unless the tables
    name it with its comment (where two commands differ only by it)."""
    return command


def sh_commands() -> list[tuple[str, str]]:
    """(file, command) of every command of every sh block of the README and docs/*.md."""
    found = []
    for path in SOURCES:
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.S):
            if lang == "sh":
                found += [(path.relative_to(ROOT).as_posix(), c) for c in _logical_lines(body)]
    return found


def _bare(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command)


def classify(command: str) -> str | None:
    for table in (RUN, TUTORIAL_SESSION, ELSEWHERE, CANNOT):
        if command in table or _bare(command) in table:
            return {id(RUN): "run", id(TUTORIAL_SESSION): "tutorial", id(ELSEWHERE): "elsewhere",
                    id(CANNOT): "cannot"}[id(table)]
    return None


def test_every_command_is_accounted_for():
    missing = [f"{where}: {c}" for where, c in sh_commands() if classify(c) is None]
    assert not missing, "not in RUN, TUTORIAL_SESSION, ELSEWHERE or CANNOT:\n" + "\n".join(
        missing)
    listed = {_bare(c) for _, c in sh_commands()} | {c for _, c in sh_commands()}
    stale = [k for t in (RUN, TUTORIAL_SESSION, ELSEWHERE, CANNOT) for k in t
             if k not in listed]
    assert not stale, f"named here but in no doc: {stale}"


def test_each_test_named_elsewhere_exists():
    for command, where in ELSEWHERE.items():
        path = where.split(" ")[0]
        assert (ROOT / path).exists(), f"{command}: {path} does not exist"


def test_every_reason_says_something():
    for command, reason in CANNOT.items():
        assert len(reason) > 8, command


def _scratch(tmp_path: Path) -> tuple[Path, dict]:
    for name in ("examples", "docs", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1"}
    for k in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE", "PYTHONPATH"):
        env.pop(k, None)
    return tmp_path, env


@pytest.mark.parametrize("command", sorted(RUN))
def test_a_documented_command_runs(command, tmp_path):
    cwd, env = _scratch(tmp_path)
    if command.startswith("make "):
        cwd = ROOT
    r = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{command}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert RUN[command] in r.stdout + r.stderr, r.stdout[-2000:]


def test_the_readmes_python_blocks_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    elsewhere = {"sh.embedded()": "tests/tools/test_readme.py",
                 "softhca_rc_pair": "tests/tools/test_scratch_project.py"}
    ran = 0
    for block in blocks:
        if any(marker in block for marker in elsewhere):
            continue
        script = tmp_path / f"readme_block_{ran}.py"
        script.write_text(block)
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "SOFTHCA_TARGET"})
        assert r.returncode == 0, f"{block}\n{r.stderr}"
        ran += 1
    assert ran == len(blocks) - len(elsewhere)


def test_readme_documentation_table_lists_every_doc():
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Documentation"):text.index("## Layout")]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"[docs/{doc.name}](docs/{doc.name})" in table, doc.name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tutorials_daemon_session(tmp_path):
    """docs/tutorial.md sections 7 to 9 in one bash session, as a reader types them: the
    two daemons (on free ports instead of 4791 and 4792), the trace, the example, the
    fault rule and the capture, then tshark on it when tshark is installed."""
    text = (ROOT / "docs" / "tutorial.md").read_text()
    tutorial = [c for where, c in sh_commands() if where == "docs/tutorial.md"]
    start = tutorial.index(PEER_TOKEN)
    commands = [c for c in tutorial[start:] if c in TUTORIAL_SESSION or c == PEER_TOKEN]
    assert set(commands) == TUTORIAL_SESSION | {PEER_TOKEN}
    script = [c for c in commands if shutil.which("tshark") or not c.startswith("tshark")]
    t, i = _free_port(), _free_port()
    body = "\n".join(script).replace("4791", str(t)).replace("4792", str(i))
    assert "4791" in text and str(t) in body
    cwd, env = _scratch(tmp_path)
    # A reader waits for a daemon (or the trace, the capture) to be up before the next
    # line, and for the capture to end before reading its file: the script waits for
    # each daemon's port to answer (a loaded machine starts Python slowly), two seconds
    # after a trace or capture starts, and for the capture before tshark.
    for port in (t, i):
        up = (f"for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null "
              f"&& break; sleep 0.1; done\n")
        body = body.replace(f"127.0.0.1:{port} --peer-token-file peer-token &\n",
                            f"127.0.0.1:{port} --peer-token-file peer-token &\n{up}", 1)
    body = re.sub(r"&\n(?!for _ in)", "&\nlast=$!\nsleep 2\n", body)
    body = re.sub(r"(--out write\.pcap [^\n]*&\nlast=\$!)", r"\1\ncapture=$last", body)
    body = body.replace("tshark -r write.pcap\n", "wait $capture\ntshark -r write.pcap\n", 1)
    full = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + body + "\n"
    r = subprocess.run(["bash", "-c", full], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    # Sections 7 and 9 pass; section 8's run, with the fault rule, fails the target's
    # mkey_check exactly as the tutorial shows, and the rule fired once.
    assert out.count("all checks passed") == 2, out[-4000:]
    assert out.count("1 check(s) failed") == 1, out[-4000:]
    assert "FAIL  the target's mkey_check after the WRITE: got BAD_GUARD" in out, out[-4000:]
    assert re.search(r"rule 1 +fired 1 ", out), out[-4000:]
    assert "1 rule(s) cleared" in out, out[-4000:]
    assert "packet(s) written to write.pcap" in out, out[-4000:]
    assert "QP 0x" in out and "RDMA_WRITE responder" in out, out[-4000:]    # the trace
    if shutil.which("tshark"):
        assert "RDMA Write First" in out, out[-4000:]
