"""Group configs as the Go library `pcgroups` stores them in the KV buckets.

Go members compare parts of a stored config with deep equality (where `null` differs from `[]`)
and stop on a difference, so a value read here and written back must come out as stored. Each
value therefore keeps the JSON object it was read from: a field still equal to what was read is
written back with the stored JSON value, and only changed fields are encoded from the Python
values. Both are written the way Go's `json.Marshal` writes (compact, struct field order,
`omitempty`, HTML-safe escaping), so a value Go wrote comes back byte for byte.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from nats_spark.errors import ConfigurationError

MAX_NAME_BYTES = 255
"""nats-server's limit (JSMaxNameLen) for consumer names, which member names become."""

# nats-server refuses consumer names holding any of these: its whitespace set, the subject
# token separator and wildcards, and path separators (names become directory names).
_BAD_NAME_CHARS = frozenset(" \t\r\n\f.*>/\\")
_NAME_RULE = "use 1 to 255 bytes without whitespace, '.', '*', '>', '/' or '\\'"

# Go's encoder escapes these inside strings, where everything else non-ASCII stays UTF-8.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_INTEGER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")


class GroupConfigError(ConfigurationError):
    """A group config that is not valid JSON for its kind, or that breaks a rule of the group.

    `detail` follows the name of the config (`where`), which a caller that knows where the config
    is stored can put in with `at`, so the message names the config once."""

    def __init__(self, detail: str, where: str = "group config") -> None:
        self.detail = detail
        super().__init__(f"{where} {detail}")

    def at(self, where: str) -> GroupConfigError:
        """The same error about the config named `where`."""
        return GroupConfigError(self.detail, where)


def _invalid(problem: str, fix: str) -> GroupConfigError:
    return GroupConfigError(f"is invalid: {problem}; {fix}")


# --- JSON in and out -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Number:
    """A JSON number kept as written, so that numbers in unknown fields come back unchanged."""

    text: str


class _ShapeError(ValueError):
    """A JSON value whose type does not fit the Go field it belongs to."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _describe(value: Any) -> str:
    if isinstance(value, _Number):
        return f"number {value.text}"
    kinds = {str: "a string", bool: "a boolean", list: "an array", dict: "an object"}
    return "null" if value is None else kinds[type(value)]


def _encode(value: Any) -> str:
    """Compact JSON of a parsed or built value, escaped the way Go's `json.Marshal` does."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_encode(k)}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    if isinstance(value, str):
        # `<`, `>`, `&` and U+2028/9 only ever occur inside strings, so translating is safe.
        return json.dumps(value, ensure_ascii=False).translate(_GO_ESCAPES)
    if isinstance(value, _Number):
        return value.text
    return json.dumps(value)  # int, bool or None


Decoder = Callable[[Any, str], Any]
"""Turns a parsed JSON value (None for null or absent) at a path into the field's Python value."""


def _integer(low: int, high: int, kind: str) -> Decoder:
    def decode(value: Any, path: str) -> int:
        if value is None:
            return 0  # Go leaves the zero value for null or a missing field
        if not (isinstance(value, _Number) and _INTEGER_TEXT.fullmatch(value.text)):
            raise _ShapeError(f"field {path!r} must be {kind}, got {_describe(value)}")
        number = int(value.text)
        if not low <= number <= high:
            raise _ShapeError(f"field {path!r} must be {kind}, got {number}")
        return number

    return decode


_uint = _integer(0, 2**64 - 1, "a non-negative integer")
_int = _integer(-(2**63), 2**63 - 1, "an integer")


def _string(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _ShapeError(f"field {path!r} must be a string, got {_describe(value)}")
    return value


def _list_of(item: Decoder, *, nullable: bool = False) -> Decoder:
    """A JSON array; `nullable` keeps null apart from `[]` as None, where Go tells them apart."""

    def decode(value: Any, path: str) -> list[Any] | None:
        if value is None:
            return None if nullable else []
        if not isinstance(value, list):
            raise _ShapeError(f"field {path!r} must be an array, got {_describe(value)}")
        return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]

    return decode


def _object_of(cls: type[_WireObject]) -> Decoder:
    def decode(value: Any, path: str) -> _WireObject:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise _ShapeError(f"field {path!r} must be an object, got {_describe(value)}")
        return cls._from_wire(value, path)

    return decode


@dataclass(frozen=True)
class _Field:
    key: str  # the JSON name
    decode: Decoder
    omitempty: bool = False
    attr: str = ""  # the Python attribute, when it differs from the JSON name

    @property
    def attribute(self) -> str:
        return self.attr or self.key


def _wire_value(value: Any) -> Any:
    if isinstance(value, _WireObject):
        return value._to_wire()
    if isinstance(value, list | tuple):
        return [_wire_value(v) for v in value]
    return value


