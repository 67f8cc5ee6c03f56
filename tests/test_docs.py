"""The documentation site builds, and everything README.md and docs/ name exists.

Pages: README.md and every docs/**/*.md, found by glob (a new page is checked without
being listed here). Each check reads all pages, collects every violation and fails once
with `page:line: problem` lines, so a writer can fix them all in one pass.

- **site**: `mkdocs build --strict` (mkdocs.yml) succeeds: links between pages, to
  anchors and to files under docs/ (figures, JSON) resolve. mkdocs reports a link to a
  repository file outside docs/ (`[x](../configs/base.py)`) as "not found", an error under
  --strict, so **pages name repository files in backticks (`configs/base.py`) instead of
  linking them**; the files check below proves those exist. (README.md is not a site page
  and may link into docs/.)
- **config_fields**: every `--config.a.b=...` anywhere (prose and code blocks) is a field
  of the run's config, `configs/base.py`'s `get_config()`: every field a run reads is
  declared there (algorithm-dependent fields as unset placeholders, fields added since
  old runs as well), and a recipe can add none (`resolve_settings` refuses a field base
  does not define), so base is the whole set. A backticked prose span that is nothing but
  a dotted path whose first part is a config section (`rollout.tis_cap`, or with a leading
  `config.`), and a dotted path in a plain (language-less) code block such as the
  formulas' `(loss.kl_clamp)`, must also be a field, or one of the few fields the
  resolved `Settings` derive from others (`loss.temperature`, `overlong.max_len`: real
  attributes, but not settable, so never valid after `--config.`). File names
  (`model.safetensors`) are not paths. A span quoting the refusal of a misspelt field
  ("... has no field ...") is an intended counter-example and is skipped. Values after
  `=` are not checked.
- **flags**: every `python -m da3po_jax.X` / `python -m experiments.X` / `python
  benchmarks/x.py` command, in ```bash blocks (continuation lines joined, comments
  dropped) or in a backticked span, runs a module or script that exists, and each of its
  `--name` options is a flag that CLI defines, read from its own `--helpfull` (absl) or
  `--help` (argparse), once per session; a script that parses no flags is never run and
  takes none. A backticked `--name` in prose must be a flag of one of the CLIs the pages
  run, an option of launch/*.sh or tpu_scripts/*.sh (read from their `case` arms),
  or an external tool's flag in `EXTERNAL_FLAGS`.
- **files**: backticked repository paths (configs/, docs/, da3po_jax/, benchmarks/,
  tests/, launch/, tpu_scripts/, examples/, experiments/, .ci/, and the root files),
  relative to the repository root, and markdown link targets, relative to their page,
  exist; shell braces are expanded and a glob must match a file; `<...>` placeholders and
  `...` are skipped; a recipe's `:argument` (`configs/da3po_qwen3_8b.py:v6e-8`) is not
  part of the path. In commands: the `--config=` file, the script run, the launch script.
- **python_names**: a backticked `da3po_jax.x.y` resolves (a module, or an attribute of
  one), and so does every `from da3po_jax... import` and `import da3po_jax...` of a
  ```python block.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import mkdocs
import pytest

REPO = Path(__file__).resolve().parents[1]

# Top-level folders and files a repository path in the docs starts with.
PATH_PREFIXES = (
    "configs/",
    "docs/",
    "da3po_jax/",
    "benchmarks/",
    "tests/",
    "launch/",
    "tpu_scripts/",
    "examples/",
    "experiments/",
    ".ci/",
)
ROOT_FILES = ("pyproject.toml", "README.md", "LICENSE", "mkdocs.yml")

# Last parts of a dotted name that make it a file name, not a config path.
FILE_EXTENSIONS = frozenset(
    "json jsonl safetensors py md parquet png txt yaml yml sh toml index csv flags lock "
    "html pdf svg log gz tar zip npz npy pt bin ckpt cfg ini".split()
)

# Flags of tools outside this repository that prose may name in backticks: flag -> tool.
EXTERNAL_FLAGS = {
    "dist": "pytest-xdist (`-n 2 --dist loadfile`)",
    "index-url": "pip install",
    "xla_force_host_platform_device_count": "XLA_FLAGS (simulated CPU devices)",
    "xla_dump_to": "XLA_FLAGS (HLO dumps)",
    "gpus-per-node": "sbatch",
    "ntasks-per-node": "sbatch",
    "command": "gcloud compute tpus tpu-vm ssh",
}

# The project's refusal of a misspelt field (da3po_jax/main.py); a span quoting it names a
# field that does not exist on purpose.
NO_FIELD_MESSAGE = " has no field "

DOTTED = r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+"
DOTTED_SPAN_RE = re.compile(rf"^{DOTTED}$")
DOTTED_IN_TEXT_RE = re.compile(rf"(?<![\w./-])({DOTTED})(?![\w(/-])")
CONFIG_OVERRIDE_RE = re.compile(r"--config\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
FLAG_TOKEN_RE = re.compile(r"^--([A-Za-z][\w-]*)(.?)")
PYTHON_NAME_RE = re.compile(r"^da3po_jax(?:\.[A-Za-z_]\w*)+$")
FROM_IMPORT_RE = re.compile(r"^[ \t]*from\s+(da3po_jax[\w.]*)\s+import\s+(\([^)]*\)|[^\n]*)", re.M)
FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SPAN_RE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK_RE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
LINK_DEFINITION_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
CASE_ARM_RE = re.compile(
    r"^\s*((?:-{1,2}[\w-]+(?:=\*)?\s*\|\s*)*-{1,2}[\w-]+(?:=\*)?)\s*(?:\)|\|\s*\\$)", re.M
)
IMPORT_RE = re.compile(r"^[ \t]*import\s+(da3po_jax[\w.]*)", re.M)
SHELL_OPERATORS = frozenset({"&&", "||", "|", ";"})


# ---------------------------------------------------------------------------- pages


@dataclasses.dataclass(frozen=True)
class Span:
    """Text found on a page and the line (1-based) where it starts."""

    line: int
    text: str


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    lang: str
    first_line: int  # line of the block's first content line
    text: str

    def lines(self) -> Iterator[Span]:
        for i, line in enumerate(self.text.split("\n")):
            yield Span(self.first_line + i, line)


@dataclasses.dataclass(frozen=True, repr=False)
class Page:
    rel: str  # path from the repository root, as reported
    prose: str  # the page with code blocks blanked (line numbers kept)
    prose_without_spans: str  # and its inline code spans blanked too
    spans: tuple[Span, ...]  # inline code spans of the prose, newlines as spaces
    blocks: tuple[CodeBlock, ...]

    def __repr__(self) -> str:  # short in pytest's failure reports
        return f"Page({self.rel!r})"

    @property
    def folder(self) -> Path:
        return (REPO / self.rel).parent

    def report(self, found: list[tuple[int, str]]) -> list[str]:
        """`page:line: problem` lines, in the order of the page."""
        return [f"{self.rel}:{line}: {text}" for line, text in sorted(found, key=lambda f: f[0])]

    def shell_blocks(self) -> list[CodeBlock]:
        return [b for b in self.blocks if b.lang in ("bash", "sh", "shell", "console")]


def parse_page(rel: str, text: str) -> Page:
    """Splits a markdown page into prose (with its inline code spans) and fenced blocks."""
    prose_lines: list[str] = []
    blocks: list[CodeBlock] = []
    fence: str | None = None
    lang, first, body = "", 0, []
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE_RE.match(line)
        if fence is None and match:
            fence, lang, first, body = match.group(1), match.group(2).lower(), number + 1, []
            prose_lines.append("")
        elif fence is not None:
            prose_lines.append("")
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                blocks.append(CodeBlock(lang, first, "\n".join(body)))
                fence = None
            else:
                body.append(line)
        else:
            prose_lines.append(line)
    prose = "\n".join(prose_lines)
    spans = []
    blanked = list(prose)
    for match in SPAN_RE.finditer(prose):
        content = match.group(2)
        if re.search(r"\n[ \t]*\n", content):  # a code span never crosses a paragraph
            continue
        content = content.replace("\n", " ")
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        spans.append(Span(prose.count("\n", 0, match.start()) + 1, content))
        for i in range(match.start(), match.end()):
            if blanked[i] != "\n":
                blanked[i] = " "
    return Page(rel, prose, "".join(blanked), tuple(spans), tuple(blocks))


def doc_pages() -> list[Page]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    return [parse_page(p.relative_to(REPO).as_posix(), p.read_text()) for p in paths]


def prose_lines(page: Page) -> Iterator[Span]:
    """The prose outside inline code spans, line by line."""
    for i, line in enumerate(page.prose_without_spans.split("\n"), start=1):
        if line.strip():
            yield Span(i, line)


# ------------------------------------------------------------------------ commands


@dataclasses.dataclass(frozen=True)
class Command:
    """One shell command (between `&&`, `|`, `;`), as tokens."""

    line: int
    tokens: tuple[str, ...]

    def python_target(self) -> tuple[str, tuple[str, ...]] | None:
        """(CLI, its arguments) when the command runs `python -m MODULE` or `python X.py`:
        the CLI is the module name or the script's path."""
        for i, token in enumerate(self.tokens):
            if re.fullmatch(r"(?:\S*/)?python(?:3(?:\.\d+)?)?", token):
                rest = self.tokens[i + 1 :]
                if len(rest) >= 2 and rest[0] == "-m":
                    return rest[1], rest[2:]
                if rest and rest[0].endswith(".py"):
                    return rest[0], rest[1:]
                return None
        return None


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in a fragment
        return re.sub(r"(^|\s)#.*$", "", text).split()


