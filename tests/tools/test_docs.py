"""The repository documents itself, and what it says about itself resolves.

- Every ``docs/semantics.md section N`` / ``N.M`` citation in the code, the tests and the
  docs names a section heading ``docs/semantics.md`` has.
- Every ``docs/architecture.md, "<part>"`` citation names one of its headings.
- Every link of ``README.md``, ``docker/README.md`` and ``docs/*.md`` (markdown links,
  their ``#anchors``, backticked repository paths) and every ``docs/<name>.md`` mentioned
  anywhere points to something the repository has.
- Nothing refers to files outside the repository.
- ``docs/api.md`` names every public function, class, method and property of
  ``softhca.client``, and its runnable example runs as printed.

The checkers are plain functions over text, so the second half feeds them small broken
inputs and checks that they report exactly the break.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SEMANTICS = DOCS / "semantics.md"
ARCHITECTURE = DOCS / "architecture.md"
THIS = Path(__file__).resolve()
# Directories that are not the project's own text (virtualenv, caches, build output).
SKIP_DIRS = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__", "build", "dist"}
TOP = ("engine", "protocol", "server", "client", "tools", "tests", "docs", "docker", ".ci")


def project_files(*suffixes: str) -> list[Path]:
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel):
            continue
        if p.is_file() and p.suffix in suffixes and p.resolve() != THIS:
            out.append(p)
    return sorted(out)


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "docker" / "README.md", *sorted(DOCS.glob("*.md"))]


# -- section numbers ------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
# "sections 2, 4, 6 and 7", "6.1", "8, 9", "sections 5-7": numbers joined by commas,
# "and", "or" and dashes (a range); anything else ("section 6, step 2") ends the list.
_LIST = rf"{_NUM}(?:(?:\s*,\s*|\s+and\s+|\s+or\s+|\s*[-\u2013]\s*){_NUM})*"
_CITE = re.compile(rf"docs/semantics\.md(?:\s+sections?)?\s+({_LIST})")
# In the docs themselves the path is often shortened: "semantics section 9", "semantics 8.4".
_CITE_DOCS = re.compile(rf"\bsemantics(?:\.md)?\s+(?:sections?\s+)?({_LIST})")
# Inside semantics.md: "section 5", "sections 6.4 and 7".
_CITE_SELF = re.compile(rf"\bsections?\s+({_LIST})")
_HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def cited_numbers(text: str, pattern: re.Pattern = _CITE) -> list[tuple[int, str]]:
    """(line, section number) for every citation, ranges expanded."""
    out = []
    for m in pattern.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        for part in re.split(r"\s*,\s*|\s+and\s+|\s+or\s+", m.group(1)):
            ends = re.split(r"\s*[-\u2013]\s*", part)
            if len(ends) == 2 and "." not in part:
                out += [(line, str(n)) for n in range(int(ends[0]), int(ends[1]) + 1)]
            else:
                out += [(line, e) for e in ends]
    return out


def section_numbers(markdown: str) -> set[str]:
    return set(_HEADING.findall(markdown))


def missing_sections(files: list[tuple[str, str]], sections: set[str],
                     pattern: re.Pattern = _CITE) -> list[str]:
    """``files`` are (name, text); returns "name:line: section N" for each citation of a
    section ``sections`` lacks."""
    return [f"{name}:{line}: section {n}" for name, text in files
            for line, n in cited_numbers(text, pattern) if n not in sections]


def _read(paths: list[Path]) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in paths]


def test_semantics_has_numbered_sections_1_to_9():
    have = section_numbers(SEMANTICS.read_text())
    assert {str(n) for n in range(1, 10)} <= have


def test_every_semantics_citation_in_the_code_names_an_existing_section():
    sections = section_numbers(SEMANTICS.read_text())
    files = _read(project_files(".py"))
    cited = [n for _, text in files for _, n in cited_numbers(text)]
    assert len(cited) > 30, "the citation pattern no longer finds the code's citations"
    assert missing_sections(files, sections) == []


def test_every_semantics_citation_in_the_docs_names_an_existing_section():
    sections = section_numbers(SEMANTICS.read_text())
    docs = _read([p for p in markdown_files() if p.exists()])
    assert missing_sections(docs, sections) == []
    assert missing_sections(docs, sections, _CITE_DOCS) == []
    assert missing_sections(_read([SEMANTICS]), sections, _CITE_SELF) == []


# -- docs/architecture.md's named parts -------------------------------------------------

_ARCH_CITE = re.compile(r'docs/architecture\.md,\s*"?([A-Za-z][A-Za-z ]*?)"?\)')


def missing_parts(files: list[tuple[str, str]], headings: set[str]) -> list[str]:
    return [f"{name}: {m.group(1)!r}" for name, text in files
            for m in _ARCH_CITE.finditer(text) if m.group(1).lower() not in headings]


def test_architecture_citations_name_its_headings():
    headings = {h.strip().lower() for h in
                re.findall(r"^#{2,4}\s+(.+)$", ARCHITECTURE.read_text(), re.M)}
    files = _read(project_files(".py", ".md"))
    assert sum(len(_ARCH_CITE.findall(t)) for _, t in files) >= 3
    assert missing_parts(files, headings) == []


# -- links ------------------------------------------------------------------------------

_MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_BACKTICKED = re.compile(r"`([^`\s]+)`")
_DOC_MENTION = re.compile(r"\bdocs/[\w.-]+\.md\b")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"^#{1,6}\s+(.+)$", line)
        if m and not in_code:
            a = github_anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def broken_links(path: Path, text: str, root: Path = ROOT) -> list[str]:
    """Every link of a markdown file at ``path`` that does not resolve inside ``root``."""
    bad = []
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for target in _MD_LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue            # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        if root.resolve() not in (dest, *dest.parents):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such path")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{target}: no heading with anchor #{anchor}")
    for token in _BACKTICKED.findall(prose):
        token = token.rstrip(".,:;")
        if token.split("/")[0] in TOP and "/" in token and re.fullmatch(r"[\w./-]+", token):
            if not (root / token).exists():
                bad.append(f"`{token}`: no such path")
    return bad


def test_markdown_links_resolve_inside_the_repository():
    bad = {str(p.relative_to(ROOT)): broken_links(p, p.read_text()) for p in markdown_files()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_mentioned_doc_exists():
    mentioned = {(name, m) for name, text in _read(project_files(".py", ".md"))
                 for m in _DOC_MENTION.findall(text)}
    assert {m for _, m in mentioned} >= {"docs/semantics.md", "docs/architecture.md",
                                          "docs/api.md"}
    assert sorted(f"{name}: {m}" for name, m in mentioned if not (ROOT / m).exists()) == []


def test_nothing_refers_outside_the_repository():
    outside = re.compile(r"\.\.[/]shared|shared[/]design|[/]work[/]")
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
            for name, text in _read(project_files(".py", ".md", ".toml", ".yaml"))
            for m in outside.finditer(text)]
    assert hits == []


# -- docs/api.md covers the client ------------------------------------------------------

def undocumented(module, doc: str) -> list[str]:
    """Public names of ``module`` (its ``__all__`` without the C enum names and enum
    classes) and the public methods and properties of its classes that ``doc`` does not
    mention: a class or function by its name, a method as ``.name(``, a property as
    ``.name`` or `` `name` ``."""
    import enum
    import inspect

    from softhca.protocol.enums import C_NAMES

    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if name in C_NAMES or inspect.isclass(obj) and issubclass(obj, enum.Enum):
            continue
        if not re.search(rf"\b{name}\b", doc):
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, property):
                if not re.search(rf"`{attr}`|\.{attr}\b", doc):
                    missing.append(f"{name}.{attr}")
            elif callable(value) or isinstance(value, (classmethod, staticmethod)):
                if not re.search(rf"\.{attr}\(", doc):
                    missing.append(f"{name}.{attr}()")
    return missing


def test_api_md_names_every_public_function_class_and_method():
    import softhca.client

    assert undocumented(softhca.client, (DOCS / "api.md").read_text()) == []


def test_an_undocumented_method_is_reported():
    import types

    class Thing:
        def shown(self):
            pass

        def hidden(self):
            pass

    module = types.SimpleNamespace(__all__=["Thing"], Thing=Thing)
    assert undocumented(module, "`Thing`: `t.shown()`") == ["Thing.hidden()"]


# -- the api.md example ---------------------------------------------------------------

async def test_api_md_xts_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "api.md").read_text(), re.S)
    example = next(b for b in blocks if "sh.embedded()" in b and "modes.XTS" in b)
    imports = "".join(line + "\n" for line in example.splitlines()
                      if line.startswith(("import ", "from ")))
    body = "\n".join(line for line in example.splitlines()
                     if not line.startswith(("import ", "from ")))
    code = imports + "async def _example():\n" + textwrap.indent(body, "    ")
    namespace: dict = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)  # noqa: S102 - our own docs
    await namespace["_example"]()


# -- the checkers catch what they must ----------------------------------------------------

def test_citation_parser_reads_every_form():
    text = ("see docs/semantics.md section 9 and docs/semantics.md 6.2; "
            "docs/semantics.md sections\n2, 4, 6 and 7; docs/semantics.md sections 5-7; "
            "docs/semantics.md 8, 9; docs/semantics.md section 6, step 2; "
            "docs/semantics.md's rule")
    assert [n for _, n in cited_numbers(text)] == [
        "9", "6.2", "2", "4", "6", "7", "5", "6", "7", "8", "9", "6"]


def test_a_citation_of_a_missing_section_is_reported():
    sections = section_numbers("## 1. One\n\n## 2. Two\n\n### 2.1 Sub\n")
    files = [("x.py", "ok: docs/semantics.md section 2\nbad: docs/semantics.md 2.2\n"
              "bad: docs/semantics.md sections 1 and 3\n")]
    assert missing_sections(files, sections) == ["x.py:2: section 2.2", "x.py:3: section 3"]


def test_a_broken_link_is_reported(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "rc.py").write_text("")
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## 2. Second part\n")
    doc = tmp_path / "docs" / "a.md"
    text = ("# Title\n\n[ok](b.md) [ok](b.md#2-second-part) [ok](../engine/rc.py) `engine/rc.py`\n"
            "[bad](c.md) [bad](b.md#3-third) [bad](../../elsewhere.md) `engine/gone.py`\n"
            "[web](https://example.org) [self](#title)\n")
    doc.write_text(text)
    assert broken_links(doc, text, tmp_path) == [
        "c.md: no such path", "b.md#3-third: no heading with anchor #3-third",
        "../../elsewhere.md: outside the repository", "`engine/gone.py`: no such path"]


def test_github_anchors():
    assert github_anchor("7. Signature errors and mlx5dv_mkey_check") == \
        "7-signature-errors-and-mlx5dv_mkey_check"
    assert github_anchor("2. Reading the demo's output") == "2-reading-the-demos-output"
    assert github_anchor("7. Live: `softhca serve` and `softhca trace`") == \
        "7-live-softhca-serve-and-softhca-trace"
    assert github_anchor("Node: a control session") == "node-a-control-session"


def _layout_rows() -> dict[str, str]:
    """README's layout table: folder -> the text of its row."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout"):readme.index("Beside them:")]
    return {m.group(1): m.group(2)
            for m in re.finditer(r"^\| `(\w+)/` \| `softhca\.\1` \| (.*) \|$", table, re.M)}


def test_the_readme_layout_table_matches_the_tree():
    """Each of the five code folders has its row, which names every module in it (and
    every subpackage), and every `x.py` a row names exists in that folder."""
    rows = _layout_rows()
    assert sorted(rows) == sorted(["protocol", "engine", "server", "client", "tools"])
    for folder, text in rows.items():
        here = {p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
        here |= {p.name + "/" for p in (ROOT / folder).iterdir()
                 if p.is_dir() and (p / "__init__.py").exists() or
                 p.is_dir() and any(p.glob("*/__init__.py"))}
        named = set(re.findall(r"`([\w/]+\.py|\w+/)`", text))
        assert here - named == set(), f"{folder}/: not in README's layout table"
        assert named - here == set(), f"{folder}/: named in README but not in the tree"


# -- docs/architecture.md names the whole house ---------------------------------------------
# Each folder of code has a row in one of its tables (``| `folder/` | ... |``), and the row
# names, by its path inside that folder, every module (``x.py``, ``__init__.py`` aside), C
# source and header (``x.c``, ``x.h``) and subfolder of code (``sub/``) the folder holds;
# every top-level folder and every folder of tests/ is named somewhere on the page. And
# each "`x.py` imports ..." line of its server section is what the code imports.

CODE_ROOTS = ("protocol", "engine", "server", "client", "tools", "softhca", "accel", "provider")
CODE_SUFFIXES = (".py", ".c", ".h")


def _tracked(root: Path) -> list[Path]:
    import subprocess

    done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                          capture_output=True, text=True)
    if done.returncode != 0:        # not a checkout: every file
        return [p.relative_to(root) for p in root.rglob("*") if p.is_file()]
    return [Path(line) for line in done.stdout.splitlines() if (root / line).is_file()]


def code_folders(root: Path) -> dict[str, tuple[set[str], set[str]]]:
    """Each folder of code (under CODE_ROOTS) -> (its code files, its subfolders of
    code), by name inside it."""
    files = [p for p in _tracked(root) if p.parts[0] in CODE_ROOTS
             and p.suffix in CODE_SUFFIXES and "build" not in p.parts]
    folders: dict[str, tuple[set[str], set[str]]] = {}
    for p in files:
        parent = p.parent
        folders.setdefault(parent.as_posix(), (set(), set()))[0].add(p.name)
        while len(parent.parts) > 1:
            folders.setdefault(parent.parent.as_posix(), (set(), set()))[1].add(
                parent.name + "/")
            parent = parent.parent
    for own, _ in folders.values():
        own.discard("__init__.py")
    return folders


def folder_rows(markdown: str) -> dict[str, str]:
    """Every table row whose first cell is a backticked folder: folder -> the row."""
    return {m.group(1): m.group(0)
            for m in re.finditer(r"^\| `([\w./-]+)/` \|.*$", markdown, re.M)}


def unnamed_in_architecture(markdown: str, root: Path) -> list[str]:
    rows = folder_rows(markdown)
    out = []
    for folder, (files, subs) in sorted(code_folders(root).items()):
        row = rows.get(folder)
        if row is None:
            out.append(f"{folder}/: no row")
            continue
        named = set(re.findall(r"`([\w.-]+/?)`", row))
        out += [f"{folder}/{name}: not in its row" for name in sorted((files | subs) - named)]
    tops = {p.parts[0] for p in _tracked(root) if len(p.parts) > 1}
    tests = {"/".join(p.parts[:2]) for p in _tracked(root)
             if p.parts[0] == "tests" and len(p.parts) > 2}
    out += [f"{d}/: not named" for d in sorted(tops | tests) if f"`{d}/`" not in markdown]
    return out


def test_architecture_names_every_module_folder_and_c_file():
    assert unnamed_in_architecture(ARCHITECTURE.read_text(), ROOT) == []


def server_imports(root: Path) -> dict[str, set[str]]:
    """server/x.py -> the server modules it imports (relative imports, anywhere)."""
    import ast

    out = {}
    for path in (root / "server").glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                found.update(f"{n.split('.')[0]}.py" for n in names)
        out[path.name] = found
    return out


_IMPORTS_LINE = re.compile(r"^- `(\w+\.py)` imports (.*);?$", re.M)


def false_import_statements(markdown: str, imports: dict[str, set[str]]) -> list[str]:
    out = []
    for m in _IMPORTS_LINE.finditer(markdown):
        said = set(re.findall(r"`(\w+\.py)`", m.group(2)))
        real = imports.get(m.group(1), set())
        if said != real:
            out.append(f"{m.group(1)}: says {sorted(said)}, imports {sorted(real)}")
    return out


def test_architecture_import_statements_are_the_codes():
    text = ARCHITECTURE.read_text()
    assert len(_IMPORTS_LINE.findall(text)) >= 6
    assert false_import_statements(text, server_imports(ROOT)) == []
    # "serve.py alone imports daemon.py in server/; above it, ... import it too."
    importers = sorted(f"server/{m}" for m, deps in server_imports(ROOT).items()
                       if "daemon.py" in deps)
    above = sorted(str(p.relative_to(ROOT)) for floor in ("client", "tools")
                   for p in (ROOT / floor).rglob("*.py")
                   if re.search(r"from \.+server\.daemon import|from \.+server import daemon",
                                p.read_text()))
    line = next(line for line in text.splitlines() if "alone imports `daemon.py`" in line)
    assert importers == ["server/serve.py"], importers
    assert sorted(re.findall(r"`((?:client|tools)/[\w/]+\.py)`", line)) == above


def test_the_architecture_checkers_report_each_gap(tmp_path):
    for rel in ("server/a.py", "server/b.py", "provider/x.c", "provider/sub/y.h", "docs/z.md",
                "tests/unit/test_q.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("from . import b\n" if rel == "server/a.py" else "")
    page = ("| `server/` | `a.py` |\n| `provider/` | `x.c`, `sub/` |\n"
            "`docs/` and `tests/`\n- `a.py` imports `b.py` and `c.py`;\n")
    assert unnamed_in_architecture(page, tmp_path) == [
        "provider/sub/: no row", "server/b.py: not in its row", "tests/unit/: not named"]
    assert false_import_statements(page, server_imports(tmp_path)) == [
        "a.py: says ['b.py', 'c.py'], imports ['b.py']"]


# -- no issue numbers -----------------------------------------------------------------------
# The repository names features, never the numbers of the issues that asked for them: a
# number means nothing to a reader without the tracker. A reference is "issue" (or
# "issues", any case) then a number, joined by spaces, a line break, '#', '-' or '_', and
# not followed by a word ("the HCA may issue 16 RDMA READs" is the verb), "item", "and"
# and "or" aside ("issue N, item M", "issues N and M"); "GH-N"; a bare "(#N)". A "#1" or a
# "#3-anchor" alone is a count or a heading's anchor, not a reference.

ISSUE_REF = re.compile(
    r"(?i)(?<![a-z])issues?(?:[#_-]|\s)*#?\d+(?!\d)(?!\s+(?!(?:item|and|or)\b)[a-z])"
    r"|(?<![a-z])gh-\d+|\(#\d+\)")


def issue_references(text: str) -> list[tuple[int, str]]:
    """(line, the reference) for each issue number ``text`` names."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()))
            for m in ISSUE_REF.finditer(text)]


def test_no_tracked_file_names_an_issue_number():
    found = []
    for rel in _tracked(ROOT):
        if any(part in SKIP_DIRS for part in rel.parts):
            continue
        try:
            text = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue        # a binary file
        found += [f"{rel}:{line}: {ref}" for line, ref in issue_references(text)]
    assert not found, "name the feature instead:\n" + "\n".join(found)


def test_the_issue_number_checker_reports_each_form():
    # written in pieces, so that this file itself names none
    word = "iss" + "ue"
    refs = [f"Hardening ({word} 5): bad input", f"({word} 25, item 3)", f"{word}-28",
            f"{word}_26s_goals", f"{word.upper()} #7", f"the goals of {word}\n  26, one row",
            f"{word}s 13 and 26", "fixed (" + "#" + "41)", "G" + "H-12"]
    for text in refs:
        assert len(issue_references(text)) == 1, text
    assert issue_references(f"a\nb {word} 4.\n")[0][0] == 2
    fine = [f"the HCA may {word} 16 RDMA READs at once", f"{word}s 2 requests",
            "partial-block transfer #1 on this MKEY", "[10](#10-choices-where)",
            f"{word} of the week", "RFC 791", f"{word}d 3 times"]
    for text in fine:
        assert issue_references(text) == [], text
