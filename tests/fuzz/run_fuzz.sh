#!/usr/bin/env bash
# Builds server/rpc/request_fuzz.cc with Debian's clang and libFuzzer
# (-fsanitize=fuzzer,address; our sources instrumented, the system gRPC,
# protobuf and Abseil not) and runs it for a bounded time over the seed
# corpus tests/fuzz/corpus/. Fails on a crash, a sanitizer report or a
# broken promise; the input that found it is left in the output folder.
#
#   tests/fuzz/run_fuzz.sh [SECONDS]      (default 30; FUZZ_SECONDS too)
#
# Run by //tests:fuzz_test (tags "local": it finds the checkout through its
# own path) and by hand. The sources it compiles are the srcs of
# //server/domain:aggregator, :limits, :merge_tree, :rank_score,
# :contribution, :job_spec, :bounded_text and
# :periodic_thread, //server/store:state_codec, :kv_state_store and
# :memory_engine, //kernels:moments and //kernels:round_update, and //wire,
# read from their BUILD files, so it follows them.
set -euo pipefail
seconds="${1:-${FUZZ_SECONDS:-30}}"
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
cd "$root"
for tool in clang++ protoc pkg-config; do
  command -v "$tool" >/dev/null || { echo "run_fuzz: $tool missing; run scripts/deps.sh" >&2; exit 1; }
done
if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "run_fuzz: libFuzzer missing (libclang-rt-14-dev); run scripts/deps.sh" >&2
  exit 1
fi

# The srcs of one cc_library in a BUILD file, as paths from the root.
srcs_of() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import re, sys
build, name = sys.argv[1], sys.argv[2]
text = open(build).read()
for block in re.split(r'\n(?=\w+\()', text):
    if re.search(r'name\s*=\s*"%s"' % re.escape(name), block):
        m = re.search(r'srcs\s*=\s*\[(.*?)\]', block, re.S)
        for src in re.findall(r'"([^"]+\.cc)"', m.group(1) if m else ""):
            print("%s/%s" % (build.rsplit("/", 1)[0], src))
PY
}
sources=(server/rpc/request_fuzz.cc server/rpc/proto_convert.cc
         $(srcs_of server/domain/BUILD aggregator)
         $(srcs_of server/domain/BUILD limits)
         $(srcs_of server/domain/BUILD merge_tree)
         $(srcs_of server/domain/BUILD rank_score)
         $(srcs_of server/domain/BUILD contribution)
         $(srcs_of server/domain/BUILD job_spec)
         $(srcs_of server/domain/BUILD bounded_text)
         $(srcs_of server/domain/BUILD periodic_thread)
         $(srcs_of server/store/BUILD state_codec)
         $(srcs_of server/store/BUILD kv_state_store)
         $(srcs_of server/store/BUILD memory_engine)
         $(srcs_of kernels/BUILD moments) $(srcs_of kernels/BUILD round_update)
         $(srcs_of wire/BUILD wire) $(srcs_of wire/BUILD rank_list))
hash=$(cat "${sources[@]}" server/*/*.h kernels/*.h wire/*.h server/store/state.proto \
         proto/syncnorm/v1/aggregator.proto "$0" | sha256sum | cut -c1-16)
out="${TEST_TMPDIR:-${TMPDIR:-/tmp}}/syncnorm-fuzz-$hash"
mkdir -p "$out/gen/server/store" "$out/obj"
binary="$out/request_fuzz"
if [ ! -x "$binary" ]; then
  protoc --proto_path=server/store --cpp_out="$out/gen/server/store" \
    server/store/state.proto
  protoc --proto_path=proto --cpp_out="$out/gen" proto/syncnorm/v1/aggregator.proto
  flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -I. -I"$out/gen"
         $(pkg-config --cflags protobuf absl_status))
  objs=()
  for src in "${sources[@]}"; do
    obj="$out/obj/$(echo "$src" | tr / _).o"
    clang++ "${flags[@]}" -fsanitize=fuzzer,address -c "$src" -o "$obj" &
    objs+=("$obj")
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
  done
  # Generated code: sanitized, not instrumented for coverage.
  for gen in "$out/gen/server/store/state.pb.cc" "$out/gen/syncnorm/v1/aggregator.pb.cc"; do
    obj="$out/obj/$(basename "$gen").o"
    clang++ "${flags[@]}" -fsanitize=address -c "$gen" -o "$obj" &
    objs+=("$obj")
  done
  wait
  clang++ -fsanitize=fuzzer,address "${objs[@]}" -o "$binary.tmp" \
    $(pkg-config --libs protobuf absl_status absl_statusor absl_strings \
        absl_str_format absl_synchronization absl_time absl_hash \
        absl_raw_hash_set) -lpthread
  mv "$binary.tmp" "$binary"
fi

# libFuzzer adds what it finds to the first folder: a scratch copy, so the
# committed seeds stay as they are.
work="$out/corpus-run"
rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/* "$work/"
cd "$out"
echo "run_fuzz: $binary for ${seconds}s over $(ls "$root/tests/fuzz/corpus" | wc -l) seeds"
ASAN_OPTIONS=detect_leaks=0 "$binary" -max_total_time="$seconds" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$work"
