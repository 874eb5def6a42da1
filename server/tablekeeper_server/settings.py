"""Settings of a command, read from its defaults, a TOML file, the environment and its flags.

A `Setting` is declared once and is then three things: a flag (`--data-dir`), a key of the
configuration file (`data-dir = "/var/lib/tk"`, under a TOML table such as `[limits]` when the
setting has a `section`), and an environment variable (`TABLEKEEPER_SERVER_DATA_DIR`: a prefix
plus the flag's name in capitals, `-` as `_`). Precedence, highest first: the command line, the
environment, the file, the default. Every value, whatever its source, goes through its `Kind`'s
conversion, so `--checkpoint-interval 5m`, `TABLEKEEPER_SERVER_CHECKPOINT_INTERVAL=5m` and
`checkpoint-interval = "5m"` mean the same thing and are refused the same way.

A bad value raises `SettingError`, one line naming where the value came from (`FILE: KEY: ...` or
`ENV_VAR: ...`); unknown keys of the file and unknown variables under the prefix are errors too
(a misspelt setting silently ignored is worse than a refusal). This module knows nothing of the
server: `tablekeeper_server.config` declares its settings.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SOURCE = "default"
COMMAND_LINE_SOURCE = "command line"


class SettingError(ValueError):
    """A setting that cannot be used; the message (one line) says where it came from."""


# ------------------------------------------------------------------------------------ kinds


@dataclass(frozen=True)
class Kind:
    """How values of one type of setting are read (from text: flags, environment; from TOML)
    and written back (as TOML, for `--print-config`)."""

    name: str
    """For messages: "an integer", "a duration", ..."""
    from_text: Callable[[str], Any]
    """Text (a flag's argument or an environment variable) to the value; ValueError if bad."""
    from_toml: Callable[[Any], Any]
    """A TOML value to the value; ValueError if bad."""
    to_toml: Callable[[Any], str]
    """The value as a TOML literal (`to_toml` then `from_toml` gives the value back)."""
    switch: bool = False
    """A boolean: the flag takes no argument (`--x` / `--no-x`)."""
    choices: tuple[str, ...] = ()
    """The allowed values, if they are a fixed set (offered by shell completion)."""
    metavar: str | None = None
    """How `--help` names a flag's argument (else the flag's name in capitals)."""


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _wrong_type(expected: str, value: Any) -> ValueError:
    return ValueError(f"expected {expected}, got {_type_name(value)} ({value!r})")


def _string_from_toml(value: Any) -> str:
    if not isinstance(value, str):
        raise _wrong_type("a string", value)
    return value


def _int_from_text(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None


def _int_from_toml(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type("an integer", value)
    return value


_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_BINARY_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes: `4096`, `512KiB`, `64MiB`, `1GiB` (binary units), `10MB` (decimal), `64 MiB`."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS and unit:
        raise ValueError(f"not a size: {text!r} (bytes, or e.g. 512KiB, 64MiB, 1GiB)")
    value = float(match.group(1)) * _SIZE_UNITS[unit or "b"]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def format_size(value: int) -> str:
    """The shortest exact text of a size: `64MiB`, `1000` (bytes)."""
    for unit, size in _BINARY_UNITS:
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _size_from_toml(value: Any) -> int:
    if isinstance(value, str):
        return parse_size(value)
    return _int_from_toml(value)


def _size_to_toml(value: int) -> str:
    text = format_size(value)
    return text if text == str(value) else _toml_string(text)


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds: `300` (plain seconds), `250ms`, `90s`, `5m`, `1h`, `7d`, `1.5s`."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (seconds, or e.g. 250ms, 90s, 5m, 1h)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """The shortest exact text of a duration: `5m`, `90s`, `250ms`, `1.5s`."""
    if seconds == 0:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    milliseconds = round(seconds * 1000)
    if milliseconds / 1000 == seconds:
        return f"{milliseconds}ms"
    return f"{seconds!r}s"


def _duration_from_toml(value: Any) -> float:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type('a duration (seconds, or a string such as "5m")', value)
    if not math.isfinite(value):
        raise ValueError(f"not a duration: {value!r}")
    return float(value)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool_from_text(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise ValueError(f"not a boolean: {text!r} (true/false, 1/0, yes/no, on/off)")


def _bool_from_toml(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type("a boolean (true or false)", value)
    return value


def _list_from_text(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _list_from_toml(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _wrong_type("an array of strings", value)
    return tuple(item.strip() for item in value if item.strip())


def _list_to_toml(value: Sequence[str]) -> str:
    return "[" + ", ".join(_toml_string(item) for item in value) + "]"


STRING = Kind("a string", str, _string_from_toml, _toml_string)
PATH = Kind(
    "a path", Path, lambda value: Path(_string_from_toml(value)), lambda p: _toml_string(str(p))
)
INT = Kind("an integer", _int_from_text, _int_from_toml, str)
SIZE = Kind("a size", parse_size, _size_from_toml, _size_to_toml, metavar="SIZE")
DURATION = Kind(
    "a duration",
    parse_duration,
    _duration_from_toml,
    lambda seconds: _toml_string(format_duration(seconds)),
    metavar="DURATION",
)
BOOL = Kind(
    "a boolean", _bool_from_text, _bool_from_toml, lambda b: "true" if b else "false", switch=True
)
LIST = Kind("a list", _list_from_text, _list_from_toml, _list_to_toml)


def choice(*choices: str, normalize: Callable[[str], str] = lambda text: text) -> Kind:
    """One of `choices` (after `normalize`, e.g. `str.upper`)."""

    def from_text(text: str) -> str:
        value = normalize(text.strip())
        if value not in choices:  # argparse's wording, as for the CLI's other choices
            raise ValueError(f"invalid choice: {value!r} (choose from {', '.join(choices)})")
        return value

    return Kind(
        f"one of {', '.join(choices)}",
        from_text,
        lambda value: from_text(_string_from_toml(value)),
        _toml_string,
        choices=choices,
    )


# --------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    """One setting: a flag, a file key and an environment variable (see the module doc)."""

    key: str
    """The flag's name without `--`; also the file's key and, in capitals, the variable's."""
    kind: Kind
    default: Any
    """None: unset (the setting is optional)."""
    help: str
    field: str
    """Where the value goes in the configuration object (dotted: `limits.key_bytes_max`)."""
    section: str = ""
    """The TOML table the key lives in (`limits`); "" for the top level."""
    metavar: str | None = None
    default_text: str | None = None
    """How `--help` shows the default, when the value alone would not say it (an unset path
    that defaults to another's subdirectory, say)."""

    @property
    def flag(self) -> str:
        return f"--{self.key}"

    @property
    def dest(self) -> str:
        """The attribute of the parsed flags. Prefixed: the client CLI's own global flags
        (`--tls-ca`, ...) share the namespace, and their values must not count as ours."""
        return "setting__" + self.key.replace("-", "_")

    @property
    def file_key(self) -> str:
        """The key's name in messages: `limits.max-key-bytes`, `data-dir`."""
        return f"{self.section}.{self.key}" if self.section else self.key

    def env_var(self, prefix: str) -> str:
        return prefix + self.key.upper().replace("-", "_")

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return "unset"
        if self.kind is SIZE:
            return format_size(self.default)
        if self.kind is DURATION:
            return format_duration(self.default)
        if self.kind is LIST:
            return ",".join(self.default) or "none"
        if self.kind is BOOL:
            return "on" if self.default else "off"
        return str(self.default)


@dataclass(frozen=True)
class SettingGroup:
    """Settings shown under one heading of `--help`; with a `section`, also one TOML table."""

    title: str
    settings: tuple[Setting, ...]
    section: str = ""


def add_flags(parser: argparse.ArgumentParser, groups: Iterable[SettingGroup]) -> None:
    """Add every setting's flag to `parser`. A flag not given leaves its attribute unset
    (`argparse.SUPPRESS`), so `resolve` can tell "given" from "default"."""
    for group in groups:
        target: Any = parser.add_argument_group(group.title) if group.title else parser
        for setting in group.settings:
            help_text = f"{setting.help} (default {setting.shown_default()})"
            if setting.kind.switch:
                target.add_argument(
                    setting.flag,
                    action=argparse.BooleanOptionalAction,
                    dest=setting.dest,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
                continue
            target.add_argument(
                setting.flag,
                type=_argparse_type(setting.kind),
                choices=setting.kind.choices or None,
                dest=setting.dest,
                default=argparse.SUPPRESS,
                metavar=setting.metavar
                or setting.kind.metavar
                or ("{" + ",".join(setting.kind.choices) + "}" if setting.kind.choices else None)
                or setting.key.upper().replace("-", "_"),
                help=help_text,
            )


def _argparse_type(kind: Kind) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return kind.from_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = kind.name
    return convert


# ------------------------------------------------------------------------------- resolution


@dataclass(frozen=True)
class Resolved:
    """Every setting's value and where it came from."""

    values: dict[str, Any]
    """By key (`data-dir`)."""
    sources: dict[str, str]
    """By key: `default`, `command line`, `env NAME` or `FILE: KEY`."""
    config_file: Path | None = None

    def explain(self, message: str) -> str:
        """`message` (a validation error naming flags, `--containers must be ...`) with where
        each named setting that was not given on the command line came from."""
        notes = []
        for key in dict.fromkeys(re.findall(r"--([a-z][a-z0-9-]*)", message)):
            source = self.sources.get(key)
            if source is not None and source not in (DEFAULT_SOURCE, COMMAND_LINE_SOURCE):
                notes.append(f"--{key} from {source}")
        return f"{message} ({'; '.join(notes)})" if notes else message


@dataclass(frozen=True)
class SettingsSpec:
    """All settings of a command, and how the file and the environment name them."""

    groups: tuple[SettingGroup, ...]
    env_prefix: str
    """`TABLEKEEPER_SERVER_`: each setting's variable is this plus its key in capitals."""
    config_env_var: str
    """The variable naming the configuration file (when `--config` is not given)."""
    by_key: dict[str, Setting] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_key: dict[str, Setting] = {}
        sectioned = [bool(g.section) for g in self.groups]
        if sectioned != sorted(sectioned):  # TOML: top-level keys before the first table
            raise AssertionError("groups without a section must come first")
        for group in self.groups:
            for setting in group.settings:
                if setting.key in by_key or setting.section != group.section:
                    raise AssertionError(f"setting {setting.key} declared twice or misplaced")
                by_key[setting.key] = setting
        object.__setattr__(self, "by_key", by_key)

    @property
    def settings(self) -> list[Setting]:
        return list(self.by_key.values())

    @property
    def sections(self) -> list[str]:
        return [g.section for g in self.groups if g.section]

    def resolve(
        self, given: Mapping[str, Any], environ: Mapping[str, str], config_file: Path | None
    ) -> Resolved:
        """The value of every setting: `given` (the command line's, by key) over the
        environment over the file (`config_file`, else the one `config_env_var` names) over
        the defaults. Raises `SettingError`."""
        values = {s.key: s.default for s in self.settings}
        sources = dict.fromkeys(values, DEFAULT_SOURCE)
        if config_file is None and environ.get(self.config_env_var):
            config_file = Path(environ[self.config_env_var])
        if config_file is not None:
            for key, value in self.read_file(config_file).items():
                values[key] = value
                sources[key] = f"{config_file}: {self.by_key[key].file_key}"
        for key, (name, value) in self.read_environment(environ).items():
            values[key] = value
            sources[key] = f"env {name}"
        for key, value in given.items():
            values[key] = value
            sources[key] = COMMAND_LINE_SOURCE
        return Resolved(values, sources, config_file)

    def given_on_command_line(self, args: argparse.Namespace) -> dict[str, Any]:
        """The settings whose flags were given, by key (see `add_flags`)."""
        return {s.key: getattr(args, s.dest) for s in self.settings if hasattr(args, s.dest)}

    def read_environment(self, environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
        """{key: (variable, value)} of the variables under `env_prefix`; an empty variable
        counts as not set. Raises `SettingError` for a bad value or an unknown variable."""
        names = {s.env_var(self.env_prefix): s for s in self.settings}
        found: dict[str, tuple[str, Any]] = {}
        for name in sorted(environ):
            if not name.startswith(self.env_prefix) or name == self.config_env_var:
                continue
            setting = names.get(name)
            if setting is None:
                hint = _did_you_mean(name, [*names, self.config_env_var])
                raise SettingError(f"{name}: no such setting{hint}")
            text = environ[name]
            if not text.strip():
                continue
            try:
                found[setting.key] = (name, setting.kind.from_text(text))
            except ValueError as exc:
                raise SettingError(f"{name}: {exc}") from None
        return found

    def read_file(self, path: Path) -> dict[str, Any]:
        """The settings a TOML file gives, by key. Raises `SettingError`."""
        try:
            with path.open("rb") as f:
                document = tomllib.load(f)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise SettingError(f"{path}: cannot read the configuration file: {reason}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingError(f"{path}: not valid TOML: {exc}") from None
        found: dict[str, Any] = {}
        for name, value in document.items():
            if name in self.sections:
                if not isinstance(value, dict):
                    raise SettingError(f"{path}: {name}: expected a table ([{name}])")
                for key, item in value.items():
                    self._read_file_value(path, name, key, item, found)
            else:
                self._read_file_value(path, "", name, value, found)
        return found

    def _read_file_value(
        self, path: Path, section: str, key: str, value: Any, found: dict[str, Any]
    ) -> None:
        shown = f"{section}.{key}" if section else key
        setting = self.by_key.get(key)
        if setting is None or setting.section != section:
            raise SettingError(f"{path}: {shown}: no such setting{self._file_hint(key, section)}")
        try:
            found[key] = setting.kind.from_toml(value)
        except ValueError as exc:
            raise SettingError(f"{path}: {shown}: {exc}") from None

    def _file_hint(self, key: str, section: str) -> str:
        setting = self.by_key.get(key)
        if setting is not None:  # right name, wrong place
            place = f"under [{setting.section}]" if setting.section else "at the top level"
            return f" here (it belongs {place})"
        return _did_you_mean(
            key,
            [s.key for s in self.settings if s.section == section],
            [s.file_key for s in self.settings if s.section != section],
        )

    def to_toml(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
        """`values` as a configuration file, each value not from the defaults commented with
        its source. Reading the text back (`read_file`) gives `values`."""
        lines = [
            "# The effective configuration (tablekeeper server --print-config); a file for",
            "# --config. Keys are the flags' names; a comment names a value's source when it",
            "# is not the default.",
        ]
        for group in self.groups:
            if group.section:
                lines += ["", f"[{group.section}]"]
            for setting in group.settings:
                value = values[setting.key]
                source = sources.get(setting.key, DEFAULT_SOURCE)
                note = "" if source == DEFAULT_SOURCE else f"  # from {source}"
                if value is None:
                    meaning = f": {setting.default_text}" if setting.default_text else ""
                    lines.append(f"# {setting.key} is unset{meaning}{note}")
                else:
                    lines.append(f"{setting.key} = {setting.kind.to_toml(value)}{note}")
        return "\n".join(lines) + "\n"

    def to_argv(self, values: Mapping[str, Any]) -> list[str]:
        """`values` as flags (unset settings are left out), for a process that must run with
        exactly this configuration."""
        argv = []
        for setting in self.settings:
            value = values[setting.key]
            if value is None:
                continue
            if setting.kind.switch:
                argv.append(setting.flag if value else f"--no-{setting.key}")
                continue
            if setting.kind is LIST:
                text = ",".join(value)
            elif setting.kind is SIZE:
                text = str(value)
            elif setting.kind is DURATION:
                text = format_duration(value)
            else:
                text = str(value)
            argv.append(f"{setting.flag}={text}")
        return argv


def _did_you_mean(name: str, *candidate_lists: Sequence[str]) -> str:
    """` (did you mean X?)` for the closest candidate of the first list that has one, else ""."""

    def normal(text: str) -> str:
        return text.replace("_", "-").lower()

    for candidates in candidate_lists:
        by_normal = {normal(c): c for c in candidates}
        close = difflib.get_close_matches(normal(name), list(by_normal), n=1)
        if close:
            return f" (did you mean {by_normal[close[0]]}?)"
    return ""
