#!/usr/bin/env python3
"""Static instruction counts of a kernel's hot loop, from `cuobjdump -sass` output (no GPU).

For each function whose mangled name contains every FILTER word, finds the innermost loop (a
backward branch and its target) that holds at least --min-count instructions of --op (by default
12 HGMMA: the steady-state loop of the flash kernels; `--op IMAD.WIDE --min-count 15` finds the
backward producer's Philox loop) and prints its size, its branch count and its instruction
mix. Used to compare two builds of a kernel before a device run (docs/perf.md: "static SASS
loop 2329 -> 697 instructions").

    cuobjdump -sass -arch sm_90a OBJECT.o > k.sass       # scripts/sass_tools.sh fetches cuobjdump
    python3 scripts/sass_loops.py k.sass bfloat16 Li64ELi64E [--op HGMMA] [--min-count 12] \
        [--top 30]
"""

import argparse
import collections
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
BRANCH_TARGET = re.compile(r"\bBRA(?:\.\w+)*\s+(?:`\([^)]*\)\s*)?0x([0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


def opcode(text):
    """The instruction's mnemonic without its predicate and modifiers (HGMMA.64x64x16... -> HGMMA)."""
    return PREDICATE.sub("", text).split()[0].split(".")[0]


def functions(sass):
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name, body = chunk.split("\n", 1)
        yield name.strip(), [(int(a, 16), t.strip()) for a, t in INSTRUCTION.findall(body)]


def has_opcode(text, op):
    """Whether the instruction's mnemonic with its modifiers starts with `op` (IMAD.WIDE)."""
    return PREDICATE.sub("", text).split()[0].startswith(op)


def innermost_loop(instructions, min_count, op="HGMMA"):
    """(start, end, body) of the smallest loop holding >= min_count `op` instructions, or None."""
    best = None
    for address, text in instructions:
        match = BRANCH_TARGET.search(text)
        if not match or opcode(text) != "BRA":
            continue
        target = int(match.group(1), 16)
        if target >= address:
            continue
        body = [t for a, t in instructions if target <= a <= address]
        if sum(has_opcode(t, op) for t in body) < min_count:
            continue
        if best is None or len(body) < len(best[2]):
            best = (target, address, body)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass")
    parser.add_argument("filter", nargs="*", help="words the mangled name must contain")
    parser.add_argument("--op", default="HGMMA",
                        help="the mnemonic (with modifiers, a prefix) that selects the loop")
    parser.add_argument("--min-count", type=int, default=12,
                        help="the loop holds at least this many --op instructions")
    parser.add_argument("--top", type=int, default=30, help="opcodes listed per loop")
    args = parser.parse_args()
    with open(args.sass) as f:
        sass = f.read()
    found = False
    for name, instructions in functions(sass):
        if not all(word in name for word in args.filter):
            continue
        found = True
        loop = innermost_loop(instructions, args.min_count, args.op)
        if loop is None:
            print(f"{name}\n  no loop with {args.min_count}+ {args.op}")
            continue
        start, end, body = loop
        mix = collections.Counter(opcode(t) for t in body)
        selected = sum(has_opcode(t, args.op) for t in body)
        print(f"{name}\n  loop {start:#x}-{end:#x}: {len(body)} instructions, "
              f"{mix['BRA']} branches, {selected} {args.op}")
        print("  " + ", ".join(f"{op} {n}" for op, n in mix.most_common(args.top)))
    if not found:
        print("no function matches", " ".join(args.filter), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
