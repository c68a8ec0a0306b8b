#!/usr/bin/env bash
# Lay out an importable `pathprobe` package from this checkout without installing it
# (for machines with no package index, e.g. a GPU box): the repository keeps the core in
# core/, the three processes in server/, gateway/, loadgen/ and the lab and reports in analysis/; this links them into
# DEST/pathprobe so that `PYTHONPATH=DEST python3 -m pathprobe ...` works.
#
#   export PYTHONPATH=$(bench/pkgtree.sh /tmp/pathprobe-tree)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:?usage: bench/pkgtree.sh DEST}
rm -rf "$DEST/pathprobe"
mkdir -p "$DEST/pathprobe"
for item in "$ROOT"/core/*; do
  ln -s "$item" "$DEST/pathprobe/$(basename "$item")"
done
for component in server gateway loadgen analysis; do
  ln -s "$ROOT/$component" "$DEST/pathprobe/$component"
done
echo "$DEST"
