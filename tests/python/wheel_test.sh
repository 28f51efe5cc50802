#!/usr/bin/env bash
# The wheel end to end: scripts/wheel.sh makes it; a venv that sees Debian's
# torch (/usr/lib/python3/dist-packages) but not /usr/local's mend installs
# it offline; mend then loads from the venv, with the libmend.so it carries,
# and runs a two-learner job; pip uninstall removes every file.
#   wheel_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH MEND_LIBRARY
MEND_BUILD_DIR="$build" MEND_DIST_DIR="$work/dist" "$source_dir/scripts/wheel.sh"
wheel=$(ls "$work"/dist/mend-*-py3-none-linux_x86_64.whl)
size=$(stat -c %s "$wheel")
echo "wheel: $(basename "$wheel"), $((size / 1024)) KiB"
((size < 64 * 1024 * 1024))

/usr/bin/python3 -m venv "$work/venv"
python="$work/venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo /usr/lib/python3/dist-packages > "$site/debian-torch.pth"
cd "$work"
"$python" -m pip install -q --no-deps --no-index "$wheel"
# _lib holds what libmend.so.0 loads and nothing more (docs/python.md lists them).
needed=$(LD_LIBRARY_PATH= ldd "$site/mend/_lib/libmend.so.0" | awk '$3 ~ /\/_lib\// {print $3}' | xargs -n1 basename | sort)
held=$(ls "$site/mend/_lib" | grep -v '^libmend.so.0$' | sort)
if [[ "$needed" != "$held" ]]; then
  echo "the wheel's _lib differs from what libmend.so.0 loads:"
  diff <(echo "$needed") <(echo "$held") || true
  exit 1
fi
echo "wheel: _lib holds the $(echo "$held" | wc -l) libraries libmend.so.0 loads"
"$python" - "$work/venv" <<'PY'
import sys
import mend
import torch  # Debian's, beside the wheel's mend
venv = sys.argv[1]
assert mend.__file__.startswith(venv), mend.__file__
assert mend._native.LIBRARY_PATH.startswith(venv), mend._native.LIBRARY_PATH
print(f"mend {mend.__version__} with torch {torch.__version__}")
PY
"$python" "$source_dir/tests/python/wheel_job.py"
"$python" -m pip uninstall -y -q mend
if [[ -e "$site/mend" ]] || ls "$site" | grep -q '^mend-'; then
  echo "pip uninstall left files behind: $(ls "$site")"
  exit 1
fi
echo "wheel test: installed, ran a job, uninstalled"