def shell_commands(text: str, first_line: int) -> list[Command]:
    """The commands of a shell snippet: continuation lines joined, comments dropped, split
    at `&&`, `||`, `|` and `;` (outside quotes)."""
    commands = []
    logical: list[tuple[int, str]] = []
    pending, start = "", None
    for i, line in enumerate(text.split("\n")):
        start = first_line + i if start is None else start
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending, start = "", None
    if pending:
        logical.append((start or first_line, pending))
    for line, command in logical:
        current: list[str] = []
        for token in _tokens(command):
            ends = token.endswith(";") and token != ";"
            if token in SHELL_OPERATORS:
                commands.append(Command(line, tuple(current)))
                current = []
            else:
                current.append(token[:-1] if ends else token)
                if ends:
                    commands.append(Command(line, tuple(current)))
                    current = []
        commands.append(Command(line, tuple(current)))
    return [c for c in commands if c.tokens]


def page_commands(page: Page) -> list[Command]:
    """Commands of the page's shell blocks and of its backticked spans that run python."""
    commands = []
    for block in page.shell_blocks():
        commands += shell_commands(block.text, block.first_line)
    for span in page.spans:
        if re.search(r"(?:^|\s)python3?\s", span.text):
            commands += shell_commands(span.text, span.line)
    return commands


