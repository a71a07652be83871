"""What a new user meets first on the command line: the version, a
mistyped fault rule answered with the values to pick from, a capture of a daemon that
is not there, and an embedded daemon's warnings in the daemon's log format."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import softhca.client as sh

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "softhca.tools.cli"]
# server/serve.py's format: "2026-01-02 03:04:05,678 WARNING softhca.server message k=v".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) "
                      r"softhca\.\S+ \S.* event=\w+")


def cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_version_is_pyprojects():
    want = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(),
                     re.M).group(1)
    r = cli("--version")
    assert (r.returncode, r.stdout) == (0, f"softhca {want}\n"), r.stderr


async def faults_add(address: str, *fields: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "faults", "add", "--daemon-wide", "--target", address, *fields,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, err.decode()


async def test_faults_add_lists_the_valid_values_of_a_wrong_one():
    async with sh.embedded() as node:
        status, err = await faults_add(node.address, "action=corupt", "block=3",
                                       "block_size=520")
        assert status == 1
        assert err.startswith("softhca faults add: EINVAL: "), err
        for action in ("corrupt", "drop", "duplicate", "delay", "reorder", "rnr"):
            assert action in err, err
        assert "action='corupt' is not valid: one of corrupt, drop," in err
        status, err = await faults_add(node.address, "action=corrupt", "block=3",
                                       "block_size=520", "field=gaurd")
        assert status == 1 and "one of data, guard, app_tag, ref_tag" in err, err
        status, err = await faults_add(node.address, "action=drop", "opcode=RDMA_WRTE")
        assert status == 1 and "opcode='RDMA_WRTE' is not valid: one of " in err, err
        assert "RDMA_WRITE" in err and "SEND_ONLY" in err, err
        status, err = await faults_add(node.address, "action=drop", "probability=1.5")
        assert status == 1 and "probability=1.5 is not valid: a number in [0, 1]" in err, err
        # Nothing was installed by the refused rules.
        assert await node.faults.list() == []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_capture_of_a_daemon_that_is_not_there(tmp_path):
    out = tmp_path / "x.pcap"
    r = subprocess.run([*CLI, "capture", "--target", f"127.0.0.1:{free_port()}", "--out",
                        str(out)], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert r.returncode != 0
    assert not out.exists(), "an empty pcap was left behind"
    # The reason comes first (and alone): no "0 packet(s) written" to a file never made.
    assert r.stderr.startswith("softhca capture: "), r.stderr
    assert "cannot connect" in r.stderr.splitlines()[0], r.stderr
    assert r.stdout == "", r.stdout


def refused_hello(tmp_path, prelude: str = "") -> subprocess.CompletedProcess:
    """A program that connects to its embedded daemon with the wrong token: the daemon
    refuses the hello and logs a warning. ``prelude`` runs first (the app's own setup)."""
    script = tmp_path / "refused.py"
    script.write_text(
        "import asyncio, logging, sys\n"
        "import softhca.client as sh\n"
        f"{prelude}\n\n"
        "async def main():\n"
        "    async with sh.embedded(token=b'right') as node:\n"
        "        try:\n"
        "            await sh.connect(node.address, token=b'wrong')\n"
        "        except sh.RDMAError as e:\n"
        "            print(e.errno_name)\n\n\n"
        "asyncio.run(main())\n")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)


def test_embedded_daemon_warnings_follow_the_log_format(tmp_path):
    """A refused hello (wrong token) is logged by the embedded daemon as serve logs it,
    not as Python's bare last-resort ``refused event=refused ...``."""
    r = refused_hello(tmp_path)
    assert r.returncode == 0 and r.stdout == "EACCES\n", (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert lines, "the refusal was not logged"
    for line in lines:
        assert LOG_LINE.match(line), line
    assert any(" WARNING softhca.server refused event=refused " in line for line in lines)


def test_an_application_that_configures_logging_keeps_it(tmp_path):
    """With the application's own logging set up, the daemon adds no handler of its own:
    each warning appears once, in the application's format."""
    r = refused_hello(tmp_path, "logging.basicConfig(stream=sys.stderr, "
                                "format='APP %(levelname)s %(message)s')")
    assert r.returncode == 0 and r.stdout == "EACCES\n", r.stderr
    refused = [line for line in r.stderr.splitlines() if "event=refused" in line]
    assert len(refused) == 1 and refused[0].startswith("APP WARNING refused "), r.stderr


def test_a_wrong_rule_is_named_before_the_daemon_is_reached():
    """The rule is checked on the command line first: with no daemon at the address, and
    without --daemon-wide, the typo is still what is reported, with the valid values."""
    for extra in ((), ("--daemon-wide",)):
        r = cli("faults", "add", "--target", "127.0.0.1:1", *extra, "action=corupt")
        assert r.returncode == 1, r.stderr
        assert r.stderr == ("softhca faults add: EINVAL: fault rule: action='corupt' is not "
                            "valid: one of corrupt, drop, duplicate, delay, reorder, rnr\n")


def test_every_example_of_faults_help_is_a_rule_the_parser_takes():
    """Each ``softhca faults add`` example of the help parses as the command line would
    (the CLI's own parser) and its fields are a rule the daemon's check accepts."""
    import shlex

    from softhca.server.faults import validate_rule
    from softhca.tools.cli import build_parser
    from softhca.tools.commands.faults import FAULTS_EPILOG, parse_rule_fields

    text = FAULTS_EPILOG.replace("\\\n", " ")
    examples = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("softhca faults")]
    assert len(examples) >= 4, examples
    for line in examples:
        argv = shlex.split(line)[1:]
        args, extra = build_parser().parse_known_args(argv)
        fields = list(args.fields) + extra
        assert args.op == "add" and args.daemon_wide and fields, line
        rule = validate_rule(parse_rule_fields(fields))
        assert rule["action"] in ("corrupt", "drop"), line
    # The help names a corrupt rule on a data byte with offset alone: it is one.
    assert any("offset=" in ln and "block=" not in ln for ln in examples)
