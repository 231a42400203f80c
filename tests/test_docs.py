"""The documentation site covers the command line, and its links hold.

The convention (docs/contributing.md, "Documentation"), checked against the real Typer app:
- a command has a heading naming it in a code span on its page: `diffeval report` in docs/cli/report.md; the commands
  of a group (`diffeval run suite`, `diffeval toy train`) on the group's page, docs/cli/<group>.md;
- every option of a command appears as a `--flag` code span in that command's section (its heading down to the next
  heading of the same or a higher level);
- every task has a page docs/tasks/<task>.md in the nav; each option of `diffeval run TASK` appears as `--flag` on it,
  except the options every task shares, which appear in the "Options of every task" section of docs/cli/run.md.
Commands and options added later fail here, by name, until their docs entry exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import typer
import yaml

from diffeval.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHARED_SECTION = "Options of every task"

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
CODE_SPAN = re.compile(r"(`+)\s?(.+?)\s?\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def cli_commands() -> tuple[list[tuple[str, ...]], dict[tuple[str, ...], set[str]]]:
    """The groups (("run",), …) and every leaf command's long flags ({("run", "needle"): {"--ctx", …}, …})."""
    groups, leaves = [], {}

    def walk(command, path: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            leaves[path] = {
                flag
                for param in command.params
                if param.param_type_name == "option"
                for flag in param.opts + param.secondary_opts
                if flag.startswith("--")
            }
            return
        if path:
            groups.append(path)
        for name, sub in subcommands.items():
            walk(sub, path + (name,))

    walk(typer.main.get_command(app), ())
    return groups, leaves


GROUPS, LEAVES = cli_commands()
TASKS = sorted(path[1] for path in LEAVES if path[0] == "run" and path[1] != "suite")


def prose(page: Path) -> str:
    """A page's Markdown without fenced code blocks (a `#` or a backtick inside one is no heading and no span)."""
    return FENCE.sub("", page.read_text())


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, text under it down to the next heading of the same or a higher level) for every heading."""
    found = [(m.start(), len(m.group(1)), m.group(2)) for m in HEADING.finditer(text)]
    result = []
    for i, (start, level, heading) in enumerate(found):
        end = next((s for s, lv, _ in found[i + 1 :] if lv <= level), len(text))
        result.append((heading, text[start:end]))
    return result


def documented_flags(text: str) -> set[str]:
    """Flags that open a code span: `--ctx`, `--model/-m NAME=SPEC`, `--chat-template/--no-chat-template`."""
    flags = set()
    for _, span in CODE_SPAN.findall(text):
        first = span.split()[0] if span.strip() else ""
        if first.startswith("--"):
            flags.update(part for part in re.split(r"[/=\[]", first) if part.startswith("--"))
    return flags


def command_section(page: Path, command: str) -> str | None:
    """The section whose heading names `command` in a code span, or None."""
    for heading, body in sections(prose(page)):
        if command in (span for _, span in CODE_SPAN.findall(heading)):
            return body
    return None


def slug(heading: str) -> str:
    """Python-Markdown's toc anchor for a heading (GitHub's agrees for plain words)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(m.group(2)) for m in HEADING.finditer(prose(page))}


def nav_pages() -> set[str]:
    def flatten(item) -> list[str]:
        if isinstance(item, str):
            return [item]
        if isinstance(item, dict):
            return [page for value in item.values() for page in flatten(value)]
        return [page for value in item for page in flatten(value)]

    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    return set(flatten(config["nav"]))


def test_every_command_has_a_heading_on_its_page():
    missing = []
    for group in GROUPS:
        if not (DOCS / "cli" / f"{group[0]}.md").is_file():
            missing.append(f"docs/cli/{group[0]}.md (the page of `diffeval {' '.join(group)}`)")
    for path in LEAVES:
        page = DOCS / "cli" / f"{path[0]}.md"
        command = "diffeval " + " ".join(path)
        if not page.is_file() or command_section(page, command) is None:
            missing.append(f"a heading naming `{command}` in docs/cli/{path[0]}.md")
    assert not missing, "commands without a docs entry:\n  " + "\n  ".join(missing)


def test_every_option_of_every_command_is_documented_under_it():
    missing = []
    for path, flags in LEAVES.items():
        if path[0] == "run" and path[1] != "suite":
            continue  # the task commands: next test
        page = DOCS / "cli" / f"{path[0]}.md"
        command = "diffeval " + " ".join(path)
        section = command_section(page, command) if page.is_file() else None
        undocumented = sorted(flags - documented_flags(section or ""))
        if undocumented:
            missing.append(f"`{command}` in docs/cli/{path[0]}.md: {', '.join(undocumented)}")
    assert not missing, "options without a docs entry (a `--flag` code span under the command's heading):\n  " + (
        "\n  ".join(missing)
    )


def test_every_task_has_a_page_in_the_nav_with_every_option():
    task_flags = {task: LEAVES[("run", task)] for task in TASKS}
    shared = set.intersection(*task_flags.values())
    shared_section = next(
        (body for heading, body in sections(prose(DOCS / "cli" / "run.md")) if heading == SHARED_SECTION), ""
    )
    missing = []
    undocumented_shared = sorted(shared - documented_flags(shared_section))
    if undocumented_shared:
        missing.append(f'docs/cli/run.md, "{SHARED_SECTION}": {", ".join(undocumented_shared)}')
    nav = nav_pages()
    for task, flags in task_flags.items():
        page = DOCS / "tasks" / f"{task}.md"
        if not page.is_file():
            missing.append(f"docs/tasks/{task}.md (the page of task {task})")
            continue
        if f"tasks/{task}.md" not in nav:
            missing.append(f"tasks/{task}.md in the nav of mkdocs.yml")
        undocumented = sorted(flags - shared - documented_flags(prose(page)))
        if undocumented:
            missing.append(f"docs/tasks/{task}.md: {', '.join(undocumented)}")
    assert not missing, "tasks and task options without a docs entry:\n  " + "\n  ".join(missing)


def test_every_docs_page_is_in_the_nav():
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert not pages - nav_pages(), f"pages missing from the nav of mkdocs.yml: {sorted(pages - nav_pages())}"
    assert not nav_pages() - pages, f"nav entries without a page: {sorted(nav_pages() - pages)}"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target} (no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked})")
        elif page.is_relative_to(DOCS) and not linked.is_relative_to(DOCS):
            broken.append(f"{target} (outside docs/: the site cannot serve it; name the path in a code span)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with anchor #{anchor} in {linked.relative_to(ROOT)})")
    assert not broken, f"broken links in {page.relative_to(ROOT)}:\n  " + "\n  ".join(broken)


def test_the_readme_links_into_the_docs_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    lines = len(readme.splitlines())
    assert lines <= 200, f"README.md has {lines} lines (at most 200): move the detail into docs/"
    assert any(target.startswith("docs/") and target.endswith(".md") for target in LINK.findall(readme))


def test_the_readme_test_command_is_the_one_ci_runs():
    """.ci/run runs the README's test command: the two must not drift apart."""
    readme = (ROOT / "README.md").read_text()
    test_section = next(body for heading, body in sections(readme) if heading == "Test")
    command = next(line.strip() for line in test_section.splitlines() if line.startswith("    "))
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines, f".ci/run does not run the README's test command {command!r}"


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    needed = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    absent = [name for name in needed if importlib.util.find_spec(name.split(".")[0]) is None]
    if absent:
        pytest.skip(f"{', '.join(absent)} not installed: pip install -e '.[docs]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