def flag_name(token: str) -> str | None:
    """`--name` of an option token (`--name=value`, `[--name]`); None for a config field
    override (`--config.a.b=...`), `--` alone and non-options."""
    match = FLAG_TOKEN_RE.match(token.strip("[]()\"'"))
    if not match or match.group(2) == ".":
        return None
    return match.group(1)


def option_tokens(args: Iterable[str]) -> Iterator[str]:
    """Option tokens up to a lone `--` (after it, arguments belong to another program)."""
    for token in args:
        if token == "--":
            return
        yield token


# --------------------------------------------------------------------- config fields


@dataclasses.dataclass(frozen=True)
class ConfigFields:
    """The run's config fields (`configs/base.py`) and the fields `Settings` derive."""

    sections: dict[str, frozenset[str]]  # section -> its config fields
    top_level: frozenset[str]
    derived: dict[str, frozenset[str]]  # section -> fields the settings derive from others
    constants: dict[str, frozenset[str]]  # section -> its class's fields no config sets

    def is_candidate(self, path: str) -> bool:
        parts = path.split(".")
        return parts[0] in self.sections and parts[-1] not in FILE_EXTENSIONS

    def problem(self, path: str, *, settable: bool) -> str | None:
        """Why `path` (no `config.` prefix) is not a field, or None: "is not a config
        field", ... (the caller puts the path in front)."""
        parts = path.split(".")
        section, field, rest = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
        if not field:
            known = section in self.top_level or section in self.sections
            return None if known else "is not a config field"
        if section not in self.sections:
            return f"is not a config field (`{section}` is not a section)"
        fields = self.sections[section]
        if field in fields:
            return (
                f"is not a config field (`{section}.{field}` has none below it)" if rest else None
            )
        if field in self.derived[section] and not rest:
            return "is derived by the settings, not a config field to set" if settable else None
        if field in self.constants[section] and not rest:
            return f"is not a config field (a constant of the `{section}` section's class)"
        close = difflib.get_close_matches(field, sorted(fields), n=1, cutoff=0.75)
        return "is not a config field" + (
            f" (did you mean `{section}.{close[0]}`?)" if close else ""
        )


