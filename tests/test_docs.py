"""The README and docs/ stay consistent with the code and with each other.

- the configuration reference in docs/configuration.md is the one generated from the schema;
- every relative link in README.md and docs/*.md points to a file (and heading) that exists;
- every source path (`sim/...`, `policies/...`) and `tests/test_*.py` file the docs name exists;
- the README stays a front door (at most 220 lines);
- `.ci/run` runs exactly the README's test command, which lints, type-checks and tests;
- nothing cites a design document that is not part of the repository.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKDOWN = [REPO / "README.md", *DOCS]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SOURCE_PATH = re.compile(r"(?<![\w./])((?:sim|policies)/[\w./-]*\w|test_\w+\.py)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def load_generator():
    """Import docs/gen_config_reference.py (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_config_reference",
                                                  REPO / "docs" / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strip_code(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_generated_config_reference_is_up_to_date():
    gen = load_generator()
    text = gen.TARGET.read_text(encoding="utf-8")
    assert gen.current(text) == gen.render(), (
        f"docs/configuration.md is out of date with the schema; run: {gen.COMMAND}")


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path):
    broken = []
    for target in LINK.findall(strip_code(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    assert not broken, f"{path.relative_to(REPO)}: broken links: {broken}"


def test_named_source_files_exist():
    missing = []
    for path in MARKDOWN:
        for name in SOURCE_PATH.findall(path.read_text(encoding="utf-8")):
            dest = REPO / "tests" / name if name.startswith("test_") else REPO / name
            if "__pycache__" not in name and not dest.exists():
                missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing, f"paths named in the docs that do not exist: {missing}"


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 220, f"README.md has {lines} lines; move detail into docs/ (limit 220)"


def _readme_test_command() -> str:
    """The command in the fenced block that follows the README's "Run the tests" line."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text[text.index("Run the tests"):]
    block = re.search(r"```bash\n(.*?)\n```", after, re.S)
    assert block, "README.md: no bash block after 'Run the tests'"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    command = _readme_test_command()
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in (line.strip() for line in ci), (
        f".ci/run does not run the README's test command {command!r}")
    for step in ("ruff check", "mypy", "pytest"):
        assert f"python -m {step}" in command, f"the test command does not run {step}"


def test_no_reference_to_a_design_document():
    banned = ("DESIGN" + ".md", "DESIGN" + " section")
    suffixes = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".json", ".rst"}
    files = [REPO / "README.md"]
    for folder in ("sim", "policies", "docs"):
        files += [p for p in (REPO / folder).rglob("*")
                  if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts]
    hits = [f"{p.relative_to(REPO)}: {word}" for p in files
            for word in banned if word in p.read_text(encoding="utf-8", errors="replace")]
    assert not hits, f"references to a design document outside the repository: {hits}"
