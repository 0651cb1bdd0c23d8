"""No Markdown page cites a file that does not exist.

Pages: ``README.md`` and every ``docs/**/*.md`` (the history and the raw runs' reports
under ``docs/results/`` included). What counts as a citation, and how it resolves:

1. **Links and images** ``[text](target)``, ``![alt](target)``: every target that is not
   a URL (``scheme://``, ``mailto:``) or a bare ``#anchor``; its ``#fragment`` and a
   ``"title"`` are dropped and it resolves against the page's folder. It must exist
   (a file or a folder).
2. **Inline code** (single backticks), split on whitespace (a span may hold a command).
   A token is a path when it contains ``/`` and is one of:

   a. a repository path: its first component is a top folder (``src/``, ``tests/``,
      ``docs/``, ``csrc/``, ``scripts/``, ``benchmarks/``, ``tools/``, ``.ci/``) and it
      ends in a file extension or in ``/`` (written as a folder);
   b. a source file (``.py``, ``.pyi``, ``.cpp``, ``.h``, ``.inc``, ``.cu``) anywhere:
      pages cite package paths as ``runtime/qlinear.py`` or ``engine/engine.py:
      Engine.step``;
   c. a data file (``.md``, ``.json``, ``.png``, ...) or a folder ending in ``/`` whose
      first component is a folder next to the page or under ``docs/`` (raw runs cited
      relative to the page, as ``scale/.../scale.md``).

   (a) resolves against the repository root; (b) and (c) against the root,
   ``src/recallspec/``, ``src/``, ``csrc/``, the page's folder and ``docs/``; the first
   that exists wins. Before that a token loses wrapping punctuation, a trailing ``:``
   (the ``file.py: Symbol`` form), a ``:line`` or ``::test`` suffix and a ``#fragment``.
   Braces expand (``{md,json}``) and globs (``*``) must match at least one path.
3. **Fenced code blocks**: only rule (a) with a file extension (a script a command runs).

Not citations (never checked): tokens without ``/`` (``scale.json``, ``report.md``: file
names a command writes), a repository path with neither an extension nor a trailing
``/`` (``docs/conformance``: as in ``--out docs/conformance``), the token after an output
option (``--out``, ``-o``, ``--out-dir``, ``--output``: created at run time), paths under
what ``make`` and the benchmarks create (``.venv/``, ``build/``, ``bench_out/``), tokens with a
placeholder (``<shape>``, ``$VAR``, ``OUT``-style ``...``, ``|``), URLs, absolute and
home paths, paths that leave the repository, and anything in plain text. So a page that
names a file which no longer exists writes it as plain text ("the former
scripts/exp_paired_prefill.py (removed)"), without backticks or a link: that is how
``docs/history/`` keeps its record of removed files.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("src", "tests", "docs", "csrc", "scripts", "benchmarks", "tools", ".ci")
SOURCE_EXTS = (".py", ".pyi", ".cpp", ".h", ".inc", ".cu")
DATA_EXTS = (".md", ".json", ".jsonl", ".png", ".txt", ".log", ".sh", ".csv", ".gz",
             ".toml", ".yaml", ".yml", ".svg", ".html")
OUTPUT_OPTIONS = ("--out", "-o", "--out-dir", "--output")
RESOLVE_ROOTS = ("", "src/recallspec", "src", "csrc")
IGNORED_ROOTS = (".venv", ".venv-vllm", "build", "bench_out")  # made by make / the benches

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
PLACEHOLDER = re.compile(r"[<>$|]|\.\.\.|…")
EXT = re.compile(r"\.[A-Za-z0-9]+$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def split_fences(text: str) -> tuple[str, str]:
    """(the text outside fenced code blocks, the text inside them); lines keep their place."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            prose.append("")
            code.append("")
            continue
        (code if fenced else prose).append(line)
        (prose if fenced else code).append("")
    return "\n".join(prose), "\n".join(code)


