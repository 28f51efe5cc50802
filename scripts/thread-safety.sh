#!/usr/bin/env bash
# Checks the thread-safety annotations (ABSL_GUARDED_BY and friends on
# mend::Mutex, src/core/mutex.h) with clang's analysis, every finding an
# error: configures the LibTorch-free part with clang and
# -DMEND_THREAD_SAFETY_ANALYSIS=ON in build-tsa, generates the protobuf and
# gRPC headers, then runs clang -fsyntax-only (the analysis, no code
# generation) over every source file of src/ in compile_commands.json, in
# parallel. Prints the findings and how long it took; exits non-zero on any.
#   scripts/thread-safety.sh
# Environment: MEND_TSA_BUILD_DIR (default build-tsa), MEND_TSA_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

if ! command -v clang++ >/dev/null; then
  echo "thread-safety: clang++ not found; install it with: apt-get install clang" >&2
  exit 1
fi

build_dir=${MEND_TSA_BUILD_DIR:-build-tsa}
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DMEND_WITH_TORCH=OFF -DMEND_BUILD_TESTS=OFF \
  -DMEND_BUILD_BENCH=OFF -DMEND_BUILD_PYTHON=OFF -DMEND_THREAD_SAFETY_ANALYSIS=ON > /dev/null
# Generated headers the sources include (the protobuf and gRPC code).
mapfile -t generated < <(ninja -C "$build_dir" -t targets all | grep -o '^[^:]*\.pb\.h')
ninja -C "$build_dir" "${generated[@]}" > /dev/null

status=0
python3 - "$build_dir/compile_commands.json" "$PWD/src/" "${MEND_TSA_JOBS:-$(nproc)}" <<'EOF' || status=$?
import concurrent.futures, json, shlex, subprocess, sys

database, sources, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])

def syntax_only(entry):
    args = shlex.split(entry["command"])
    checked = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif arg != "-c":
            checked.append(arg)
    checked.insert(len(checked) - 1, "-fsyntax-only")
    run = subprocess.run(checked, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], run.returncode, run.stderr

entries = [e for e in json.load(open(database)) if e["file"].startswith(sources)]
failed = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for path, code, stderr in pool.map(syntax_only, entries):
        if stderr:
            sys.stderr.write(stderr)
        if code != 0:
            failed += 1
print(f"thread-safety: {len(entries)} files checked, {failed} with errors")
sys.exit(1 if failed else 0)
EOF
echo "thread-safety: took $(($(date +%s) - started)) s"
exit "$status"
