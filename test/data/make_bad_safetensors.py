#!/usr/bin/env python3
"""Writes the safetensors test corpus into test/data/bad-safetensors/.

One small file per rule of the format (and a few variants per rule), named
`<case>.<STATUS>.safetensors`: STATUS is the expected parity status without its
`PARITY_ERR_` prefix (e.g. ST_OFFSETS), or OK for files that must load. test_safetensors.c
opens each file and checks the status against its name.

Standard library only: python3 test/data/make_bad_safetensors.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bad-safetensors")


def image(header, data=b"", length=None):
    """A file image: 8-byte little-endian header length, header bytes, data.

    `header` is a dict (serialised compactly), a str or bytes (written as given).
    `length` overrides the header length field."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def cases():
    """(case name, status, file bytes) for every file of the corpus."""
    one = {"x": t("F32", [2], 0, 8)}  # a valid header, for the header-length cases
    c = []

    # ---- header length ----
    c += [
        ("file_empty", "ST_HEADER_LENGTH", b""),
        ("file_3_bytes", "ST_HEADER_LENGTH", b"\x02\x00\x00"),
        ("file_7_bytes", "ST_HEADER_LENGTH", b"\x02\x00\x00\x00\x00\x00\x00"),
        ("header_length_zero", "ST_HEADER_LENGTH", image(b"", b"{}")),
        ("header_length_zero_only_field", "ST_HEADER_LENGTH", b"\x00" * 8),
        ("header_length_over_100MB", "ST_HEADER_LENGTH",
         image(one, f32(1, 2), length=100_000_001)),
        ("header_length_max_u64", "ST_HEADER_LENGTH", image(one, f32(1, 2), length=2**64 - 1)),
        ("header_length_past_eof", "ST_HEADER_LENGTH", image("{}", length=100)),
        ("header_length_past_eof_by_one", "ST_HEADER_LENGTH",
         image(json.dumps(one), length=len(json.dumps(one)) + 1)),
    ]

    # ---- header UTF-8 ----
    def name_bytes(raw):
        return b'{"' + raw + b'":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'

    c += [
        ("utf8_invalid_byte_ff", "ST_HEADER_UTF8", image(name_bytes(b"a\xffb"))),
        ("utf8_overlong_slash", "ST_HEADER_UTF8", image(name_bytes(b"\xc0\xaf"))),
        ("utf8_overlong_3_bytes", "ST_HEADER_UTF8", image(name_bytes(b"\xe0\x80\xaf"))),
        ("utf8_surrogate_d800", "ST_HEADER_UTF8", image(name_bytes(b"\xed\xa0\x80"))),
        ("utf8_above_10ffff", "ST_HEADER_UTF8", image(name_bytes(b"\xf4\x90\x80\x80"))),
        ("utf8_lone_continuation", "ST_HEADER_UTF8", image(name_bytes(b"\x80"))),
        ("utf8_truncated_at_end", "ST_HEADER_UTF8", image(b'{"a":1}   \xe2\x82')),
        ("utf8_in_metadata_value", "ST_HEADER_UTF8",
         image(b'{"__metadata__":{"k":"\xfe"}}')),
        # UTF-8 is checked before the '{' rule, as the reference does
        ("utf8_checked_before_brace", "ST_HEADER_UTF8", image(b"\xff{}")),
    ]

    # ---- header JSON structure ----
    J = "ST_HEADER_JSON"
    entry = lambda body: image('{"x":' + body + "}")  # noqa: E731

    def fields(dtype='"F32"', shape="[1]", offsets="[0,4]"):
        """The entry of these JSON texts of its three fields (the others: a valid F32[1])."""
        return entry('{"dtype":%s,"shape":%s,"data_offsets":%s}' % (dtype, shape, offsets))

    c += [
        ("header_leading_space", J, image(" {}")),
        ("header_not_brace", J, image("null")),
        ("header_json_array", J, image('[{"dtype":"F32","shape":[],"data_offsets":[0,4]}]',
                                         f32(1))),
        ("header_not_json", J, image("{this is not json}")),
        ("header_unterminated", J, image('{"x":{"dtype":"F32"')),
        ("header_trailing_comma", J, image('{"x":{"dtype":"U8","shape":[],"data_offsets":[0,1]},}',
                                             b"\x00")),
        ("header_trailing_garbage", J, image("{}x")),
        ("header_nul_padding", J, image(b"{}\x00\x00")),
        ("header_single_quotes", J, image("{'x':1}")),
        ("entry_not_object", J, entry("5")),
        ("entry_missing_dtype", J, entry('{"shape":[1],"data_offsets":[0,4]}')),
        ("entry_missing_shape", J, entry('{"dtype":"F32","data_offsets":[0,4]}')),
        ("entry_missing_data_offsets", J, entry('{"dtype":"F32","shape":[1]}')),
        ("entry_extra_key", J,
         entry('{"dtype":"F32","shape":[1],"data_offsets":[0,4],"offset":0}')),
        ("entry_key_twice", J,
         entry('{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}')),
        ("dtype_not_string", J, fields(dtype="7")),
        ("shape_not_array", J, fields(shape="4")),
        ("shape_negative", J, fields(shape="[-1]")),
        ("shape_float", J, fields(shape="[1.0]")),
        ("shape_exponent", J, fields(shape="[1e0]")),
        ("shape_string", J, fields(shape='["1"]')),
        ("shape_null", J, fields(shape="[null]")),
        ("shape_above_i64", J, fields(dtype='"U8"', shape="[18446744073709551616]")),
        ("shape_9_dims", J, fields(dtype='"U8"', shape="[1,1,1,1,1,1,1,1,1]", offsets="[0,1]")),
        ("offsets_3_entries", J, fields(offsets="[0,4,8]")),
        ("offsets_1_entry", J, fields(offsets="[4]")),
        ("offsets_not_array", J, fields(offsets='"0-4"')),
        ("offsets_negative", J, fields(offsets="[-4,0]")),
        ("offsets_float", J, fields(offsets="[0,4.0]")),
        ("metadata_non_string_value", J,
         image({"__metadata__": {"format": "pt", "version": 2}, **one}, f32(1, 2))),
        ("metadata_nested_object", J,
         image({"__metadata__": {"a": {"b": "c"}}, **one}, f32(1, 2))),
        ("metadata_not_object", J, image({"__metadata__": "pt", **one}, f32(1, 2))),
    ]

    # ---- dtype ----
    D = "ST_DTYPE"
    c += [
        ("dtype_unknown_BF17", D, image({"x": t("BF17", [1], 0, 2)}, b"\0\0")),
        ("dtype_lowercase_bf16", D, image({"x": t("bf16", [1], 0, 2)}, b"\0\0")),
        ("dtype_empty", D, image({"x": t("", [1], 0, 2)}, b"\0\0")),
        ("dtype_F4_not_supported", D, image({"x": t("F4", [2], 0, 1)}, b"\0")),
    ]

    # ---- offsets ----
    O = "ST_OFFSETS"
    c += [
        ("offsets_not_starting_at_0", O, image({"x": t("F32", [1], 4, 8)}, bytes(8))),
        ("offsets_gap", O, image({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)},
                                 bytes(12))),
        ("offsets_overlap", O, image({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 4, 8)},
                                     bytes(8))),
        ("offsets_same_range_twice", O,
         image({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 0, 4)}, bytes(4))),
        ("offsets_end_before_begin", O,
         image({"a": t("F32", [1], 0, 4), "b": t("U8", [0], 4, 2)}, bytes(4))),
    ]

    # ---- overflow ----
    V = "ST_OVERFLOW"
    c += [
        ("overflow_shape_product", V,
         image({"x": t("U8", [4294967296, 4294967296, 16], 0, 0)})),
        ("overflow_shape_product_late", V,
         image({"x": t("U8", [2, 3, 2**62, 2], 0, 0)})),
        ("overflow_byte_size_f32", V, image({"x": t("F32", [2**62], 0, 0)})),
        ("overflow_byte_size_i64", V, image({"x": t("I64", [2**31, 2**30, 4], 0, 0)})),
    ]

    # ---- size ----
    S = "ST_SIZE"
    c += [
        ("size_range_too_long", S, image({"x": t("F32", [2, 2], 0, 20)}, bytes(20))),
        ("size_range_too_short", S, image({"x": t("F32", [2, 2], 0, 12)}, bytes(12))),
        ("size_bf16_counted_as_f32", S, image({"x": t("BF16", [4], 0, 16)}, bytes(16))),
        ("size_zero_shape_nonempty_range", S, image({"x": t("U8", [0], 0, 4)}, bytes(4))),
        ("size_scalar_empty_range", S,
         image({"a": t("F32", [1], 0, 4), "b": t("F32", [], 4, 4)}, bytes(4))),
    ]

    # ---- truncated / trailing ----
    c += [
        ("truncated_data", "ST_TRUNCATED", image({"x": t("F32", [4], 0, 16)}, bytes(8))),
        ("truncated_no_data", "ST_TRUNCATED", image({"x": t("F32", [4], 0, 16)})),
        ("truncated_by_one_byte", "ST_TRUNCATED",
         image({"a": t("U8", [3], 0, 3), "b": t("I16", [2], 3, 7)}, bytes(6))),
        ("trailing_bytes", "ST_TRAILING", image({"x": t("F32", [2], 0, 8)}, bytes(9))),
        ("trailing_after_empty_header", "ST_TRAILING", image("{}", b"\x00")),
        ("trailing_after_zero_size", "ST_TRAILING", image({"x": t("U8", [0], 0, 0)}, b"junk")),
    ]

    # ---- duplicate names (contiguous, valid offsets: only the name rule fails) ----
    c += [
        ("duplicate_names", "ST_DUPLICATE",
         image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
               '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8))),
        ("duplicate_names_apart", "ST_DUPLICATE",
         image('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
               '"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},'
               '"w":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}', bytes(3))),
        ("duplicate_names_via_escape", "ST_DUPLICATE",
         image('{"ab":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
               '"a\\u0062":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2))),
        ("duplicate_metadata", "ST_DUPLICATE",
         image('{"__metadata__":{},"__metadata__":{},'
               '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', bytes(1))),
    ]

    # ---- valid files ----
    c += [
        ("ok_single_f32", "OK", image({"x": t("F32", [2, 2], 0, 16)}, f32(1, 2, 3, 4))),
        ("ok_metadata", "OK",
         image({"__metadata__": {"format": "pt", "note": "h\u00e9llo"},
                "w": t("BF16", [3], 0, 6)}, struct.pack("<3H", 0x3f80, 0x4000, 0x4040))),
        ("ok_zero_size_tensor", "OK",
         image({"empty": t("F32", [0, 3], 0, 0), "one": t("U8", [1], 0, 1)}, b"\x07")),
        ("ok_only_zero_size", "OK", image({"empty": t("F16", [4, 0], 0, 0)})),
        ("ok_header_padded_spaces", "OK",
         image(json.dumps({"x": t("I32", [2], 0, 8)}) + " " * 13, struct.pack("<2i", -1, 7))),
        ("ok_scalar_shape", "OK", image({"s": t("F64", [], 0, 8)}, struct.pack("<d", 2.5))),
        ("ok_empty_header", "OK", image("{}")),
        ("ok_metadata_only", "OK", image({"__metadata__": {"k": "v"}})),
        ("ok_unsorted_offsets", "OK",
         image({"b": t("U8", [2], 2, 4), "a": t("U8", [2], 0, 2), "c": t("I16", [1], 4, 6)},
               b"\x01\x02\x03\x04\x05\x06")),
        ("ok_unicode_names", "OK",
         image('{"\u00e9t\u00e9":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
               '"\\ud83d\\ude00":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x01\x02")),
        ("ok_all_dtypes", "OK", all_dtypes()),
        ("ok_8_dims", "OK", image({"x": t("U8", [1, 2, 1, 2, 1, 2, 1, 1], 0, 8)}, bytes(8))),
        ("ok_whitespace_json", "OK",
         image('{ "x" : { "shape" : [ 1 ] ,\n "data_offsets" : [ 0 , 2 ] , "dtype" : "F16" } }',
               b"\x00\x3c")),
    ]
    return c


def all_dtypes():
    sizes = [("BOOL", 1), ("U8", 1), ("I8", 1), ("F8_E5M2", 1), ("F8_E4M3", 1), ("I16", 2),
             ("U16", 2), ("F16", 2), ("BF16", 2), ("I32", 4), ("U32", 4), ("F32", 4),
             ("F64", 8), ("I64", 8), ("U64", 8)]
    header, pos = {}, 0
    for name, size in sizes:
        header["t_" + name] = t(name, [3], pos, pos + 3 * size)
        pos += 3 * size
    return image(header, bytes(range(pos)))


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(OUT, old))
    names = set()
    for case, status, data in cases():
        fname = "%s.%s.safetensors" % (case, status)
        assert fname not in names, fname
        names.add(fname)
        with open(os.path.join(OUT, fname), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(names), OUT))


if __name__ == "__main__":
    main()
