#!/usr/bin/env bash
# Prints the path of a venv holding requirements/torch2.txt (torch 2.x,
# transformers, accelerate, lightning, peft: every package pinned), making
# it first if needed. It lives outside the clone, under
# ${MEND_VENV_CACHE:-$HOME/.cache/mend}/torch2-<the file's SHA-256, 16 hex>:
# CI and every clone on the machine share it, and a changed file makes a
# new one. It is made in a directory beside it and renamed once complete,
# so an interrupted install is never taken for a venv. Use its bin/python
# (python -m pytest): the console scripts name the directory it was made in.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements/torch2.txt
cache=${MEND_VENV_CACHE:-$HOME/.cache/mend}
key=$(sha256sum "$requirements" | cut -c1-16)
venv=$cache/torch2-$key
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  partial=$(mktemp -d "$cache/torch2-$key.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  started=$(date +%s)
  echo "torch2-venv: making $venv from $requirements (about 5 GB from PyPI) ..." >&2
  /usr/bin/python3 -m venv "$partial"
  # Everything is pinned in the file: nothing else is resolved or fetched.
  "$partial/bin/python" -m pip install --no-input --quiet --no-cache-dir --no-deps \
    --disable-pip-version-check -r "$requirements" >&2
  mv -T "$partial" "$venv"
  trap - EXIT
  echo "torch2-venv: made in $(($(date +%s) - started)) s, $(du -sh "$venv" | cut -f1)" >&2
fi
echo "$venv"