@cache
def config_fields() -> ConfigFields:
    spec = importlib.util.spec_from_file_location("docs_base_config", REPO / "configs/base.py")
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    from ml_collections import config_dict

    from da3po_jax.config import resolve_settings
    from da3po_jax.config.settings import derived_fields

    config = base.get_config()
    sections = {
        name: frozenset(value.keys())
        for name, value in config.items()
        if isinstance(value, config_dict.ConfigDict)
    }
    top_level = frozenset(name for name in config.keys() if name not in sections)
    settings = resolve_settings(config, inputs=False)
    derived, constants = {}, {}
    for name in sections:
        section = getattr(settings, name)
        own = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
        derived[name] = frozenset(derived_fields(name, settings.rollout, own))
        constants[name] = frozenset(own) - sections[name] - derived[name]
    return ConfigFields(sections, top_level, derived, constants)


def field_problems(page: Page, fields: ConfigFields) -> list[str]:
    problems: list[tuple[int, str]] = []

    def overrides(span: Span) -> None:
        for match in CONFIG_OVERRIDE_RE.finditer(span.text):
            problem = fields.problem(match.group(1), settable=True)
            if problem:
                problems.append((span.line, f"`--config.{match.group(1)}` {problem}"))

    def dotted_path(span: Span, path: str) -> None:
        if path.startswith("config."):
            rest = path.removeprefix("config.")
            if rest.split(".")[0] in fields.sections or rest in fields.top_level:
                path = rest
        if fields.is_candidate(path):
            problem = fields.problem(path, settable=False)
            if problem:
                problems.append((span.line, f"`{path}` {problem}"))

    for span in page.spans:
        if NO_FIELD_MESSAGE in span.text:
            continue
        overrides(span)
        if DOTTED_SPAN_RE.match(span.text):
            dotted_path(span, span.text)
    for line in prose_lines(page):
        overrides(line)
    for block in page.blocks:
        for line in block.lines():
            if NO_FIELD_MESSAGE in line.text:
                continue
            overrides(line)
            if block.lang in ("", "text"):  # formulas and layouts: `(loss.kl_clamp)`
                for match in DOTTED_IN_TEXT_RE.finditer(line.text):
                    dotted_path(line, match.group(1))
    return page.report(problems)


# ----------------------------------------------------------------------------- flags


def parse_absl_help(text: str) -> frozenset[str]:
    """Flag names of absl's `--helpfull` (`--[no]json` gives json and nojson)."""
    names = set()
    for match in re.finditer(r"^\s+(?:-\S,)?--(\[no\])?([A-Za-z][\w.-]*):", text, re.M):
        names.add(match.group(2))
        if match.group(1):
            names.add("no" + match.group(2))
    return frozenset(names)


def parse_argparse_help(text: str) -> frozenset[str]:
    """Option names of argparse's `--help`, read from its options sections."""
    names: set[str] = set()
    in_options = False
    for line in text.split("\n"):
        if re.match(r"^\S.*:$", line):
            in_options = "option" in line or "argument" in line
            continue
        match = re.match(r"^\s{1,8}(-\S.*?)(?:\s{2,}|$)", line)
        if in_options and match:
            names.update(re.findall(r"(?<![\w-])--([A-Za-z][\w-]*)", match.group(1)))
    return frozenset(names)


def launch_options() -> frozenset[str]:
    """Options of launch/*.sh and tpu_scripts/*.sh: the `--name` patterns of their `case`
    arms (`--name|--other)`, `--name=*)`) and their `== "--name"` tests."""
    names: set[str] = set()
    for script in [*REPO.glob("launch/*.sh"), *REPO.glob("tpu_scripts/*.sh")]:
        source = script.read_text()
        for arm in CASE_ARM_RE.finditer(source):
            names.update(re.findall(r"--([A-Za-z][\w-]*)", arm.group(1)))
        names.update(re.findall(r'==\s*"--([A-Za-z][\w-]*)"', source))
    return frozenset(names)