@dataclass
class _WireObject:
    """A Go struct's JSON object, read and written with the round-trip rule of this module."""

    _FIELDS: ClassVar[tuple[_Field, ...]] = ()

    # The JSON object this value was read from; None when it was built in code.
    _stored: dict[str, Any] | None = field(default=None, repr=False, compare=False, kw_only=True)

    @classmethod
    def _from_wire(cls, obj: dict[str, Any], path: str) -> Self:
        values = {
            f.attribute: f.decode(obj.get(f.key), f"{path}.{f.key}" if path else f.key)
            for f in cls._FIELDS
        }
        return cls(**values, _stored=obj)

    def _to_wire(self) -> dict[str, Any]:
        stored = self._stored
        out: dict[str, Any] = {}
        for f in self._FIELDS:
            value = getattr(self, f.attribute)
            if stored is not None and value == f.decode(stored.get(f.key), f.key):
                if f.key in stored:  # unchanged: as stored, even if Go would write it otherwise
                    out[f.key] = stored[f.key]
            elif not (f.omitempty and not value):
                out[f.key] = _wire_value(value)
        if stored:
            # Fields unknown here (from a newer writer) survive a rewrite, after the known ones;
            # Go would drop them, but keeping them loses nothing another reader may rely on.
            known = {f.key for f in self._FIELDS}
            out.update((k, v) for k, v in stored.items() if k not in known)
        return out


# --- The stored values -----------------------------------------------------------------------


@dataclass
class MemberMapping(_WireObject):
    """The partitions given to one member explicitly (instead of spreading them over a list)."""

    member: str
    partitions: list[int]

    _FIELDS = (_Field("member", _string), _Field("partitions", _list_of(_int)))


@dataclass
class PartitioningFilter(_WireObject):
    """An elastic group's subject filter and which of its `*` tokens (from 1) pick the partition.

    No wildcard indexes (None, stored as JSON null, or empty) hash the whole subject.
    """

    filter: str
    partitioning_wildcards: list[int] | None = None

    _FIELDS = (
        _Field("filter", _string),
        _Field("partitioning_wildcards", _list_of(_int, nullable=True)),
    )


_MEMBERS = _Field("members", _list_of(_string), omitempty=True)
_MEMBER_MAPPINGS = _Field("member_mappings", _list_of(_object_of(MemberMapping)), omitempty=True)


def _check_member_name(name: str) -> None:
    if not name:
        problem = "is empty"
    elif not _BAD_NAME_CHARS.isdisjoint(name):
        problem = "contains whitespace, '.', '*', '>', '/' or '\\'"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        problem = f"is longer than {MAX_NAME_BYTES} bytes"
    else:
        return
    raise _invalid(
        f"member name {name!r} {problem}", f"member names become consumer names: {_NAME_RULE}"
    )


def _name_list(names: Iterable[str]) -> list[str]:
    if isinstance(names, str):  # a lone name would otherwise be taken letter by letter
        raise TypeError(f"give member names as a list, e.g. [{names!r}], not a single string")
    return list(names)


class _GroupConfig(_WireObject):
    """What static and elastic configs share: JSON in and out, membership and its rules."""

    max_members: int
    members: list[str]
    member_mappings: list[MemberMapping]

    @classmethod
    def from_json(cls, data: bytes | str, key: str | None = None) -> Self:
        """Read a stored value; `key` (`<stream>.<group>`) only names it in errors."""
        where = f"group config for {key}" if key else "group config"
        fix = "rewrite the KV entry with a valid config, or delete and recreate the group"
        try:
            text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
            obj = json.loads(
                text, parse_int=_Number, parse_float=_Number, parse_constant=_reject_constant
            )
        except ValueError as e:  # also JSONDecodeError and UnicodeDecodeError
            raise GroupConfigError(f"is not valid JSON: {e}; {fix}", where) from e
        try:
            if not isinstance(obj, dict):
                raise _ShapeError(f"expected an object, got {_describe(obj)}")
            return cls._from_wire(obj, "")
        except _ShapeError as e:
            raise GroupConfigError(f"is JSON of the wrong shape: {e}; {fix}", where) from e

    def to_json(self) -> bytes:
        """The value to store: as read where unchanged, as Go's `json.Marshal` writes elsewhere."""
        return _encode(self._to_wire()).encode("utf-8")

    def validate(self) -> None:
        """Raise GroupConfigError unless Go members (and ours) would accept this config."""
        if self.max_members < 1:
            raise _invalid(
                f"max_members is {self.max_members}",
                "set max_members (the number of partitions) to 1 or more",
            )
        if self.members and self.member_mappings:
            raise _invalid(
                "both members and member_mappings are set",
                "use either a member list or explicit mappings, not both",
            )
        for name in self.members:
            _check_member_name(name)
        if self.member_mappings:  # none means the balanced spread over `members`
            self._check_mappings()

    def _check_mappings(self) -> None:
        partitions = self.max_members
        if len(self.member_mappings) > partitions:
            raise _invalid(
                f"{len(self.member_mappings)} member_mappings for max_members {partitions}",
                "map at most max_members members",
            )
        owners: dict[int, str] = {}
        seen: set[str] = set()
        for mapping in self.member_mappings:
            _check_member_name(mapping.member)
            if mapping.member in seen:
                raise _invalid(
                    f"member {mapping.member!r} listed twice in member_mappings",
                    "list each member once",
                )
            seen.add(mapping.member)
            for p in mapping.partitions:
                if not 0 <= p < partitions:
                    raise _invalid(
                        f"member {mapping.member!r} is mapped to partition {p}",
                        f"use partitions 0 to {partitions - 1} (max_members is {partitions})",
                    )
                if p in owners:
                    raise _invalid(
                        f"partition {p} is mapped to both {owners[p]!r} and {mapping.member!r}",
                        "map each partition to exactly one member",
                    )
                owners[p] = mapping.member
        if len(owners) < partitions:
            # Only the first few: max_members can be large, and the owners are at most a few.
            unmapped = itertools.islice((p for p in range(partitions) if p not in owners), 3)
            raise _invalid(
                f"{partitions - len(owners)} of {partitions} partitions are not mapped to a "
                f"member (first: {', '.join(map(str, unmapped))})",
                f"map every partition from 0 to {partitions - 1} exactly once",
            )

    # Membership changes. Each returns a validated copy whose JSON differs from this one's only
    # in the fields that changed. Go static members stop on any change of their group's value.

    def with_members_added(self, names: Iterable[str]) -> Self:
        """Existing members in their order, then the new names in the order given, once each."""
        self._require_member_list("add members to")
        members = list(self.members)
        for name in _name_list(names):
            if name not in members:
                members.append(name)
        return self._changed(members=members)

    def with_members_dropped(self, names: Iterable[str]) -> Self:
        """The member list without `names`; names that are not members are ignored."""
        self._require_member_list("drop members from")
        dropped = set(_name_list(names))
        return self._changed(members=[m for m in self.members if m not in dropped])

    def with_mappings(self, mappings: Iterable[MemberMapping]) -> Self:
        """Explicit mappings in place of the member list (which is cleared, as Go does)."""
        mappings = list(mappings)
        if not mappings:
            raise _invalid(
                "no member mappings given",
                "give at least one mapping, or call without_mappings() to drop them",
            )
        return self._changed(members=[], member_mappings=mappings)

    def without_mappings(self) -> Self:
        """The config without explicit mappings, ready for members to be added as a list."""
        return self._changed(member_mappings=[])

    def _require_member_list(self, action: str) -> None:
        if self.member_mappings:
            raise _invalid(
                f"cannot {action} a group that uses member_mappings",
                "change the mappings with with_mappings(), or call without_mappings() first",
            )

    def _changed(self, **changes: Any) -> Self:
        new = copy.deepcopy(self)
        for name, value in changes.items():
            setattr(new, name, value)
        new.validate()
        return new


