"""Reading the YAML files the platform is configured with: one loader, one error format.

This module owns how a config file's bytes become data: a bounded single read (size limit
checked before and after), strict UTF-8, a safe YAML loader that rejects duplicate keys and
alias bombs, a map from key paths to line numbers, and turning pydantic's errors into
problems that name the file, the line and the field, never the input values.

Every loader of a platform file (policies, scheduler.yaml, job specs, Serve configs, eval
suites and records, data policies) goes through `read_yaml`/`parse_yaml` and `validate`, and
raises `ConfigFileError` or its own subclass of it. The hash a caller keeps of a file is
`ConfigFile.sha256`: of exactly the bytes that were parsed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""Largest config file read. Ours are kilobytes; a bigger one is a mistake or an attack."""
DEFAULT_MAX_NODES = 1_000_000
"""Most YAML nodes a document may have once its aliases are expanded (billion laughs)."""
FILE_MISSING = "cannot read: file is missing"

KeyPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a file: where (line and dotted field, when known) and what."""

    file: str
    message: str
    line: int | None = None
    field: str = ""

    def parts(self) -> tuple[str, str, str]:
        """(file, where, message): where is the field, else `line N`; a field's line ends the message."""
        if self.field:
            suffix = f" (line {self.line})" if self.line is not None else ""
            return self.file, self.field, self.message + suffix
        return self.file, f"line {self.line}" if self.line is not None else "", self.message

    def __str__(self) -> str:
        return ": ".join(part for part in self.parts() if part)