def cli_source(cli: str) -> Path | None:
    """The file that runs for `python -m cli` (a module name) or `python cli` (a script)."""
    if cli.endswith(".py"):
        path = REPO / cli
        return path if path.is_file() else None
    base = REPO / cli.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__main__.py"):
        if path.is_file():
            return path
    return None


def is_repo_cli(cli: str) -> bool:
    """A module or script of this repository (not pytest, pip, ...)."""
    first = cli.split("/")[0] if cli.endswith(".py") else cli.split(".")[0]
    return (REPO / first).is_dir() and not Path(cli).is_absolute()


def help_style(source: Path) -> str | None:
    """How a CLI prints its flags: "absl" (an `app.run` program: `--helpfull`), "argparse"
    (`--help`), or None for a CLI that parses no flags (never run: `--help` would be an
    argument to it). A module whose parsing lives in a sibling it imports from
    (experiments.engines runs experiments.compare's parser) takes that sibling's style."""
    text = source.read_text()
    if "absl" in text and re.search(r"\bapp\.run\(", text):
        return "absl"
    if re.search(r"\bArgumentParser\(", text):
        return "argparse"
    for sibling in re.findall(r"^from\s+(?:experiments|benchmarks)\.(\w+)\s+import", text, re.M):
        path = source.with_name(f"{sibling}.py")
        if path.is_file() and path != source and help_style(path):
            return help_style(path)
    return None


def read_cli_flags(cli: str) -> frozenset[str] | str:
    """The flags `cli` defines, from its own help in a subprocess; a string when its help
    could not be read (the problem)."""
    source = cli_source(cli)
    if source is None:
        return "no such module or script"
    style = help_style(source)
    if style is None:
        return frozenset()
    head = [cli] if cli.endswith(".py") else ["-m", cli]
    option = "--helpfull" if style == "absl" else "--help"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, *head, option],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    flags = parse_absl_help(output) if style == "absl" else parse_argparse_help(output)
    if ("helpfull" if style == "absl" else "help") not in flags:
        return f"`{cli} {option}` listed no flags:\n{output[-2000:]}"
    return flags


def invoked_clis(pages: Iterable[Page]) -> set[str]:
    """Every repository CLI the pages run, in commands or named in prose."""
    clis = set()
    for page in pages:
        for command in page_commands(page):
            target = command.python_target()
            if target and is_repo_cli(target[0]):
                clis.add(target[0])
        text = page.prose + "\n".join(b.text for b in page.blocks)
        for match in re.finditer(r"python3? (?:-m ([\w.]+)|([\w/]+\.py))", text):
            cli = match.group(1) or match.group(2)
            if is_repo_cli(cli):
                clis.add(cli)
    return clis


def flag_problems(
    page: Page, cli_flags: dict[str, frozenset[str] | str], prose_flags: frozenset[str]
) -> list[str]:
    """Commands' modules and options, and backticked `--name` spans."""
    problems: list[tuple[int, str]] = []
    for command in page_commands(page):
        target = command.python_target()
        if target is None or not is_repo_cli(target[0]):
            continue
        cli, args = target
        flags = cli_flags.get(cli)
        if flags is None:
            flags = read_cli_flags(cli)
        if isinstance(flags, str):
            problems.append((command.line, f"`{cli}`: {flags}"))
            continue
        for token in option_tokens(args):
            name = flag_name(token)
            if name is not None and name not in flags:
                problems.append((command.line, f"`{cli}` has no flag `--{name}`"))
    for span in page.spans:
        if not span.text.startswith("--"):
            continue
        for token in option_tokens(span.text.split()):
            name = flag_name(token)
            if name is not None and name not in prose_flags:
                problems.append((span.line, f"`--{name}` is not a flag of any documented CLI"))
    return page.report(problems)


# ----------------------------------------------------------------------------- files


