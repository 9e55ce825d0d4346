"""Read ``combined.yaml`` into a :class:`~combined.config.Project`.

Whatever is wrong with the file, the caller gets one
:class:`~combined.errors.ConfigError` naming the file, the position and dotted
path of each problem, what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.error import Mark
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from combined._credentials import is_credential_key
from combined.config._models import PROJECT_ENV, PROJECT_FILE, Project
from combined.config._secrets import find_secret_refs, join_path, remember_project_secrets
from combined.errors import ConfigError, redact

Loc = tuple[str | int, ...]

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_GENERIC_HINT = "compare with the example project that `combined init` writes"

# Example values used in "add `key: value`" hints for missing settings.
_EXAMPLES = {
    "version": "1",
    "connector": "NAME",
    "relation": "<table>",
    "column": "<column>",
    "trust": '"<why the column only grows>"',
    "secret": '"env:NAME"',
}


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A mapping repeats a key; YAML itself would silently keep the last one."""


class _Loader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys and keeps dates and keys as text.

    Connector configurations are free-form and hashed as JSON, so a value
    like ``2024-01-01`` stays the string the user wrote. Every key of the
    project file is a name (a setting, source, dataset or connector key), so
    a plain key is the text written: YAML 1.1 would read a dataset ``on:`` or
    ``no:`` as a boolean, ``null:`` as nothing and ``123:`` as a number.
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Build a mapping with text keys, refusing a key written twice (merged keys may repeat)."""
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != _MERGE_TAG:
                if key_node.value in seen:
                    raise _DuplicateKey(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        self.flatten_mapping(node)  # resolves `<<` merge keys; explicit keys come last
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                key: Any = key_node.value
            else:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        "found unhashable key",
                        key_node.start_mark,
                    )
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Problem(NamedTuple):
    loc: Loc
    predicate: str
    hint: str


def load_project(path: str | Path | None = None) -> Project:
    """Read and validate a project file.

    ``path`` is the file or its directory. Without it, the file named by the
    ``COMBINED_PROJECT`` environment variable is read, else ``./combined.yaml``.
    Raises :class:`~combined.errors.ConfigError` for any problem.
    """
    from_env = False
    if path is None:
        env = os.environ.get(PROJECT_ENV)
        from_env = bool(env)
        path = env or PROJECT_FILE
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / PROJECT_FILE
    file = Path(os.path.abspath(file))
    text = _read(file, from_env=from_env)
    data, marks = _parse_yaml(text, file)
    if data is None:
        raise ConfigError(
            f"{file} is empty",
            hint="write `version: 1` and your sources, or run `combined init --force`",
            file=str(file),
        )
    return _validate(data, file, marks)


def parse_project(data: Mapping[str, Any], path: str | Path = PROJECT_FILE) -> Project:
    """Validate an already parsed project, as if read from ``path``.

    Raises :class:`~combined.errors.ConfigError` exactly as :func:`load_project` does.
    """
    return _validate(data, Path(os.path.abspath(path)), {})


def _read(file: Path, *, from_env: bool) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = (
            f"or fix {PROJECT_ENV}, which names it"
            if from_env
            else "or pass the path of an existing project file"
        )
        raise ConfigError(
            f"project file not found: {file}",
            hint=f"run `combined init` in {file.parent} to create one, {where}",
            file=str(file),
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"{file} is not utf-8 text", hint="save the file as utf-8", file=str(file)
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read {file}: {exc.strerror or type(exc).__name__}",
            hint="check that the file is readable by this user",
            file=str(file),
        ) from None


def _parse_yaml(text: str, file: Path) -> tuple[Any, dict[Loc, Mark]]:
    """The document in ``text`` and the position of every key and list item."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, file) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{file}: invalid YAML: {exc}", hint="fix the file's syntax", file=str(file)
        ) from None
    finally:
        loader.dispose()
    marks: dict[Loc, Mark] = {}
    if node is not None:
        _collect_marks(node, (), marks, set())
    return data, marks


def _yaml_error(exc: yaml.MarkedYAMLError, file: Path) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
    problem = exc.problem or "invalid syntax"
    if isinstance(exc, _DuplicateKey):
        hint = "keep one of them: YAML would silently use only the last"
    elif "'\\t'" in problem:
        hint = "indent with spaces, not tabs"
    else:
        hint = "check the indentation and quoting there (quote text that holds ': ' or '#')"
        if exc.context and exc.context_mark and exc.context_mark is not mark:
            hint += f"; {exc.context} at line {exc.context_mark.line + 1}"
    return ConfigError(f"{where}: invalid YAML: {problem}", hint=hint, file=str(file))


def _collect_marks(node: Node, loc: Loc, marks: dict[Loc, Mark], active: set[int]) -> None:
    # ``active`` guards against recursive aliases (``&a [*a]``).
    if id(node) in active:
        return
    active.add(id(node))
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                sub = (*loc, key_node.value)
                marks.setdefault(sub, key_node.start_mark)
                _collect_marks(value_node, sub, marks, active)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            sub = (*loc, index)
            marks.setdefault(sub, item.start_mark)
            _collect_marks(item, sub, marks, active)
    active.discard(id(node))


def _validate(data: Any, file: Path, marks: dict[Loc, Mark]) -> Project:
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{file} must hold a mapping of settings, not a {type(data).__name__}",
            hint="start the file with `version: 1` on its own line",
            file=str(file),
        )
    try:
        project = Project.model_validate(data, context={"path": file})
    except ValidationError as exc:
        problems = [p for error in exc.errors() for p in _translate(error)]
        raise _config_error(problems, file, marks) from None
    # Every reference, wherever it stands (a source's settings, the catalog's
    # password, a webhook's key), is known before any of them is used.
    references = [ref for _, ref in find_secret_refs(project.model_dump())]
    remember_project_secrets(references, project.root)
    return project


