#!/bin/sh
# Runs promtool with the arguments given (Debian's prometheus package); exits 77 (skipped)
# without it.
command -v promtool >/dev/null 2>&1 || { echo "promtool not found: skipped"; exit 77; }
exec promtool "$@"