def expand_braces(text: str) -> list[str]:
    """Shell brace expansion: `a_{x,y}_b` -> `a_x_b`, `a_y_b`."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    return [out for alt in match.group(1).split(",") for out in expand_braces(head + alt + tail)]


def looks_like_repo_path(text: str) -> bool:
    return text.startswith(PATH_PREFIXES) or text in ROOT_FILES


def path_problem(raw: str, folder: Path) -> str | None:
    """Why `raw` (relative to `folder`) names no file, or None (also for placeholders)."""
    if any(mark in raw for mark in ("<", ">", "...", "$")):
        return None
    path = raw.rstrip(",;:)")
    path = re.sub(r"^(.+?\.[A-Za-z0-9]+):.*$", r"\1", path)  # configs/x.py:v6e-8
    for candidate in expand_braces(path):
        if any(c in candidate for c in "*?["):
            if not list(folder.glob(candidate)):
                return f"`{raw}` matches no file"
        elif not (folder / candidate).exists():
            return f"`{raw}` does not exist"
    return None


def command_paths(command: Command) -> Iterator[str]:
    """Repository files a command needs: its `--config=` file, the script it runs, and a
    launch script it runs (also under sbatch)."""
    for token in command.tokens:
        if token.startswith("--config="):
            yield token.removeprefix("--config=")
        elif token.startswith(("launch/", "tpu_scripts/")) and token.endswith(".sh"):
            yield token
    target = command.python_target()
    if target and target[0].endswith(".py") and is_repo_cli(target[0]):
        yield target[0]


def file_problems(page: Page) -> list[str]:
    problems: list[tuple[int, str]] = []

    def check(line: int, raw: str, folder: Path = REPO) -> None:
        problem = path_problem(raw, folder)
        if problem:
            problems.append((line, problem))

    for span in page.spans:
        words = span.text.split()
        if words and looks_like_repo_path(words[0]):
            check(span.line, words[0])
        for word in words:
            if word.startswith("--config=") and looks_like_repo_path(word[len("--config=") :]):
                check(span.line, word.removeprefix("--config="))
    for command in page_commands(page):
        for raw in command_paths(command):
            if looks_like_repo_path(raw):
                check(command.line, raw)
    text = page.prose_without_spans
    targets = [(m.start(), m.group(1)) for m in LINK_RE.finditer(text)]
    targets += [(m.start(), m.group(1)) for m in LINK_DEFINITION_RE.finditer(text)]
    for start, target in targets:
        if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor of the same page
        path = target.split("#")[0].split("?")[0]
        line = text.count("\n", 0, start) + 1
        if path.startswith("/"):
            problems.append((line, f"link `{target}` is absolute"))
        elif path:
            check(line, path, page.folder)
    return page.report(problems)


# ---------------------------------------------------------------------- python names


def python_name_problem(dotted: str) -> str | None:
    """Why `dotted` (a module, or a module's attribute chain) does not resolve, or None.
    A module is found without importing it; only a module whose attribute is named is
    imported."""
    parts = dotted.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        if spec is None:
            return f"`{dotted}`: no module `{parts[0]}`"
        count = 1
        while count < len(parts) and spec.submodule_search_locations is not None:
            sub = importlib.util.find_spec(".".join(parts[: count + 1]))
            if sub is None:
                break
            spec, count = sub, count + 1
        if count == len(parts):
            return None
        module = ".".join(parts[:count])
        obj: Any = importlib.import_module(module)
    except Exception as e:  # an import that fails is the finding
        return f"`{dotted}`: importing it failed ({type(e).__name__}: {e})"
    for i in range(count, len(parts)):
        if not hasattr(obj, parts[i]):
            return f"`{dotted}`: `{'.'.join(parts[:i])}` has no attribute `{parts[i]}`"
        obj = getattr(obj, parts[i])
    return None


def python_name_problems(page: Page) -> list[str]:
    problems: list[tuple[int, str]] = []
    for span in page.spans:
        if PYTHON_NAME_RE.match(span.text):
            problem = python_name_problem(span.text)
            if problem:
                problems.append((span.line, problem))
    for block in page.blocks:
        if block.lang not in ("python", "py"):
            continue
        for match in IMPORT_RE.finditer(block.text):
            problem = python_name_problem(match.group(1))
            if problem:
                line = block.first_line + block.text.count("\n", 0, match.start())
                problems.append((line, f"import {match.group(1)}: {problem}"))
        for match in FROM_IMPORT_RE.finditer(block.text):
            line = block.first_line + block.text.count("\n", 0, match.start())
            names = re.sub(r"#[^\n]*", "", match.group(2)).strip("()")
            for name in (n.split(" as ")[0].strip() for n in names.split(",")):
                if name and name != "*":
                    problem = python_name_problem(f"{match.group(1)}.{name}")
                    if problem:
                        problems.append((line, f"from {match.group(1)} import {name}: {problem}"))
    return page.report(problems)


# ----------------------------------------------------------------------------- tests


def test_docs_site_builds(tmp_path: Path) -> None:
    """`mkdocs build --strict`, as CI runs it: every page renders and every link between
    pages, to their anchors and to files under docs/ resolves."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"mkdocs {mkdocs.__version__} build --strict failed:\n{result.stdout}{result.stderr}"
    )


