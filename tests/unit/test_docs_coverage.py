"""The README's commands are real, and README + docs/ cover what users can reach.

Commands: every line of the README's `sh` code blocks is parsed as written: `make` targets
exist in the Makefile, `pdctl` command lines parse with pdctl's own click commands (in process,
from the registry `pdctl.cli.COMMANDS`), and every repository path named exists. Links:
every relative link of the README and docs/ reaches a file, and its `#anchor` a heading.
Coverage: every pdctl command and option, every profile key, every role variable, every alert
the rules build and every make target is named somewhere in README.md or docs/.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from pydantic import BaseModel

from monitoring.rules import render_rules
from pdctl.cli import COMMANDS, cli
from pdctl.spec.profile import Profile
from tests.conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
TEXT = "\n".join(p.read_text() for p in PAGES)
SECTIONS = re.split(r"^#+ .*$", TEXT, flags=re.M)  # the text between headings
WORDS = set(re.findall(r"[\w-]+", TEXT))

# Commands whose options are internal by design: site.yml runs them on the controller with
# arguments it derives from the inventory (roles/pdstack_etcd), and no operator types them; the
# commands themselves are documented (docs/deploy.md, docs/etcd.md).
INTERNAL_OPTIONS = {"etcd pki", "etcd members"}
# An option this many commands share (the deployment's sources: --topology, -i, -p, --format)
# is documented once, where pdctl learns the deployment, not in every command's section.
SHARED = 3


def _shell_lines(markdown: str) -> list[str]:
    """The command lines of the `sh` code blocks, continuation lines joined."""
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```", markdown, re.M | re.S)
    lines = []
    for block in blocks:
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _words(line: str) -> list[str]:
    """The line's words, its comment and leading VAR=value assignments left out."""
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words.pop(0)
    return words


README_COMMANDS = [_words(line) for line in _shell_lines(README.read_text())]


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def _repo_paths(words: list[str]) -> list[str]:
    """The words that name a file of the repository: relative, with a directory or a suffix
    of an input file (outputs such as `out.jsonl` are written, not read)."""
    named = [w.split("=", 1)[-1] for w in words]
    return [
        w
        for w in named
        if not w.startswith(("/", "-", "http")) and ("/" in w or w.endswith((".yml", ".ini")))
    ]


def _resolve(words: list[str]) -> tuple[click.Command, click.Context, list[str]]:
    """pdctl's command for a `pdctl ...` line: groups walked down to the command named."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="pdctl")
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"{command.name} has no command {rest[0]}: {' '.join(words)}"
        ctx = click.Context(sub, parent=ctx, info_name=rest[0])
        command, rest = sub, rest[1:]
    return command, ctx, rest


def test_the_readme_names_only_commands_this_test_checks() -> None:
    assert len(README_COMMANDS) >= 20
    firsts = {w[0] for w in README_COMMANDS}
    assert {"make", "pdctl", "ansible-playbook"} >= firsts, firsts


def test_the_readme_starts_with_the_two_commands_ci_runs() -> None:
    """`.ci/run` runs the README's test command; a fresh machine needs nothing else."""
    assert README_COMMANDS[:2] == [["make", "demo"], ["make", "test"]]
    assert "\nmake test\n" in (ROOT / ".ci" / "run").read_text()


def test_every_make_target_in_the_readme_exists() -> None:
    targets = _make_targets()
    named = [w for words in README_COMMANDS if words[0] == "make" for w in words[1:]]
    assert named and set(named) <= targets, set(named) - targets