def expand_braces(token: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    head, tail = token[: m.start()], token[m.end():]
    return [x for alt in m.group(1).split(",") for x in expand_braces(head + alt + tail)]


def exists(path: Path) -> bool:
    try:
        path.resolve().relative_to(ROOT)
    except ValueError:
        return True  # outside the repository: not ours to check
    if any(c in str(path) for c in "*?["):
        return bool(glob.glob(str(path)))
    return path.exists()


def clean(token: str) -> str:
    token = token.strip("()[],;\"'").rstrip(".")
    token = re.sub(r"::.*$", "", token)
    token = re.sub(r":\d*$", "", token)
    return token.split("#", 1)[0]


def kind(token: str, page_dir: Path, fenced: bool) -> str | None:
    """'repo', 'source', 'data' (rules a, b, c) or None: not a path citation."""
    if "/" not in token or "://" in token or PLACEHOLDER.search(token):
        return None
    if token.startswith(("/", "~")) or token.split("/", 1)[0] in IGNORED_ROOTS:
        return None
    probe = expand_braces(token)[0]  # judged by its first alternative
    first = probe.split("/", 1)[0]
    last = probe.rstrip("/").rsplit("/", 1)[-1]
    folder = probe.endswith("/")
    has_ext = not folder and (bool(EXT.search(last)) or "*" in last)
    if first in TOP_FOLDERS:
        return "repo" if has_ext or (folder and not fenced) else None
    if fenced:
        return None
    package = any((ROOT / r / first).is_dir() for r in ("src/recallspec", "csrc"))
    if probe.endswith(SOURCE_EXTS) or (folder and package):
        return "source"
    if not (folder or probe.endswith(DATA_EXTS) or (has_ext and "*" in last)):
        return None
    if first in ("", ".", ".."):
        return "data"
    if (page_dir / first).is_dir() or (ROOT / "docs" / first).is_dir():
        return "data"
    return None


def resolves(token: str, how: str, page_dir: Path) -> bool:
    for alt in expand_braces(token):
        bases = [ROOT] if how == "repo" else [
            *(ROOT / r for r in RESOLVE_ROOTS), page_dir, ROOT / "docs"]
        if not any(exists(base / alt) for base in bases):
            return False
    return True


def code_tokens(text: str) -> list[str]:
    """Whitespace tokens of a code text, leaving out the one after an output option."""
    out, skip = [], False
    for raw in text.split():
        if skip:
            skip = False
            continue
        if raw in OUTPUT_OPTIONS:
            skip = True
            continue
        if raw.startswith(tuple(o + "=" for o in OUTPUT_OPTIONS)):
            continue
        out.append(raw)
    return out


def missing_citations(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    prose, code = split_fences(text)
    page_dir = page.parent
    bad: list[str] = []
    # Inline code first, then blanked, so that a link inside a code span is not a link.
    without_code = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose)
    for m in LINK.finditer(without_code):
        target = m.group(1)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        target = target.split("#", 1)[0]
        if target and not exists(page_dir / target):
            bad.append(f"link ({target})")
    spans = [(m.group(2), False) for m in INLINE_CODE.finditer(prose)]
    for body, fenced in [*spans, (code, True)]:
        for raw in code_tokens(body):
            token = clean(raw)
            how = kind(token, page_dir, fenced)
            if how and not resolves(token, how, page_dir):
                bad.append(f"`{token}`")
    return bad


def test_every_cited_file_exists() -> None:
    report = []
    for page in pages():
        bad = missing_citations(page)
        if bad:
            rel = page.relative_to(ROOT)
            report.append(f"{rel}: " + ", ".join(dict.fromkeys(bad)))
    assert not report, "cited files that do not exist:\n" + "\n".join(report)


def test_the_checker_tells_paths_from_other_code() -> None:
    here = ROOT / "docs"
    assert kind("src/recallspec/policy.py", here, False) == "repo"
    assert kind("engine/engine.py", here, False) == "source"
    assert kind("docs/conformance", here, False) is None  # an output directory
    assert kind("docs/results/", here, False) == "repo"
    assert kind("recallspec.bench.suite.padded_layouts", here, False) is None
    assert kind("/v1/chat/completions", here, False) is None
    assert kind("tests/<package>/", here, False) is None
    assert kind("bench_out/vllm/report.md", here, False) is None
    assert kind(".venv/peers/llama.cpp", here, False) is None
    assert kind("docs/native/runtime.*", here, False) == "repo"
    assert kind("docs/batch/exp_batch_draft_model.{md,png}", here, False) == "repo"
    assert clean("engine/engine.py:") == "engine/engine.py"
    assert clean("tests/cli/test_cli.py::test_x") == "tests/cli/test_cli.py"
    assert code_tokens("recallspec conformance --out docs/conformance") == [
        "recallspec", "conformance"]
    assert expand_braces("a/{b,c}.md") == ["a/b.md", "a/c.md"]
    assert resolves("docs/{ARCHITECTURE,BENCHMARKS}.md", "repo", here)