@pytest.fixture(scope="module")
def pages() -> list[Page]:
    return doc_pages()


@pytest.fixture(scope="module")
def cli_flags(pages: list[Page]) -> dict[str, frozenset[str] | str]:
    """Flags of every CLI the pages run, each read once from its own help (in parallel)."""
    clis = sorted(invoked_clis(pages))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(clis, pool.map(read_cli_flags, clis)))


def _known_prose_flags(cli_flags: dict[str, frozenset[str] | str]) -> frozenset[str]:
    known = set(EXTERNAL_FLAGS) | launch_options()
    for flags in cli_flags.values():
        if not isinstance(flags, str):
            known |= flags
    return frozenset(known)


def _run_check(check: str, pages: list[Page], request: pytest.FixtureRequest) -> list[str]:
    if check == "config_fields":
        fields = config_fields()
        return [p for page in pages for p in field_problems(page, fields)]
    if check == "flags":
        flags = request.getfixturevalue("cli_flags")
        known = _known_prose_flags(flags)
        return [p for page in pages for p in flag_problems(page, flags, known)]
    checks: dict[str, Callable[[Page], list[str]]] = {
        "files": file_problems,
        "python_names": python_name_problems,
    }
    return [p for page in pages for p in checks[check](page)]


@pytest.mark.parametrize("check", ["config_fields", "flags", "files", "python_names"])
def test_docs_name_only_what_exists(
    check: str, pages: list[Page], request: pytest.FixtureRequest
) -> None:
    problems = _run_check(check, pages, request)
    if problems:
        pytest.fail(
            f"{len(problems)} {check} problem(s) in the docs:\n" + "\n".join(problems),
            pytrace=False,
        )


# ---------------------------------------------------------- the extractors themselves

FIELD_PAGE = """\
Set `loss.eps_high`, `config.mesh.shape` or `--config.rollout.group_size=16`; the
resolved `loss.temperature` follows `loss.train_temperature`. Not fields: `loss.eps_hihg`
and `--config.loss.temperature=1`. Files and code are not paths: `model.safetensors`,
`jax.numpy`, `config.json`, `loss.agg(x)`. A refusal: `--config.train.stpes: config.train
has no field 'stpes'`.

```
x = clamp(d, -20, 20)        (loss.log_ratio_clamp), daa.factor = 2
```

```bash
python -m da3po_jax.main --config.daa.denom_min=1 --config.seed=1
```
"""


def test_field_check_finds_unknown_fields() -> None:
    problems = field_problems(parse_page("p.md", FIELD_PAGE), config_fields())
    assert problems == [
        "p.md:2: `loss.eps_hihg` is not a config field (did you mean `loss.eps_high`?)",
        "p.md:3: `--config.loss.temperature` is derived by the settings, not a config field to set",
        "p.md:8: `loss.log_ratio_clamp` is not a config field (a constant of the `loss` "
        "section's class)",
        "p.md:12: `--config.daa.denom_min` is not a config field (a constant of the `daa` "
        "section's class)",
    ]


FLAG_PAGE = """\
Use `--workdir=DIR`, `--verbosity=-1` or `--nope`; `python -m da3po_jax.main --bad`.

```bash
# a comment --ignored
python -m da3po_jax.main --config=configs/tiny_math.py \\
  --config.algo=dapo --workdir=/tmp/x --wrong=1 && python -m pytest --dist loadfile
python -m da3po_jax.nosuch --x
launch/tpu_vm.sh run -- --config=configs/tiny_math.py --anything
```
"""


