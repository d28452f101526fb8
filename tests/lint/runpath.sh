#!/bin/bash
# Every ELF program and shared library under the given directories (or in
# the given wheels) searches for its libraries only in absolute
# directories and in $ORIGIN-relative ones. An empty RUNPATH or RPATH
# entry, or a relative one, is searched relative to the working directory:
# `lockstep run`, or `import lockstep_torch`, started from a directory that
# holds a crafted libnccl.so.2 or libcudart.so.13 would load it. Lists each
# offending file with its entries and fails; says how many it checked.
# Usage: runpath.sh DIR|WHEEL...
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: runpath.sh DIR|WHEEL..." >&2; exit 2; }
command -v readelf > /dev/null || { echo "SKIP: needs readelf (binutils)"; exit 77; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
roots=()
for target in "$@"; do
  if [[ $target == *.whl ]]; then
    dir=$work/$(basename "$target")
    mkdir -p "$dir" && unzip -q "$target" -d "$dir" || { echo "FAIL: cannot unpack $target"; exit 1; }
    roots+=("$dir")
  else
    roots+=("$target")
  fi
done

checked=0
bad=0
while IFS= read -r -d '' file; do
  [ "$(head -c 4 "$file" 2> /dev/null | od -An -c | tr -d ' \n')" = '177ELF' ] || continue
  checked=$((checked + 1))
  paths=$(readelf -d "$file" 2> /dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p')
  [ -n "$paths" ] || continue
  while IFS= read -r path; do
    # An empty entry anywhere: at either end, or two separators in a row.
    if [[ $path == :* || $path == *: || $path == *::* ]]; then
      echo "FAIL: $file: RUNPATH [$path] has an empty entry (the working directory)"
      bad=$((bad + 1))
      continue
    fi
    IFS=: read -r -a entries <<< "$path"
    for entry in "${entries[@]}"; do
      case $entry in
        /* | '$ORIGIN' | '$ORIGIN/'* | '${ORIGIN}' | '${ORIGIN}/'*) ;;
        *) echo "FAIL: $file: RUNPATH [$path] has the relative entry '$entry'"; bad=$((bad + 1)) ;;
      esac
    done
  done <<< "$paths"
done < <(find "${roots[@]}" -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) -print0)

[ "$checked" -gt 0 ] || { echo "FAIL: no ELF file under $*"; exit 1; }
[ "$bad" -eq 0 ] || exit 1
echo "the RUNPATHs of $checked ELF files are absolute or \$ORIGIN-relative"
