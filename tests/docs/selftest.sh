#!/bin/sh
# selftest.sh CHECKER - check_links.py finds a dead file link and a dead anchor,
# passes good links, anchors of repeated headings and links inside code, and
# exits 1 only for the dead ones.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/docs"
cat >"$dir/docs/a.md" <<'MD'
# A page
## Two `words`, here
## Twice
## Twice
MD
cat >"$dir/README.md" <<'MD'
[ok](docs/a.md) [ok](docs/a.md#two-words-here) [ok](docs/a.md#twice-1) [ok](#top)
# Top
`[in code](docs/gone.md)`
```
[in a fence](docs/gone.md)
```
[web](https://example.org/gone.md)
MD
python3 "$1" "$dir" >"$dir/good.out" || { echo "good links refused:"; cat "$dir/good.out"; exit 1; }
printf '[dead](docs/gone.md) [dead](docs/a.md#twice-2) [dead](#nowhere)\n' >>"$dir/README.md"
python3 "$1" "$dir" >"$dir/bad.out"
rc=$?
cat "$dir/bad.out"
[ $rc -eq 1 ] || { echo "exit $rc, expected 1"; exit 1; }
for want in 'docs/gone.md: no such file' 'docs/a.md#twice-2: no heading' '#nowhere: no heading' \
            '2 files, 3 dead links'; do
  grep -qF "$want" "$dir/bad.out" || { echo "missing: $want"; exit 1; }
done
