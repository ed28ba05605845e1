#!/usr/bin/env python3
"""Fold tuning-record export files (``tflgpu tune MODEL --export FILE``, ``bench/bench_gpu.py
--export-background FILE``, ``bench/gpu_sweep.py --records FILE``) into a database file shipped with tflgpu
(``tflgpu/data/tuning/*.json``), device by device: a kernel's record replaces the held one as a database put would
(drawn from more trials, else faster: ``tflgpu.autotune.records.replaces``), records of another kernel-generator
version are left out. The shipped file is rewritten in place; a file that cannot be read changes nothing.

    python bench/merge_records.py tflgpu/data/tuning/nvidia-h100.json /path/to/background-records.json ...
"""

from __future__ import annotations

import argparse
import sys

from tflgpu.autotune.exchange import merge_records, read_records, write_records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shipped", help="the database file to fold the records into (rewritten)")
    p.add_argument("exports", nargs="+", help="export files to fold in")
    a = p.parse_args()
    try:
        devices = read_records(a.shipped)
        new = [d for path in a.exports for d in read_records(path)]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    before = sum(len(d.records) for d in devices)
    changed = merge_records(devices, new)
    write_records(a.shipped, devices)
    after = sum(len(d.records) for d in devices)
    print(f"{a.shipped}: {changed} records added or replaced ({before} -> {after} records, {len(devices)} devices)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
