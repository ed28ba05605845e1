"""``python -m tflgpu.zoo DIR [FILE ...]``: write the corpus stand-ins (all, or the files named) into DIR;
with ``--release NAME`` a maker's released models (trained weights) instead, fetched from PyPI in the maker's
wheel (``--mediapipe``: ``--release mediapipe``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import STANDINS, ensure_standin
from .released import RELEASES, FetchError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflgpu.zoo", description=__doc__)
    parser.add_argument("directory", type=Path, help="where to write the .tflite files (created if missing)")
    parser.add_argument("files", nargs="*", metavar="FILE", help=f"which (default: all): {', '.join(STANDINS)}")
    parser.add_argument("--list", action="store_true", help="list the stand-ins and what each one is, and exit")
    parser.add_argument("--release", choices=RELEASES, default=None,
                        help="a maker's released models instead, from its wheel on PyPI (one download): "
                             + "; ".join(f"{r.name}: {r.wheel.project} {r.wheel.version}, {', '.join(r.models)}"
                                         for r in RELEASES.values()))
    parser.add_argument("--mediapipe", action="store_const", const="mediapipe", dest="release",
                        help="--release mediapipe")
    args = parser.parse_intermixed_args(argv)
    if args.release:
        return _released(parser, args)
    if args.list:
        for spec in STANDINS.values():
            print(f"{spec.file:40s} {spec.precision.value:14s} {spec.description}")
        return 0
    unknown = [f for f in args.files if f not in STANDINS]
    if unknown:
        parser.error(f"no stand-in for {', '.join(unknown)}; choose from: {', '.join(STANDINS)}")
    for file in args.files or STANDINS:
        t0 = time.perf_counter()
        try:
            path = ensure_standin(file, args.directory)
        except OSError as e:  # (PermissionError, a file where the directory should be, a read-only place)
            print(f"error: cannot write the stand-ins into {args.directory}: {e.strerror or e}; choose another "
                  "directory", file=sys.stderr)
            return 1
        print(f"{path} ({path.stat().st_size:,} bytes, {time.perf_counter() - t0:.1f} s)")
    return 0


def _released(parser, args) -> int:
    release = RELEASES[args.release]
    if args.list:
        for spec in release.models.values():
            print(f"{spec.file:40s} {spec.description}")
        return 0
    unknown = [f for f in args.files if f not in release.models]
    if unknown:
        parser.error(f"no {release.maker} model {', '.join(unknown)}; choose from: {', '.join(release.models)}")
    try:
        paths = release.fetch(args.directory, args.files or None)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in paths.values():
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
