"""The scheduler's state as a JSON document, and back: a generic object-graph codec.

The live scheduler snapshots its whole state (the core and the tables around it) without
pickle, so a snapshot is readable by any code version that has the same classes and fields.
The codec walks objects by introspection (dataclass fields, `__slots__`, `__dict__`), so a
field added to a core class is carried without listing it here. It keeps identity: the core
shares objects (a `Lease` sits in `_leases`, `_preempting` and `_running`; the victim selector
holds the quota book and the node pool), and a copy per reference would split one object into
several after a restore. Every mutable object is written once with an id (`"#"`) and referred
to after (`"@"`). Sets are written sorted, so two equal states give equal documents whatever
the hash seed.

Only classes under `switchyard.` are restored (a snapshot names classes by import path).
A dataclass field the snapshot lacks takes its default; one without a default fails, naming
the class and field (the snapshot is from an incompatible version).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import deque
from enum import Enum
from typing import Any

from pydantic import BaseModel

TRUSTED_PREFIX = "switchyard."


class StateCodecError(ValueError):
    """A state that cannot be written, or a document that cannot be read back."""


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _load_class(path: str) -> type:
    module, _, qualname = path.partition(":")
    if not module.startswith(TRUSTED_PREFIX):
        raise StateCodecError(f"snapshot names class {path!r}, outside {TRUSTED_PREFIX}*")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise StateCodecError(f"snapshot names class {path!r}, which this code version lacks") from exc
    if not isinstance(found, type):
        raise StateCodecError(f"snapshot names {path!r}, which is not a class")
    return found


def _attributes(obj: object) -> dict[str, Any]:
    found = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found[name] = getattr(obj, name)
    return found


class _Encoder:
    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._alive: list[object] = []  # ids are only unique while the objects live

    def _memo(self, obj: object) -> int | None:
        """The id of an object written already, or None after giving it a new one."""
        key = id(obj)
        if key in self._ids:
            return self._ids[key]
        self._ids[key] = len(self._ids)
        self._alive.append(obj)
        return None

    def encode(self, obj: Any) -> Any:
        if obj is None or (isinstance(obj, bool | int | float | str) and not isinstance(obj, Enum)):
            return obj
        if isinstance(obj, Enum):
            return {"t": "enum", "c": class_path(type(obj)), "v": obj.value}
        if isinstance(obj, tuple):
            return {"t": "tuple", "v": [self.encode(v) for v in obj]}
        if isinstance(obj, frozenset):
            return {"t": "frozenset", "v": [self.encode(v) for v in sorted(obj, key=repr)]}
        if isinstance(obj, BaseModel):
            return {"t": "model", "c": class_path(type(obj)), "v": obj.model_dump(mode="json")}
        seen = self._memo(obj)
        if seen is not None:
            return {"@": seen}
        number = self._ids[id(obj)]
        kind = type(obj)
        if kind is list:
            return {"t": "list", "#": number, "v": [self.encode(v) for v in obj]}
        if kind is dict:
            return {"t": "dict", "#": number, "v": [[self.encode(k), self.encode(v)] for k, v in obj.items()]}
        if kind is set:
            return {"t": "set", "#": number, "v": [self.encode(v) for v in sorted(obj, key=repr)]}
        if kind is deque:
            return {"t": "deque", "#": number, "v": [self.encode(v) for v in obj], "max": obj.maxlen}
        if callable(obj) or kind.__module__ in ("builtins", "collections"):
            raise StateCodecError(f"cannot snapshot a {kind.__qualname__}")
        fields = {}
        for name, value in _attributes(obj).items():
            try:
                fields[name] = self.encode(value)
            except StateCodecError as exc:  # named from the outside in: Scheduler._pool._nodes: ...
                raise StateCodecError(f"{kind.__qualname__}.{name}: {exc}") from None
        return {"t": "obj", "c": class_path(kind), "#": number, "v": fields}


class _Decoder:
    def __init__(self) -> None:
        self._objects: dict[int, Any] = {}

    def decode(self, doc: Any) -> Any:
        if not isinstance(doc, dict):
            return doc
        if "@" in doc:
            try:
                return self._objects[doc["@"]]
            except KeyError:
                raise StateCodecError(f"snapshot refers to object {doc['@']} before it is written") from None
        tag = doc.get("t")
        value: Any = doc.get("v")
        if tag == "tuple":
            return tuple(self.decode(v) for v in value)
        if tag == "frozenset":
            return frozenset(self.decode(v) for v in value)
        if tag == "enum":
            return _load_class(doc["c"])(value)
        if tag == "model":
            model = _load_class(doc["c"])
            if not issubclass(model, BaseModel):
                raise StateCodecError(f"snapshot names {doc['c']!r} as a model; it is not one")
            return model.model_validate(value)
        if tag == "list":
            items: list[Any] = self._keep(doc, [])
            items.extend(self.decode(v) for v in value)
            return items
        if tag == "set":
            members: set[Any] = self._keep(doc, set())
            members.update(self.decode(v) for v in value)
            return members
        if tag == "deque":
            queue: deque[Any] = self._keep(doc, deque(maxlen=doc["max"]))
            queue.extend(self.decode(v) for v in value)
            return queue
        if tag == "dict":
            table: dict[Any, Any] = self._keep(doc, {})
            for k, v in value:
                table[self.decode(k)] = self.decode(v)
            return table
        if tag == "obj":
            return self._object(doc)
        raise StateCodecError(f"snapshot holds an unknown entry {str(doc)[:80]!r}")

    def _keep(self, doc: dict[str, Any], obj: Any) -> Any:
        self._objects[doc["#"]] = obj  # before its contents: they may refer back to it
        return obj

    def _object(self, doc: dict[str, Any]) -> Any:
        cls: Any = _load_class(doc["c"])
        obj = self._keep(doc, cls.__new__(cls))
        values = doc["v"]
        for name, v in values.items():
            object.__setattr__(obj, name, self.decode(v))  # frozen dataclasses too
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.name in values:
                    continue
                if f.default is not dataclasses.MISSING:
                    object.__setattr__(obj, f.name, f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    object.__setattr__(obj, f.name, f.default_factory())
                else:
                    raise StateCodecError(f"snapshot has no value for {doc['c']}.{f.name}, which has no default")
        return obj


def encode_state(root: Any) -> Any:
    """`root` as a JSON-ready value (dicts, lists, strings, numbers)."""
    return _Encoder().encode(root)


def decode_state(doc: Any) -> Any:
    try:
        return _Decoder().decode(doc)
    except (KeyError, TypeError) as exc:
        raise StateCodecError(f"snapshot is malformed: {type(exc).__name__}: {exc}") from exc


def forget_ended_workloads(core: Any, workload_ids: set[str]) -> None:
    """Drop the core's per-workload counters (attempts, notices received) of workloads that are
    neither queued nor leased: without it they grow with every workload ever submitted.
    (Private state of `Scheduler`, kept here with the other code that reads its internals.)"""
    active = {p.request.workload_id for p in core.pending()} | set(core._lease_of)
    for workload in workload_ids - active:
        core._attempts.pop(workload, None)
        core._preemptions.pop(workload, None)
