"""Describing numpy dtypes as plain msgpack values, and reading them back safely.

A description is built only from strings, integers, lists and maps, and is
read back by checking it against a fixed grammar before numpy sees it: no
pickle, no eval, no dtype that can hold Python objects. Descriptions:

- a string such as ``"<f4"``, ``">i8"``, ``"|b1"``, ``"<M8[ns]"``, ``"<U7"`` or
  ``"|V16"`` (numpy's ``dtype.str``) for a dtype without fields;
- ``{"fields": [[name, description, offset], ...], "itemsize": n,
  "aligned": bool}`` for a structured dtype (a field entry may carry a string
  title as a fourth item);
- ``{"base": description, "shape": [d0, d1, ...]}`` for a sub-array field.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from feedmux.errors import ProtocolError

__all__ = ["MAX_NDIM", "describe_dtype", "dtype_from_description", "shape_from_description"]

#: The most dimensions an array (or a sub-array field) may declare on the wire.
MAX_NDIM = 32
# Nesting of structured dtypes inside each other on the wire.
_MAX_DTYPE_DEPTH = 16
# A dtype or a declared shape may not describe more than this many bytes per item.
_MAX_ITEMSIZE = 2**31

_SIMPLE_DTYPE = re.compile(r"[<>|=](?:[biufcSUV][0-9]{1,9}|[mM]8(?:\[[0-9]{0,9}[A-Za-z]{1,2}\])?)")
_SIMPLE_KINDS = frozenset("biufcmMSUV")

_describe_cache: dict[np.dtype[Any], str | dict[str, Any]] = {}
_parse_cache: dict[str, np.dtype[Any]] = {}


class UnsupportedDtypeError(ProtocolError):
    """A dtype that cannot travel (object fields, variable-width strings, ...)."""


def describe_dtype(dtype: np.dtype[Any]) -> str | dict[str, Any]:
    """Return the wire description of ``dtype``.

    Raises :class:`UnsupportedDtypeError` for a dtype that holds Python objects
    (anywhere, also inside structured fields) or has no fixed-size raw layout.

    Examples
    --------
    >>> import numpy as np
    >>> describe_dtype(np.dtype(">i4"))
    '>i4'
    >>> describe_dtype(np.dtype([("a", "<u2"), ("b", "<f8", (2,))]))["fields"][1]
    ['b', {'base': '<f8', 'shape': [2]}, 2]
    """
    try:
        return _describe_cache[dtype]
    except KeyError:
        pass
    description = _describe(dtype)
    if len(_describe_cache) > 4096:
        _describe_cache.clear()
    _describe_cache[dtype] = description
    return description


def _describe(dtype: np.dtype[Any]) -> str | dict[str, Any]:
    if dtype.hasobject:
        raise UnsupportedDtypeError(f"dtype {dtype} holds Python objects, which never travel")
    if dtype.names is not None:
        fields: list[list[Any]] = []
        assert dtype.fields is not None
        for name in dtype.names:
            field_dtype, offset, *title = dtype.fields[name]
            entry: list[Any] = [name, _describe(field_dtype), offset]
            if title and title[0] is not None:
                if not isinstance(title[0], str):
                    raise UnsupportedDtypeError(
                        f"field {name!r} of dtype {dtype} has a title of type "
                        f"{type(title[0]).__name__}; only str titles travel"
                    )
                entry.append(title[0])
            fields.append(entry)
        return {"fields": fields, "itemsize": dtype.itemsize, "aligned": dtype.isalignedstruct}
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return {"base": _describe(base), "shape": list(shape)}
    text: str = dtype.str
    if dtype.kind in _SIMPLE_KINDS and _SIMPLE_DTYPE.fullmatch(text):
        return text
    raise UnsupportedDtypeError(f"dtype {dtype} has no fixed-size raw layout and cannot travel")


def dtype_from_description(description: Any) -> np.dtype[Any]:
    """Read back a description made by :func:`describe_dtype`; any other value raises.

    Examples
    --------
    >>> dtype_from_description("<M8[ms]")
    dtype('<M8[ms]')
    >>> dtype_from_description("|O8")
    Traceback (most recent call last):
    ...
    feedmux.errors.ProtocolError: invalid dtype description '|O8'
    """
    if type(description) is str:
        cached = _parse_cache.get(description)
        if cached is not None:
            return cached
    dtype = _parse(description, 0)
    if dtype.hasobject or dtype.itemsize > _MAX_ITEMSIZE:
        raise ProtocolError(f"invalid dtype description {description!r}")
    if type(description) is str:
        if len(_parse_cache) > 4096:
            _parse_cache.clear()
        _parse_cache[description] = dtype
    return dtype


def _parse(description: Any, depth: int) -> np.dtype[Any]:
    if depth > _MAX_DTYPE_DEPTH:
        raise ProtocolError("dtype description nested too deeply")
    if type(description) is str:
        if not _SIMPLE_DTYPE.fullmatch(description):
            raise ProtocolError(f"invalid dtype description {description!r}")
        try:
            return np.dtype(description)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid dtype description {description!r}: {exc}") from None
    if type(description) is not dict:
        raise ProtocolError(f"invalid dtype description of type {type(description).__name__}")
    if "fields" in description:
        return _parse_structured(description, depth)
    if "base" in description:
        base = _parse(description["base"], depth + 1)
        shape = shape_from_description(description.get("shape"))
        if math.prod(shape) * base.itemsize > _MAX_ITEMSIZE:
            raise ProtocolError("sub-array field too large")
        try:
            return np.dtype((base, shape))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"invalid sub-array dtype description: {exc}") from None
    raise ProtocolError("invalid dtype description: a map needs 'fields' or 'base'")


def _parse_structured(description: dict[Any, Any], depth: int) -> np.dtype[Any]:
    fields = description["fields"]
    itemsize = description.get("itemsize")
    aligned = description.get("aligned", False)
    if type(fields) is not list or type(itemsize) is not int or type(aligned) is not bool:
        raise ProtocolError("invalid structured dtype description")
    if not 0 <= itemsize <= _MAX_ITEMSIZE:
        raise ProtocolError(f"invalid structured dtype itemsize {itemsize}")
    names: list[str] = []
    formats: list[np.dtype[Any]] = []
    offsets: list[int] = []
    titles: list[str | None] = []
    for entry in fields:
        if type(entry) is not list or len(entry) not in (3, 4):
            raise ProtocolError("invalid structured dtype field entry")
        name, field_description, offset = entry[:3]
        title = entry[3] if len(entry) == 4 else None
        if type(name) is not str or type(offset) is not int or not 0 <= offset <= itemsize:
            raise ProtocolError("invalid structured dtype field entry")
        if title is not None and type(title) is not str:
            raise ProtocolError("invalid structured dtype field title")
        names.append(name)
        formats.append(_parse(field_description, depth + 1))
        offsets.append(offset)
        titles.append(title)
    spec: dict[str, Any] = {
        "names": names,
        "formats": formats,
        "offsets": offsets,
        "itemsize": itemsize,
    }
    if any(title is not None for title in titles):
        spec["titles"] = titles
    try:
        dtype: np.dtype[Any] = np.dtype(spec, align=aligned)  # type: ignore[call-overload]
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"invalid structured dtype description: {exc}") from None
    return dtype


def shape_from_description(shape: Any) -> tuple[int, ...]:
    """Check a shape read from the wire: a list of at most 32 non-negative ints.

    Examples
    --------
    >>> shape_from_description([3, 0, 2])
    (3, 0, 2)
    """
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise ProtocolError(f"invalid array shape {shape!r}")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise ProtocolError(f"invalid array shape {shape!r}")
    return tuple(shape)