class ConfigFileError(ValueError):
    """A config file that cannot be used; carries every problem found, one per line in str()."""

    def __init__(self, file: str, problems: Sequence[Problem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class ConfigFile:
    """A parsed file: its data, the exact bytes parsed, their sha256, and where each key is."""

    name: str
    data: Any
    raw: bytes = field(repr=False)
    sha256: str
    lines: Mapping[KeyPath, int] = field(repr=False, compare=False)

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """The line of the longest known prefix of `loc` (None for the whole file)."""
        path = tuple(loc)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def read_bytes(
    path: str | Path,
    *,
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    error: type[ConfigFileError] = ConfigFileError,
) -> bytes:
    """The file's bytes, read once, refused when over `max_bytes` (before reading, and after)."""
    name = str(path) if name is None else name
    try:
        # O_NONBLOCK: a FIFO put where a config file was expected must not hang the reader.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(name, [Problem(name, FILE_MISSING)]) from None
    except OSError as exc:
        raise error(name, [Problem(name, f"cannot read: {exc.strerror}")]) from None
    try:
        info = os.fstat(fd)  # of the file opened, not of whatever the path names now
        if not stat.S_ISREG(info.st_mode):
            raise error(name, [Problem(name, "cannot read: not a regular file")])
        if info.st_size > max_bytes:
            raise error(name, [_too_big(name, info.st_size, max_bytes)])
        raw = _read_up_to(fd, max_bytes + 1)  # bounded: the file may have grown since fstat
    except OSError as exc:
        raise error(name, [Problem(name, f"cannot read: {exc.strerror}")]) from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise error(name, [_too_big(name, len(raw), max_bytes)])
    return raw


def read_yaml(
    path: str | Path,
    *,
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_nodes: int = DEFAULT_MAX_NODES,
    mapping: bool = True,
    error: type[ConfigFileError] = ConfigFileError,
) -> ConfigFile:
    """Read and parse one YAML file (see `read_bytes` and `parse_yaml`)."""
    name = str(path) if name is None else name
    raw = read_bytes(path, name=name, max_bytes=max_bytes, error=error)
    return parse_yaml(raw, name, max_nodes=max_nodes, mapping=mapping, error=error)


def parse_yaml(
    raw: bytes,
    name: str,
    *,
    max_nodes: int = DEFAULT_MAX_NODES,
    mapping: bool = True,
    error: type[ConfigFileError] = ConfigFileError,
) -> ConfigFile:
    """Parse bytes already read: strict UTF-8, one document, no duplicate keys, bounded aliases.
    With `mapping`, the document must be a mapping (an empty file is an error either way)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(name, [_bad_utf8(name, raw, exc)]) from None
    try:
        loader = _StrictLoader(text)  # its reader rejects non-printable characters here
    except yaml.YAMLError as exc:
        raise error(name, [_yaml_problem(name, text, exc)]) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise error(name, [Problem(name, "file is empty")])
        _check_expansion(name, root, max_nodes, error)
        lines, problems = _walk(name, root, loader)
        if problems:
            raise error(name, problems)
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise error(name, [_yaml_problem(name, text, exc)]) from None
    except RecursionError:
        raise error(name, [Problem(name, "not valid YAML: nested too deeply")]) from None
    finally:
        loader.dispose()
    if mapping and not isinstance(data, dict):
        kind = "null" if data is None else type(data).__name__
        raise error(name, [Problem(name, f"the file must hold a mapping of keys, got {kind}", line=1)])
    return ConfigFile(name, data, raw, hashlib.sha256(raw).hexdigest(), MappingProxyType(lines))


def validation_problems(exc: ValidationError, doc: ConfigFile) -> list[Problem]:
    """pydantic's errors as problems with the field path and its line; input values are never shown."""
    return [
        Problem(doc.name, err["msg"], doc.line_of(err["loc"]), ".".join(str(x) for x in err["loc"]))
        for err in exc.errors(include_input=False, include_url=False, include_context=False)
    ]


def validate(doc: ConfigFile, model: type[M], *, error: type[ConfigFileError] = ConfigFileError) -> M:
    """`doc.data` as `model`, or `error` listing every field that is wrong."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise error(doc.name, validation_problems(exc, doc)) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader; the checks are done on the composed graph in `parse_yaml`, before construction."""


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _too_big(name: str, size: int, limit: int) -> Problem:
    return Problem(name, f"file is {size} bytes or more, over the limit of {limit} bytes")


def _bad_utf8(name: str, raw: bytes, exc: UnicodeDecodeError) -> Problem:
    start = raw.rfind(b"\n", 0, exc.start) + 1
    line = raw.count(b"\n", 0, exc.start) + 1
    column = len(raw[start : exc.start].decode("utf-8")) + 1  # all valid: it precedes the first bad byte
    return Problem(name, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {column}", line)


def _yaml_problem(name: str, text: str, exc: yaml.YAMLError) -> Problem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        return Problem(name, f"not valid YAML: {exc.problem or exc.context or exc}", line)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return Problem(name, f"not valid YAML: character U+{code:04X} is not allowed", line)
    return Problem(name, f"not valid YAML: {exc}")


def _children(node: Node) -> Iterator[Node]:
    if isinstance(node, SequenceNode):
        yield from node.value
    elif isinstance(node, MappingNode):
        for key, value in node.value:
            yield key
            yield value


def _check_expansion(name: str, root: Node, limit: int, error: type[ConfigFileError]) -> None:
    """Count the nodes the document has with every alias expanded, memoised per node, so a
    billion-laughs file fails in microseconds instead of expanding in whoever walks the data."""
    sizes: dict[int, int] = {}
    started: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in _children(node)))
            started.discard(key)
            continue
        if key in sizes:
            continue
        if key in started:
            raise error(name, [Problem(name, "an alias refers to the node that contains it", node.start_mark.line + 1)])
        started.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    if sizes[id(root)] > limit:
        raise error(name, [Problem(name, f"aliases expand to more than {limit} YAML nodes (an alias bomb?)")])


def _walk(name: str, root: Node, loader: _StrictLoader) -> tuple[dict[KeyPath, int], list[Problem]]:
    """Lines of key paths, and duplicate keys; each node is visited once (an alias's path
    ends at the alias). Merged keys (`<<: *x`) never count as duplicates of the mapping's own."""
    lines: dict[KeyPath, int] = {}
    problems: list[Problem] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[KeyPath, Node, bool]] = [((), root, False)]
    while stack:
        path, node, merged = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                _set_line(lines, (*path, i), item.start_mark.line + 1, merged)
                stack.append(((*path, i), item, merged))
        elif isinstance(node, MappingNode):
            first: dict[Any, int] = {}
            for key_node, value in node.value:
                if key_node.tag == _MERGE_TAG:
                    merges = value.value if isinstance(value, SequenceNode) else [value]
                    stack.extend((path, m, True) for m in merges)
                    continue
                if not isinstance(key_node, ScalarNode):
                    continue
                line = key_node.start_mark.line + 1
                key = _key(key_node, loader)
                if key in first:
                    problems.append(
                        Problem(
                            name,
                            f"duplicate key {key_node.value!r}: first at line {first[key]}, again at line {line}",
                            line,
                            ".".join(str(p) for p in (*path, key_node.value)),
                        )
                    )
                first.setdefault(key, line)
                _set_line(lines, (*path, key_node.value), line, merged)
                stack.append(((*path, key_node.value), value, merged))
    return lines, problems


def _set_line(lines: dict[KeyPath, int], path: KeyPath, line: int, merged: bool) -> None:
    if merged:
        lines.setdefault(path, line)
    else:
        lines[path] = line


def _key(node: ScalarNode, loader: _StrictLoader) -> Any:
    """What the key will be once constructed, so `on` and `true` (both True) are one key."""
    if node.tag == _STR_TAG:
        return node.value
    try:
        return (node.tag, loader.construct_object(node))
    except (yaml.YAMLError, TypeError, ValueError):
        return (node.tag, node.value)