def _config_error(problems: list[_Problem], file: Path, marks: dict[Loc, Mark]) -> ConfigError:
    def position(loc: Loc) -> Mark | None:
        for end in range(len(loc), 0, -1):
            if loc[:end] in marks:
                return marks[loc[:end]]
        return None

    lines: list[tuple[str, str]] = []
    details: list[dict[str, Any]] = []
    for problem in sorted(problems, key=lambda p: _line_of(position(p.loc))):
        mark = position(problem.loc)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
        # Redacted here because ConfigError only redacts its plain-string
        # context, not the structured copy of each problem.
        message = redact(f"{join_path(problem.loc) or 'the project'} {problem.predicate}")
        hint = redact(problem.hint)
        lines.append((f"{where}: {message}", hint))
        details.append(
            {
                "path": join_path(problem.loc),
                "line": mark.line + 1 if mark else None,
                "column": mark.column + 1 if mark else None,
                "message": message,
                "hint": hint,
            }
        )
    if len(lines) == 1:
        line, hint = lines[0]
        return ConfigError(line, hint=hint, file=str(file), problems=details)
    body = "\n".join(f"  {line}\n    hint: {hint}" for line, hint in lines)
    return ConfigError(
        f"{file} has {len(lines)} problems:\n{body}",
        hint="fix each problem listed above; each has its own hint",
        file=str(file),
        problems=details,
    )


def _line_of(mark: Mark | None) -> int:
    return mark.line if mark else -1


def _translate(error: ErrorDetails) -> list[_Problem]:
    """The problems one pydantic error stands for, each with a hint."""
    # "[key]" marks a bad mapping key; the key itself is already in the loc.
    loc: Loc = tuple(part for part in error["loc"] if part != "[key]")
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "combined":
        if "problems" in ctx:
            return [_Problem((*loc, *at), what, hint) for at, what, hint in ctx["problems"]]
        return [_Problem((*loc, *ctx["at"]), ctx["predicate"], ctx["hint"])]
    value = error.get("input")
    shown = "" if _is_private(loc) else f", not {value!r}"
    name = str(loc[-1]) if loc else ""
    if kind == "missing":
        parent = join_path(loc[:-1])
        under = f" under {parent}" if parent else " at the top of the file"
        if name == "connector":  # (it suggested `connector: sqlite` to any source)
            from combined.connectors import known_connectors  # (only when one is missing)

            under += f", NAME one of {', '.join(known_connectors())}"
        return [_Problem(loc, "is required", f"add `{name}: {_EXAMPLES.get(name, '...')}`{under}")]
    if kind == "extra_forbidden":
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else "remove it; "
        hint += f"known keys here: {', '.join(known)}" if known else "no keys are known here"
        return [_Problem(loc, "is not a known key", hint)]
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "write one of the values listed"
        return [_Problem(loc, f"must be one of {', '.join(allowed)}{shown}", hint)]
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return [
            _Problem(loc, f"must be a mapping of settings, not {_kind_of(value)}", _flat_hint(loc))
        ]
    if kind == "string_type":
        return [_Problem(loc, f"must be text, not {_kind_of(value)}", "quote the value")]
    if kind == "list_type":
        return [_Problem(loc, f"must be a list, not {_kind_of(value)}", "write [a, b] or - items")]
    if kind == "recursion_loop":
        return [_Problem(loc, "refers to itself", "remove the recursive YAML alias")]
    message = error["msg"]
    return [_Problem(loc, f"is invalid: {message[:1].lower()}{message[1:]}", _GENERIC_HINT)]


def _flat_hint(loc: Loc) -> str:
    """The hint for an entry at ``loc`` that is not a mapping of settings.

    Named like one of the settings it should hold (``key``, ``connector``),
    it is that setting indented one step too little: YAML read it as a
    dataset (or source) of that name, a sibling of the one it belongs to.
    """
    name = str(loc[-1]) if loc else ""
    if len(loc) > 1 and name in _known_keys(loc):
        return (
            f"{name!r} reads as an entry of {join_path(loc[:-1])} named {name!r}; if it is a "
            "setting of the entry above it, indent it under that entry"
        )
    return "write `key: value` pairs indented under it"


def _kind_of(value: Any) -> str:
    if value is None:
        return "an empty value"
    names = {str: "text", int: "a number", float: "a number", bool: "a boolean", list: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def _is_private(loc: Loc) -> bool:
    """Whether a value at ``loc`` may be a secret and must not be quoted."""
    return any(
        part in ("config", "catalog", "catalog_password") or is_credential_key(part) for part in loc
    )


def _known_keys(loc: Loc) -> list[str]:
    """The keys the model at ``loc`` accepts, for suggestions."""
    current: Any = Project
    for part in loc:
        model = _as_model(current)
        if model is not None:
            field = model.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
            continue
        current = _unwrap(current)
        args = get_args(current)
        if get_origin(current) is dict and len(args) == 2:
            current = args[1]
        elif get_origin(current) is list and args:
            current = args[0]
        else:
            return []
    model = _as_model(current)
    return list(model.model_fields) if model is not None else []


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated`` and ``| None`` from an annotation."""
    if get_origin(annotation) is Annotated:
        return _unwrap(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _as_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
