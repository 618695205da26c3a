#!/usr/bin/env python3
"""An independent safetensors reader, standard library only.

Reads FILE ('-' for stdin) by the format's published layout -- not by ob's
code -- checks it strictly, and prints its content as JSON:
  {"metadata": {...}, "tensors": {name: {"dtype", "shape", "values"}}}
With --expect EXPECTED.json (the same shape), compares instead and exits 1
at the first difference, naming it.

Usage: safetensors_reader.py FILE [--expect EXPECTED.json] [--no-values]
"""
import json
import struct
import sys

# dtype -> (bytes per element, struct code; None: decoded by hand)
DTYPES = {
    "F64": (8, "d"), "F32": (4, "f"), "F16": (2, "e"), "BF16": (2, None),
    "I64": (8, "q"), "I32": (4, "i"), "I16": (2, "h"), "I8": (1, "b"),
    "U8": (1, "B"), "BOOL": (1, "?"),
}


def fail(msg):
    print("safetensors_reader: " + msg, file=sys.stderr)
    sys.exit(1)


def decode(dtype, raw):
    size, code = DTYPES[dtype]
    n = len(raw) // size
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    return list(struct.unpack("<%d%s" % (n, code), raw))


def read(data, with_values=True):
    if len(data) < 8:
        fail("file too short: %d bytes" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail("header length %d beyond the file (%d bytes)" % (n, len(data)))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        fail("header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ must map strings to strings")
    body = data[8 + n:]
    spans = []
    tensors = {}
    for name, t in header.items():
        if set(t) != {"dtype", "shape", "data_offsets"}:
            fail("%s: fields %s" % (name, sorted(t)))
        if t["dtype"] not in DTYPES:
            fail("%s: unknown dtype %s" % (name, t["dtype"]))
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if end - begin != count * DTYPES[t["dtype"]][0]:
            fail("%s: %d bytes for %s%s" % (name, end - begin, t["dtype"], t["shape"]))
        spans.append((begin, end, name))
        entry = {"dtype": t["dtype"], "shape": t["shape"]}
        if with_values:
            entry["values"] = decode(t["dtype"], body[begin:end])
        tensors[name] = entry
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            fail("%s: starts at %d, expected %d (gap or overlap)" % (name, begin, at))
        at = end
    if at != len(body):
        fail("data section is %d bytes, tensors cover %d" % (len(body), at))
    return {"metadata": metadata, "tensors": tensors}


def compare(got, want):
    if got["metadata"] != want["metadata"]:
        fail("metadata differ: got %s, expected %s" % (got["metadata"], want["metadata"]))
    if set(got["tensors"]) != set(want["tensors"]):
        missing = sorted(set(want["tensors"]) - set(got["tensors"]))
        extra = sorted(set(got["tensors"]) - set(want["tensors"]))
        fail("tensor names differ: missing %s, unexpected %s" % (missing, extra))
    for name, w in want["tensors"].items():
        g = got["tensors"][name]
        for key in ("dtype", "shape"):
            if g[key] != w[key]:
                fail("%s: %s is %s, expected %s" % (name, key, g[key], w[key]))
        if "values" in w:
            for i, (a, b) in enumerate(zip(g["values"], w["values"])):
                if a != b:
                    fail("%s[%d] is %r, expected %r" % (name, i, a, b))
            if len(g["values"]) != len(w["values"]):
                fail("%s: %d values, expected %d" % (name, len(g["values"]), len(w["values"])))


def main(argv):
    args = argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 64
    path = args[0]
    data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    got = read(data, with_values="--no-values" not in args)
    if "--expect" in args:
        with open(args[args.index("--expect") + 1]) as f:
            compare(got, json.load(f))
        print("ok: %d tensors match" % len(got["tensors"]))
    else:
        json.dump(got, sys.stdout)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