@dataclass
class StaticConfig(_GroupConfig):
    """A static group (KV bucket `static-consumer-groups`): fixed membership, fixed partitions.

    The stream must already store `<partition>.<subject>`; `filters` narrow what members get.
    """

    max_members: int
    filters: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    member_mappings: list[MemberMapping] = field(default_factory=list)

    _FIELDS = (
        _Field("max_members", _uint),
        _Field("filters", _list_of(_string), omitempty=True),
        _MEMBERS,
        _MEMBER_MAPPINGS,
    )


@dataclass
class ElasticConfig(_GroupConfig):
    """An elastic group (KV bucket `elastic-consumer-groups`): membership may change.

    Members consume from a work-queue stream `<stream>-<group>` that sources the stream through
    the partitioning filters. `partitioning_filters` None is stored as JSON null (Go's nil).
    """

    max_members: int
    partitioning_filters: list[PartitioningFilter] | None = None
    max_buffered_msgs: int = 0
    max_buffered_bytes: int = 0
    members: list[str] = field(default_factory=list)
    member_mappings: list[MemberMapping] = field(default_factory=list)

    _FIELDS = (
        _Field("max_members", _uint),
        _Field("partitioning_filters", _list_of(_object_of(PartitioningFilter), nullable=True)),
        _Field("max_buffered_msg", _int, omitempty=True, attr="max_buffered_msgs"),
        _Field("max_buffered_bytes", _int, omitempty=True),
        _MEMBERS,
        _MEMBER_MAPPINGS,
    )

    def validate(self) -> None:
        super().validate()
        for pf in self.partitioning_filters or ():
            _check_partitioning_filter(pf)


def _check_partitioning_filter(pf: PartitioningFilter) -> None:
    if not pf.filter:
        raise _invalid("a partitioning filter is empty", "give a subject filter such as 'orders.*'")
    tokens = pf.filter.split(".")
    stars = tokens.count("*")
    if not stars and tokens[-1] != ">":
        raise _invalid(
            f"partitioning filter {pf.filter!r} has no '*' token and does not end in '>'",
            "add a '*' token to partition on, or end the filter with '>'",
        )
    seen: set[int] = set()
    for index in pf.partitioning_wildcards or ():
        if index in seen:
            raise _invalid(
                f"wildcard index {index} is listed twice for filter {pf.filter!r}",
                "list each wildcard index once",
            )
        seen.add(index)
        if not 1 <= index <= stars:
            fix = (
                f"use indexes 1 to {stars}, counting the filter's '*' tokens from 1"
                if stars
                else "leave partitioning_wildcards empty to hash the whole subject"
            )
            raise _invalid(f"wildcard index {index} does not fit filter {pf.filter!r}", fix)
