#!/usr/bin/env python3
"""Prints how it was started, for the launcher's entry-point tests (a .py
file, -m, --run-path, --no-python)."""
import os
import sys

print(f"rank {os.environ['RANK']} ran {os.path.basename(sys.argv[0])} as {__name__} with {sys.argv[1:]}", flush=True)
