#!/usr/bin/env bash
# libmend.so's dynamic symbols are exactly the functions of mend/mend.h, and
# neither its symbols nor its libraries mention LibTorch.
#   symbols_test.sh LIBMEND_SO MEND_H
set -euo pipefail
library=$1
header=$2
exported=$(nm -D --defined-only "$library" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u)
declared=$(grep -oE '\bmend_[a-z0-9_]+\(' "$header" | tr -d '(' | sort -u)
if [[ "$exported" != "$declared" ]]; then
  echo "exported symbols differ from mend.h's functions:"
  diff <(echo "$declared") <(echo "$exported") || true
  exit 1
fi
# (The names only: an address such as 12b4c10 must not match "c10".)
if nm -D "$library" | awk '{print $NF}' | grep -E 'torch|c10|at::|_ZN2at|_ZN3c10|_ZN5torch'; then
  echo "libmend.so refers to LibTorch symbols"
  exit 1
fi
if ldd "$library" | grep -E 'libtorch|libc10'; then
  echo "libmend.so needs LibTorch"
  exit 1
fi
echo "libmend.so: $(echo "$exported" | wc -l) symbols, all of mend.h; no LibTorch"
