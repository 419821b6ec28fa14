#!/usr/bin/env python3
"""A mutation fuzzer over the whole `dpa attention` command (issue 15): good calls, mutated.

Each iteration takes a valid command (inputs written as .npy files, flags for every feature),
applies a few random mutations (drop, duplicate or replace a flag or its value; corrupt,
truncate or swap an input file; make --out a file or put a directory where an output goes),
runs the CLI and checks the contract:
  - it exits 0, 1 or 2, never by a signal or a sanitizer abort;
  - it finishes within the timeout;
  - on a non-zero exit: stdout is empty, stderr names a flag or says why, and --out holds
    exactly what it held before (nothing new, nothing changed, nothing removed).
A violation is saved under OUTDIR/finding-N/ (the command and its files) and counted.

    tests/fuzz/cli_mutation_fuzz.py path/to/dpa --seconds 600 --out build-fuzz/cli-mutation

Needs only the Python standard library.
"""

import argparse
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

DTYPES = {"<f4": ("f", 4), "<f8": ("d", 8), "<i4": ("i", 4), "|b1": ("?", 1)}


def npy_bytes(descr, shape, values=None):
    """A .npy 1.0 file: the header as NumPy writes it, then little-endian data."""
    code, size = DTYPES[descr]
    count = 1
    for extent in shape:
        count *= extent
    if values is None:
        values = [((i * 7919) % 13) / 6.0 - 1.0 for i in range(count)]
    shape_text = "(" + ", ".join(str(e) for e in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    total = 10 + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    if code == "?":
        data = bytes(int(bool(v)) for v in values)
    elif code == "i":
        data = struct.pack("<%di" % count, *[int(v) for v in values])
    else:
        data = struct.pack("<%d%s" % (count, code), *values)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def good_case(rng, directory):
    """(flags, files) of a valid call with a random feature set."""
    b, sq, skv, h, g, d = rng.choice([(2, 5, 7, 4, 2, 8), (1, 9, 9, 2, 1, 16), (2, 3, 3, 2, 2, 4)])
    files = {
        "q.npy": npy_bytes("<f8", (b, sq, h, d)),
        "k.npy": npy_bytes("<f8", (b, skv, g, d)),
        "v.npy": npy_bytes("<f8", (b, skv, g, d)),
        "do.npy": npy_bytes("<f8", (b, sq, h, d)),
    }
    flags = ["--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
    if rng.random() < 0.6:
        flags += ["--do", "do.npy"]
    if rng.random() < 0.5:
        flags += ["--softcap", rng.choice(["0.5", "5", "50"])]
    if rng.random() < 0.4:
        files["offset.npy"] = npy_bytes("<f4", (h,))
        flags += ["--softmax-offset", "offset.npy"]
    elif rng.random() < 0.3:
        flags += ["--softmax-type", "off-by-one"]
    if rng.random() < 0.4:
        flags += ["--mask", rng.choice(["causal", "causal_bottom_right", "no_mask"])]
    if rng.random() < 0.3:
        flags += ["--window", rng.choice(["2,0", "-1,0", "3,3"]) if "--mask" not in flags
                  else "2,0"]
    if rng.random() < 0.3:
        files["bias.npy"] = npy_bytes("<f8", (1, h, sq, skv))
        flags += ["--bias", "bias.npy"]
    if rng.random() < 0.3:
        files["alibi.npy"] = npy_bytes("<f4", (h,), [0.25] * h)
        flags += ["--alibi-slopes", "alibi.npy"]
    if rng.random() < 0.3:
        flags += ["--dropout", "0.2", "--seed", str(rng.randrange(1000))]
    if rng.random() < 0.3:
        lengths = [rng.randrange(0, sq + 1) for _ in range(b)]
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        files["cu.npy"] = npy_bytes("<i4", (b + 1,), cu)
        flags += ["--cu-seqlens-q", "cu.npy"]
    flags += ["--backend", rng.choice(["cpu", "cpu_exact"])]
    return flags, files


TOKENS = ["nan", "inf", "-inf", "-1", "0", "1e39", "1e-46", "9223372036854775808", "", "abc",
          "--softcap", "1,2,3", "-2,0", "causal", "arbitrary", "thd", "sbhd", "learnable",
          "cuda_flash", "/dev/zero", ".", "missing.npy", "q.npy", "bias.npy", "0.999999"]
FLAGS = ["--softcap", "--scale", "--dropout", "--seed", "--offset", "--window", "--mask",
         "--softmax-type", "--bias-type", "--format", "--backend", "--layer-number",
         "--deterministic", "--bottom-right-diagonal", "--attn-mask", "--cu-seqlens-kv",
         "--cu-seqlens-q-padded", "--alibi-slopes", "--softmax-offset", "--bias", "--do"]


def mutate(rng, flags, files):
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(9)
        if kind == 0 and flags:
            del flags[rng.randrange(len(flags))]
        elif kind == 1 and flags:
            flags[rng.randrange(len(flags))] = rng.choice(TOKENS)
        elif kind == 2:
            flags.insert(rng.randrange(len(flags) + 1), rng.choice(FLAGS))
            flags.insert(rng.randrange(len(flags) + 1), rng.choice(TOKENS))
        elif kind == 3 and flags:
            i = rng.randrange(len(flags))
            flags.insert(i, flags[i])
        elif kind in (4, 5) and files:
            name = rng.choice(sorted(files))
            data = bytearray(files[name])
            for _ in range(rng.randrange(1, 8)):
                if data:
                    data[rng.randrange(len(data))] = rng.randrange(256)
            files[name] = bytes(data)
        elif kind == 6 and files:
            name = rng.choice(sorted(files))
            files[name] = files[name][: rng.randrange(len(files[name]) + 1)]
        elif kind == 7 and len(files) > 1:
            a, b = rng.sample(sorted(files), 2)
            files[a], files[b] = files[b], files[a]
        elif kind == 8:
            name = rng.choice(sorted(files))
            # A header that claims a huge or repeated shape.
            files[name] = files[name].replace(b"'shape': (", b"'shape': (1099511627776, ", 1)


def snapshot(path):
    if not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return ("file", open(path, "rb").read())
    entries = {}
    for root, dirs, names in os.walk(path):
        for name in dirs:
            entries[os.path.relpath(os.path.join(root, name), path)] = "dir"
        for name in names:
            full = os.path.join(root, name)
            entries[os.path.relpath(full, path)] = open(full, "rb").read()
    return ("dir", entries)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cli")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="cli-mutation")
    parser.add_argument("--timeout", type=float, default=20)
    args = parser.parse_args()
    args.cli = os.path.abspath(args.cli)  # the commands run in their own directories
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.seconds
    runs = findings = 0
    statuses = {}
    while time.time() < deadline:
        work = tempfile.mkdtemp(prefix="dpa_mut_")
        try:
            flags, files = good_case(rng, work)
            mutate(rng, flags, files)
            for name, data in files.items():
                open(os.path.join(work, name), "wb").write(data)
            out = os.path.join(work, "out")
            setup = rng.randrange(4)
            if setup == 1:
                os.makedirs(out)
                open(os.path.join(out, "o.npy"), "wb").write(b"user data")
            elif setup == 2:
                os.makedirs(os.path.join(out, "lse.npy"))
            elif setup == 3:
                open(out, "wb").write(b"a file, not a directory")
            before = snapshot(out)
            command = [args.cli, "attention"] + flags + ["--out", out]
            problem = None
            try:
                result = subprocess.run(command, cwd=work, capture_output=True, timeout=args.timeout)
                statuses[result.returncode] = statuses.get(result.returncode, 0) + 1
                if result.returncode not in (0, 1, 2):
                    problem = f"exit status {result.returncode}"
                elif result.returncode != 0:
                    if result.stdout:
                        problem = "stdout written on failure"
                    elif snapshot(out) != before:
                        problem = "--out changed on failure"
                    elif not result.stderr.strip():
                        problem = "no message on failure"
                problem_text = result.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                problem, problem_text = "timeout", ""
            runs += 1
            if problem:
                findings += 1
                keep = os.path.join(args.out, f"finding-{findings}")
                shutil.copytree(work, keep, dirs_exist_ok=True)
                open(os.path.join(keep, "COMMAND"), "w").write(
                    " ".join(command) + "\n" + problem + "\n" + problem_text)
                print(f"finding {findings}: {problem}: {' '.join(command)}", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"cli_mutation_fuzz: {runs} runs, {findings} findings, exit statuses {statuses}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
