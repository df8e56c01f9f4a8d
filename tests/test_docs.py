"""The documentation keeps up with the code (sqlite-utils' habit): every column has its row in
docs/columns.md, every command and option is described somewhere in README.md or docs/, every
relative link lands, and the README stays a first read."""

from __future__ import annotations

import re
from pathlib import Path

import click

from analysis import views
from proxy.common import schema
from proxy.cli import main
from proxy.settings.config import ServeConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
COLUMNS = ROOT / "docs" / "columns.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 160
README_MAX_WIDTH = 120  # a line longer than ruff's would hide a paragraph in one


def all_docs() -> str:
    return "\n".join(path.read_text() for path in [README, *DOCS])


def section(text: str, heading: str) -> str:
    """The text under a `## heading` of a page, up to the next `## ` heading (### ones included)."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/columns.md has no '## {heading}' section"
    return match.group(1)


def table_rows(text: str) -> set[str]:
    """The backticked names that start a table row: | `name` | ..."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", text, re.M))


def missing_rows(heading: str, names: tuple[str, ...]) -> list[str]:
    rows = table_rows(section(COLUMNS.read_text(), heading))
    return [name for name in names if name not in rows]


def none_missing(missing: list[str], what: str) -> None:
    assert not missing, f"{what}: {', '.join(missing)}"


def test_every_requests_column_has_a_row() -> None:
    none_missing(missing_rows("`requests`", schema.REQUEST_COLUMN_NAMES), "no row under docs/columns.md `requests`")


def test_every_chunks_column_has_a_row() -> None:
    none_missing(missing_rows("`chunks`", schema.CHUNK_COLUMN_NAMES), "no row under docs/columns.md `chunks`")


def test_every_bodies_column_has_a_row() -> None:
    none_missing(missing_rows("`bodies`", tuple(name for name, _ in schema.BODY_COLUMNS)),
                 "no row under docs/columns.md `bodies`")


def test_every_derived_column_and_rollup_metric_has_a_row() -> None:
    none_missing(missing_rows("The views", (*views.DERIVED_COLUMNS, *views.ROLLUP_METRICS)),
                 "no row under docs/columns.md 'The views'")


def test_every_outcome_and_kind_has_a_row() -> None:
    rows = table_rows(COLUMNS.read_text())
    none_missing([name for name in (*schema.OUTCOMES, *schema.KINDS) if name not in rows],
                 "outcomes and kinds without a row in docs/columns.md")


def commands() -> list[tuple[str, click.Command | None]]:
    """Every command as `llmtap ...` (a group's subcommands too), None for one that cannot load."""
    found: list[tuple[str, click.Command | None]] = []

    def walk(group: click.Group, ctx: click.Context, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            found.append((f"{prefix} {name}", command))
            if isinstance(command, click.Group):
                walk(command, click.Context(command, info_name=name, parent=ctx), f"{prefix} {name}")

    walk(main, click.Context(main, info_name="llmtap"), "llmtap")
    return found


def mentioned(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_every_command_loads_and_has_help() -> None:
    found = commands()
    none_missing([name for name, command in found if command is None], "commands that cannot be imported")
    none_missing([name for name, command in found if command and not (command.help or "").strip()],
                 "commands without --help text")


def test_every_command_is_documented() -> None:
    text = all_docs()
    none_missing([name for name, _ in commands() if not mentioned(text, name)], "commands in neither README.md nor docs/*.md")


def test_every_option_is_documented_and_has_help() -> None:
    text = all_docs()
    undocumented, helpless = [], []
    for name, command in [("llmtap", main), *commands()]:
        for param in command.params if command else ():
            if not isinstance(param, click.Option) or param.hidden:
                continue
            if not param.help and "--version" not in param.opts:
                helpless.append(f"{name} {'/'.join(param.opts)}")
            undocumented += [f"{name} {opt}" for opt in param.opts if not mentioned(text, opt)]
    none_missing(undocumented, "options in neither README.md nor docs/*.md")
    none_missing(helpless, "options without --help text")


def test_every_config_key_is_in_configuration_md() -> None:
    text = CONFIGURATION.read_text()
    keys = [f.name for f in ServeConfig.__dataclass_fields__.values()]
    none_missing([key for key in keys if f"`{key}" not in text and f"[{key}]" not in text],
                 "config-file keys (ServeConfig) not in docs/configuration.md")


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, -1 for repeats."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+\s+(.+?)\s*#*$", strip_code(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def strip_code(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def test_every_relative_link_lands() -> None:
    broken = []
    for page in [README, *DOCS]:
        for link in re.findall(r"\]\(([^)\s]+)\)", strip_code(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
                continue
            path, _, fragment = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    none_missing(broken, "relative links that land nowhere")


def test_the_readme_is_a_first_read() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > README_MAX_WIDTH]
    assert not long, f"README.md lines over {README_MAX_WIDTH} characters: {long}"


def test_the_cli_reference_is_the_help_of_today() -> None:
    from cogapp import Cog

    status = Cog().main(["cog", "--check", str(ROOT / "docs" / "cli.md")])
    assert status == 0, "docs/cli.md is not what --help says: run `cog -r docs/cli.md`"


def test_the_readme_links_every_docs_page() -> None:
    text = README.read_text()
    none_missing([page.name for page in DOCS if f"](docs/{page.name}" not in text], "docs pages the README does not link")
