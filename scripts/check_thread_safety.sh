#!/usr/bin/env bash
# Checks the lock annotations (src/core/thread_annotations.h) of the whole tree: every
# translation unit (libraries, tests, benchmarks, tools, example plugins) is compiled with
# clang -fsyntax-only -Wthread-safety -Werror=thread-safety. Only the syntax check runs,
# no code generation and no linking, so it costs a fraction of a build.
#   scripts/check_thread_safety.sh [BUILD_DIR] [SOURCE...]   (default BUILD_DIR: build-tsa;
#                                                             default: every source)
# Environment: SHOAL_JOBS (parallel jobs, default: number of CPUs).
# Exits non-zero, printing clang's diagnostics, if any unit has a thread-safety warning.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build-tsa}"
shift || true
# A clang configuration only for its compile_commands.json and the generated protobuf
# headers the sources include.
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DSHOAL_BUILD_TESTS=ON -DSHOAL_BUILD_BENCHMARKS=ON -DSHOAL_BUILD_E2E=ON -DSHOAL_BUILD_FUZZERS=OFF -DSHOAL_CUDA=OFF \
  >"$BUILD_DIR.configure.log" 2>&1 || {
  cat "$BUILD_DIR.configure.log" >&2
  exit 1
}
rm -f "$BUILD_DIR.configure.log"
mapfile -t generated < <(ninja -C "$BUILD_DIR" -t targets all | sed -n 's/^\([^:/][^:]*\.pb\.h\): .*/\1/p' | sort -u)
if [ "${#generated[@]}" -gt 0 ]; then ninja -C "$BUILD_DIR" "${generated[@]}" >/dev/null; fi

python3 - "$BUILD_DIR" "${SHOAL_JOBS:-$(nproc)}" "$@" <<'EOF'
import concurrent.futures, json, os, shlex, subprocess, sys

build_dir, jobs, only = sys.argv[1], int(sys.argv[2]), [os.path.abspath(f) for f in sys.argv[3:]]
units = []
for entry in json.load(open(os.path.join(build_dir, "compile_commands.json"))):
    path = os.path.abspath(os.path.join(entry["directory"], entry["file"]))
    if path.startswith(os.path.abspath(build_dir) + os.sep):
        continue  # generated protobuf code
    if only and path not in only:
        continue
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    # Drop the output, keep every flag and define; only thread-safety diagnostics matter.
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
    units.append((path, entry["directory"], out))

def check(unit):
    path, cwd, cmd = unit
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return path, r.returncode, r.stderr

failed = []
with concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
    for path, rc, err in pool.map(check, units):
        if rc != 0:
            failed.append(path)
            sys.stderr.write(err)
print(f"thread-safety check: {len(units)} units, {len(failed)} failed")
for path in failed:
    print("  " + os.path.relpath(path))
sys.exit(1 if failed else 0)
EOF
