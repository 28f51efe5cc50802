#!/usr/bin/env bash
# Makes dist/mend-<version>-py3-none-linux_x86_64.whl: the Python package
# (pure Python over ctypes, any CPython >= 3.9, any torch >= 1.13) with
# libmend.so and every non-system library it needs under mend/_lib/, made
# relocatable: each bundled library is renamed with a hash of its contents
# (its SONAME and every DT_NEEDED that names it, with patchelf) so that it is
# never mistaken for another copy in the process, and every one finds the
# others through RPATH $ORIGIN; the bundled C libraries are bound
# symbolically (scripts/elf_symbolic.py). The system libraries it leaves out are
# glibc's, libstdc++ and libgcc_s (x86-64 Linux with glibc >= 2.36).
#
#   scripts/wheel.sh              builds what is missing in ./build, writes dist/
# Environment: MEND_BUILD_DIR (default build), MEND_DIST_DIR (default dist).
# Needs patchelf (scripts/setup.sh installs it). Downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEND_BUILD_DIR:-build}
dist=${MEND_DIST_DIR:-dist}

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${MEND_BUILD_TYPE:-RelWithDebInfo}" > /dev/null
fi
cmake --build "$build" --target mend_shared mend_python > /dev/null
version=$(sed -n 's/^VERSION = "\(.*\)"$/\1/p' "$build/python/mend/_build_info.py")

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
package="$stage/mend"
mkdir -p "$package/_lib"
cp python/mend/*.py python/mend/*.pyi python/mend/py.typed "$package/"
mkdir -p "$package/integrations"
cp python/mend/integrations/*.py "$package/integrations/"
cat > "$package/_build_info.py" <<EOF
# Written by scripts/wheel.sh: libmend.so is in _lib/ beside this file.
VERSION = "$version"
LIBRARY = ""
EOF

# libmend.so without its debug information, and what it needs.
library=$(readlink -f "$build/libmend.so.0")
strip --strip-debug -o "$package/_lib/libmend.so.0" "$library"
system='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so'
declare -A renamed=()
while read -r name path; do
  [[ -z "$path" || "$name" =~ $system ]] && continue
  hash=$(sha256sum "$path" | cut -c1-8)
  stem=${name%%.so*}
  suffix=${name#"$stem"}
  new="$stem-$hash$suffix"
  strip --strip-debug -o "$package/_lib/$new" "$path"
  renamed[$name]=$new
done < <(ldd "$library" | awk '$2 == "=>" {print $1, $3}')
for file in "$package/_lib/"*; do
  chmod u+w "$file"
  base=$(basename "$file")
  for old in "${!renamed[@]}"; do
    if [[ "${renamed[$old]}" == "$base" ]]; then patchelf --set-soname "$base" "$file"; fi
  done
  args=()
  while read -r needed; do
    if [[ -n "${renamed[$needed]:-}" ]]; then args+=(--replace-needed "$needed" "${renamed[$needed]}"); fi
  done < <(patchelf --print-needed "$file")
  if ((${#args[@]})); then patchelf "${args[@]}" "$file"; fi
  patchelf --set-rpath '$ORIGIN' "$file"
  # A bundled copy written in C binds to itself, not to a system copy of
  # the same library in the process's global scope (scripts/elf_symbolic.py).
  if [[ "$base" != libmend.so* ]] && ! nm -D --defined-only "$file" | awk '$NF ~ /^_Z/ {cxx = 1} END {exit !cxx}'; then
    /usr/bin/python3 scripts/elf_symbolic.py "$file"
  fi
done
# Every library must now resolve inside _lib/ or to a system library.
if LD_LIBRARY_PATH= ldd "$package/_lib/libmend.so.0" | grep -E 'not found'; then
  echo "wheel: a bundled library does not resolve" >&2
  exit 1
fi

mkdir -p "$dist"
/usr/bin/python3 - "$stage" "$dist" "$version" <<'EOF'
"""Writes the wheel: the files, the .dist-info (METADATA, WHEEL, RECORD)."""
import base64
import hashlib
import os
import sys
import zipfile

stage, dist, version = sys.argv[1:4]
tag = "py3-none-linux_x86_64"
info = f"mend-{version}.dist-info"
files = {}
for root, _, names in os.walk(stage):
    for name in sorted(names):
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            files[os.path.relpath(path, stage)] = (f.read(), os.stat(path).st_mode)
files[f"{info}/METADATA"] = (f"""Metadata-Version: 2.1
Name: mend
Version: {version}
Summary: Fault-tolerant, communication-efficient data-parallel training across racks (DiLoCo family)
Requires-Python: >=3.9
License: see the project's repository

mend replaces the cross-rack all-reduce of a PyTorch job with DiLoCo-style
rounds coordinated by a lighthouse. This wheel carries libmend.so (no
LibTorch) and the Python package that drives it with ctypes: it works with
any torch >= 1.13 installed beside it.
""".encode(), 0o644)
files[f"{info}/WHEEL"] = (f"""Wheel-Version: 1.0
Generator: mend scripts/wheel.sh
Root-Is-Purelib: false
Tag: {tag}
""".encode(), 0o644)
record = []
for name, (data, _) in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = (("\n".join(record) + "\n").encode(), 0o644)
wheel = os.path.join(dist, f"mend-{version}-{tag}.whl")
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, (data, mode) in sorted(files.items()):
        entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        entry.external_attr = (mode & 0xFFFF) << 16
        entry.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(entry, data)
print(f"{wheel} ({os.path.getsize(wheel) / 2**20:.1f} MiB, {len(files)} files)")
EOF
