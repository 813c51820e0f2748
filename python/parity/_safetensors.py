"""The safetensors format read and written with the standard library: the one reader of the
package (the rollout server's weight updates, the learner's checkpoints, parity.quant_check's
latents and layouts) and its writer.

A file is an 8-byte little-endian header length, a JSON header {name: {"dtype", "shape",
"data_offsets"}} (and an optional "__metadata__"), then the tensors' bytes; data_offsets count
from the end of the header.
"""
import json
import struct

#: Bytes an element of each safetensors dtype takes.
ELEMENT_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
                 "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
                 "U64": 8, "I64": 8, "F64": 8}

#: The floating-point dtypes a model's weights come in.
FLOAT_DTYPES = ("BF16", "F16", "F32")


class FormatError(ValueError):
    """Bytes that are not a well-formed safetensors file (the message names what and where)."""


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _one_of(names):
    return names[0] if len(names) == 1 else "%s or %s" % (", ".join(names[:-1]), names[-1])


def _header(mv, what):
    """(the header as a dict, its length) of the safetensors bytes in the memoryview mv."""
    if mv.nbytes < 8:
        raise FormatError("%s: not a safetensors file (%d bytes)" % (what, mv.nbytes))
    (hlen,) = struct.unpack("<Q", mv[:8])
    if hlen > mv.nbytes - 8:
        raise FormatError("%s: header length %d beyond the file's %d bytes"
                          % (what, hlen, mv.nbytes))
    try:
        header = json.loads(bytes(mv[8:8 + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: the header is not JSON: %s" % (what, e)) from None
    if not isinstance(header, dict):
        raise FormatError("%s: the header is not a JSON object" % what)
    return header, hlen


def metadata(data, what):
    """The "__metadata__" object of the safetensors bytes `data` ({} when absent): a dict of
    strings, else FormatError."""
    meta = _header(memoryview(data), what)[0].get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError("%s: \"__metadata__\" is not an object of strings" % what)
    return meta


def parse(data, what, dtypes=None):
    """{name: (dtype, shape tuple, memoryview)} of the safetensors bytes `data` (a buffer),
    `what` naming it in errors. dtypes: the dtypes accepted (None: any). Every tensor's offsets
    lie inside the data and, for a dtype of known element size, span exactly its shape.
    Raises FormatError for anything else, and for a file without tensors."""
    mv = memoryview(data)
    header, hlen = _header(mv, what)
    base = 8 + hlen
    size = mv.nbytes - base
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise FormatError("%s: tensor %s: not an object" % (what, name))
        dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtypes is not None and dtype not in dtypes:
            raise FormatError("%s: tensor %s: dtype %s (%s only)"
                              % (what, name, json.dumps(dtype), _one_of(dtypes)))
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise FormatError("%s: tensor %s: bad shape %s" % (what, name, json.dumps(shape)))
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs) \
                or not 0 <= offs[0] <= offs[1] <= size:
            raise FormatError("%s: tensor %s: data_offsets %s outside the %d data bytes"
                              % (what, name, json.dumps(offs), size))
        count = 1
        for d in shape:
            count *= d
        if dtype in ELEMENT_BYTES and offs[1] - offs[0] != count * ELEMENT_BYTES[dtype]:
            raise FormatError("%s: tensor %s: %d bytes for shape %s of %s"
                              % (what, name, offs[1] - offs[0], shape, dtype))
        out[name] = (dtype, tuple(shape), mv[base + offs[0]:base + offs[1]])
    if not out:
        raise FormatError("%s: no tensors" % what)
    return out


def read(path, dtypes=None):
    """parse() of the file at `path` (named by its path in errors); OSError if unreadable."""
    with open(path, "rb") as f:
        data = f.read()
    return parse(data, path, dtypes)


def write(path, tensors, metadata=None):
    """Writes [(name, dtype, shape, raw bytes)] as a safetensors file (data 8-byte aligned),
    with the __metadata__ {str: str} given (default {"format": "pt"})."""
    header, offset = {"__metadata__": dict(metadata or {"format": "pt"})}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)
