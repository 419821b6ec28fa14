#!/usr/bin/env python3
"""Summarises Nsight Compute's source page of one kernel (`ncu --import R.ncu-rep --page source
--csv --print-source sass`, plain or gzipped) for finding where a kernel's issue slots and stalls
go (docs/perf.md's rule: predict, then measure):

- the hottest SASS lines by stall samples;
- executed instructions by opcode, per tile: divided by the executions of the most-run HGMMA
  that starts an accumulation (`RZ, !UPT`; copies of one chain, a loop's peeled first tile,
  summed), i.e. per warp and tile (every warp's instructions counted, a producer's included);
- stall reasons (sampled) with the lines that carry most of each;
- shared-memory instructions with excess wavefronts (bank conflicts).

usage: scripts/ncu_source_summary.py SOURCE_CSV [HOT_LINES]
"""
import collections
import csv
import gzip
import re
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.reader(f))


def number(text):
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def opcode(source):
    """`@!P0 BRA 0x...` -> BRA, `HGMMA.64x128x16.F32 ...` -> HGMMA."""
    words = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split()
    return words[0].split(".")[0] if words else "?"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    hot_lines = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = read_rows(sys.argv[1])
    header_at = next((i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r]), None)
    if header_at is None:
        sys.exit("no Source column in the source page")
    header = [c.strip() for c in rows[header_at]]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    col = {name: i for i, name in enumerate(header)}
    source = [r[col["Source"]].strip() for r in body]

    samples_name = next((c for c in header if "Samples" in c), None)
    if samples_name:
        samples = [number(r[col[samples_name]]) for r in body]
        total = sum(samples) or 1.0
        print(f"--- hottest SASS lines (by '{samples_name}') ---")
        for i in sorted(range(len(body)), key=lambda i: samples[i], reverse=True)[:hot_lines]:
            print(f"{100 * samples[i] / total:5.1f}%  {source[i]}")

    if "Instructions Executed" in col:
        executed = [number(r[col["Instructions Executed"]]) for r in body]
        # The same accumulation chain may be compiled twice (a loop's peeled first tile): its
        # starts are summed by their text.
        starts = collections.Counter()
        for i in range(len(body)):
            if opcode(source[i]) == "HGMMA" and "RZ, !UPT" in source[i]:
                starts[source[i]] += executed[i]
        tiles = max(starts.values()) if starts else 0.0
        by_opcode = collections.Counter()
        for i in range(len(body)):
            by_opcode[opcode(source[i])] += executed[i]
        total = sum(by_opcode.values())
        if tiles > 0:
            print(f"--- executed instructions per warp-tile ({total / tiles:.1f} in all; "
                  f"{tiles:.0f} warp-tiles by the HGMMA chain run most) ---")
            scale = tiles
        else:
            print(f"--- executed instructions, millions ({total / 1e6:.1f} in all; no HGMMA) ---")
            scale = 1e6
        print(" ".join(f"{name}:{count / scale:.1f}" for name, count in by_opcode.most_common(40)))

    stall_columns = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    if stall_columns:
        by_reason = {c: [number(r[col[c]]) for r in body] for c in stall_columns}
        total = sum(sum(v) for v in by_reason.values()) or 1.0
        print("--- stall reasons (samples; the three lines carrying most of each) ---")
        for reason, values in sorted(by_reason.items(), key=lambda kv: -sum(kv[1]))[:12]:
            top = sorted(range(len(values)), key=lambda i: values[i], reverse=True)[:3]
            lines = ", ".join(f"{source[i][:56]} ({100 * values[i] / total:.1f}%)" for i in top
                              if values[i] > 0)
            print(f"{reason[6:]:<20}{100 * sum(values) / total:5.1f}%  {lines}")

    excess_name = "L1 Wavefronts Shared Excessive"
    if excess_name in col:
        excess = [number(r[col[excess_name]]) for r in body]
        ideal = [number(r[col.get("L1 Wavefronts Shared Ideal", col[excess_name])]) for r in body]
        conflicted = [i for i in range(len(body)) if excess[i] > 0]
        print(f"--- shared-memory excess wavefronts ({sum(excess):.0f} in all) ---")
        for i in sorted(conflicted, key=lambda i: excess[i], reverse=True)[:10]:
            print(f"{excess[i]:14.0f} excess / {ideal[i]:.0f} ideal  {source[i]}")


if __name__ == "__main__":
    main()