@pytest.mark.parametrize(
    "words", [w for w in README_COMMANDS if w[0] == "pdctl"], ids=lambda w: " ".join(w)
)
def test_every_pdctl_line_in_the_readme_parses(
    words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsed by the command's own parameters, types and choices: an unknown option, a wrong
    value or an extra argument fails here as it would on a host."""
    monkeypatch.chdir(ROOT)  # paths such as -i inventory.ini are the checkout's
    command, parent, rest = _resolve(words)
    assert not isinstance(command, click.Group), f"{' '.join(words)} names a group, no command"
    try:
        command.make_context(parent.info_name, rest, parent=parent.parent)
    except click.exceptions.Exit as done:  # --help prints and exits 0
        assert done.exit_code == 0


def test_every_path_the_readme_names_exists() -> None:
    in_commands = [p for words in README_COMMANDS for p in _repo_paths(words)]
    in_text = re.findall(r"`([\w.-]+(?:/[\w.-]+)+/?)`", README.read_text())
    named = [p for p in in_commands + in_text if not p.startswith(".venv/")]
    assert len(named) >= 8
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", page.read_text(), re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> Iterator[tuple[Path, str]]:
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if not target.startswith(("http://", "https://", "mailto:")):
            path, _, anchor = target.partition("#")
            yield (page.parent / path if path else page), anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = [
        f"{target.name}#{anchor}"
        for target, anchor in _links(page)
        if not target.exists() or (anchor and anchor not in _anchors(target))
    ]
    assert not broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paragraph_is_written_twice_on_a_page(page: Path) -> None:
    """A merge that keeps both sides of a docs conflict repeats whole paragraphs (once left
    three copies of real-engine.md's bundle text where a list belonged)."""
    paragraphs = [p.strip() for p in page.read_text().split("\n\n") if len(p.strip()) > 150]
    assert [p[:80] for p, n in Counter(paragraphs).items() if n > 1] == []


def _pdctl_commands() -> Iterator[tuple[str, click.Command]]:
    """Every command pdctl registers, a group's subcommands as `group sub`."""
    ctx = click.Context(cli, info_name="pdctl")
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from ((f"{name} {sub}", c) for sub, c in command.commands.items())
        else:
            yield name, command


def test_every_pdctl_command_is_documented() -> None:
    undocumented = [name for name, _ in _pdctl_commands() if f"pdctl {name}" not in TEXT]
    assert not undocumented


def _sections_naming(name: str) -> str:
    """The text of every section (between headings) of README and docs/ that names
    `pdctl NAME`: where a reader of that command looks for its options."""
    return "\n".join(s for s in SECTIONS if re.search(rf"pdctl {name}\b", s))


def _named(option: click.Option, words: set[str]) -> bool:
    """Whether the words name the option by any of its spellings."""
    return not words.isdisjoint(option.opts + option.secondary_opts)


def test_every_pdctl_option_is_documented_where_its_command_is() -> None:
    commands = [(n, c) for n, c in _pdctl_commands() if n not in INTERNAL_OPTIONS]
    options = [(n, o) for n, c in commands for o in c.params if isinstance(o, click.Option)]
    options = [(n, o) for n, o in options if not o.hidden and o.name != "help"]
    shared = Counter(tuple(o.opts) for _, o in options)
    assert len(options) >= 100
    undocumented = [
        f"pdctl {name} {option.opts[-1]}"
        for name, option in options
        if not _named(option, set(re.findall(r"[\w-]+", _sections_naming(name))))
        and not (shared[tuple(option.opts)] >= SHARED and _named(option, WORDS))
    ]
    assert not undocumented


def test_every_alert_is_documented() -> None:
    groups = yaml.safe_load(render_rules())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 20
    assert not alerts - WORDS


def test_every_make_target_is_documented() -> None:
    targets = _make_targets()
    assert {"demo", "test", "check"} <= targets
    assert not {t for t in targets if not re.search(rf"\bmake {t}(?![\w-])", TEXT)}


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    """The profile models a field's type holds: itself, or inside list, dict or | None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _models(arg)


def _profile_keys(model: type[BaseModel], parent: str = "") -> Iterator[tuple[str, str]]:
    """(parent key, key) for every key of the profile, nested sections walked down."""
    for name, field in model.model_fields.items():
        key = field.alias or name
        yield parent, key
        for sub in _models(field.annotation):
            yield from _profile_keys(sub, key)


def test_every_profile_key_is_documented_under_its_section() -> None:
    """A nested key is named in a section (a heading and its text) that names its parent key
    too: `port` alone is everywhere, `port` beside `router` is the profile's."""
    keys = list(_profile_keys(Profile))
    sections = re.split(r"^(?=#+ )", TEXT, flags=re.M)
    assert len(keys) >= 100

    def documented(parent: str, key: str) -> bool:
        if not parent:
            return re.search(rf"\b{key}\b", TEXT) is not None
        named = (rf"\b{re.escape(key)}\b", rf"\b{re.escape(parent)}\b")
        return any(all(re.search(n, s) for n in named) for s in sections)

    undocumented = [f"{p}.{k}".lstrip(".") for p, k in keys if not documented(p, k)]
    assert not undocumented


def test_every_role_variable_is_documented() -> None:
    """The variables of every role's argument specs: what an inventory may set."""
    specs = sorted(ROOT.glob("roles/*/meta/argument_specs.yml"))
    names = {
        name
        for spec in specs
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values()
        for name in entry.get("options", {})
    }
    assert len(names) >= 50
    assert not sorted(names - WORDS)