def test_flag_check_finds_unknown_flags_and_modules() -> None:
    flags: dict[str, frozenset[str] | str] = {
        "da3po_jax.main": frozenset({"config", "workdir", "verbosity"})
    }
    problems = flag_problems(parse_page("p.md", FLAG_PAGE), flags, flags["da3po_jax.main"])
    assert problems == [
        "p.md:1: `da3po_jax.main` has no flag `--bad`",
        "p.md:1: `--nope` is not a flag of any documented CLI",
        "p.md:5: `da3po_jax.main` has no flag `--wrong`",
        "p.md:7: `da3po_jax.nosuch`: no such module or script",
    ]


def test_shell_commands_join_lines_and_split_operators() -> None:
    commands = shell_commands("a --x \\\n  --y 'p | q' # note\nb; c && d | e", 10)
    assert [(c.line, c.tokens) for c in commands] == [
        (10, ("a", "--x", "--y", "p | q")),
        (12, ("b",)),
        (12, ("c",)),
        (12, ("d",)),
        (12, ("e",)),
    ]


def test_help_parsers() -> None:
    absl = "main.py:\n  --config: Path.\n  --[no]json: As JSON.\nabsl.app:\n  -?,--[no]helpfull: x"
    assert parse_absl_help(absl) == {"config", "json", "nojson", "helpfull", "nohelpfull"}
    argparse_help = (
        "usage: x.py [-h] [--seeds SEEDS]\n\nSee --not-an-option.\n\noptions:\n"
        "  -h, --help            show this help message and exit\n"
        "  --seeds SEEDS [SEEDS ...]\n  --group-size GROUP_SIZE\n                        doc\n"
    )
    assert parse_argparse_help(argparse_help) == {"help", "seeds", "group-size"}


FILE_PAGE = """\
See `configs/base.py`, `configs/da3po_qwen3_8b.py:v6e-8`, `configs/qwen_math_{7b,1p5b}_*.py`,
`configs/<recipe>.py`, `docs/nosuch.md` and `configs/nosuch_*.py`; [ok](configs/base.py),
[bad](configs/missing.py#x), [web](https://example.com/a.md), [self](#anchor).

```bash
python -m da3po_jax.main --config=configs/missing_recipe.py
python benchmarks/missing.py
```
"""


def test_file_check_finds_missing_files() -> None:
    assert file_problems(parse_page("README.md", FILE_PAGE)) == [
        "README.md:2: `docs/nosuch.md` does not exist",
        "README.md:2: `configs/nosuch_*.py` matches no file",
        "README.md:3: `configs/missing.py` does not exist",
        "README.md:6: `configs/missing_recipe.py` does not exist",
        "README.md:7: `benchmarks/missing.py` does not exist",
    ]


def test_file_check_resolves_links_from_their_page() -> None:
    page = parse_page("docs/p.md", "[fig](figures/nosuch.png) [up](../configs/base.py)")
    assert file_problems(page) == ["docs/p.md:1: `figures/nosuch.png` does not exist"]
    assert expand_braces("a_{x,y}_{1,2}") == ["a_x_1", "a_x_2", "a_y_1", "a_y_2"]


def test_python_name_check() -> None:
    page = parse_page(
        "p.md",
        "`da3po_jax.config.default_config`, `da3po_jax.config.nosuch`, `da3po_jax.nosuch`\n\n"
        "```python\nfrom da3po_jax.config import (\n"
        "    default_config,  # ok\n    missing,\n)\nimport da3po_jax.nosuch\n```\n",
    )
    assert python_name_problems(page) == [
        "p.md:1: `da3po_jax.config.nosuch`: `da3po_jax.config` has no attribute `nosuch`",
        "p.md:1: `da3po_jax.nosuch`: `da3po_jax` has no attribute `nosuch`",
        "p.md:4: from da3po_jax.config import missing: `da3po_jax.config.missing`: "
        "`da3po_jax.config` has no attribute `missing`",
        "p.md:8: import da3po_jax.nosuch: `da3po_jax.nosuch`: `da3po_jax` has no attribute "
        "`nosuch`",
    ]
