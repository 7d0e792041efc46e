// ThreadSanitizer's defaults for the programs that link the annotations
// (TSAN_OPTIONS still overrides them).
//
// ignore_noninstrumented_modules=1: the memory accesses that TSan's
// interceptors make on behalf of uninstrumented libraries (malloc's and
// free's imitated writes, memcpy, sendmsg... called from gRPC, protobuf,
// libstdc++) are not checked; synchronization through those interceptors
// still counts. Those libraries hand their memory between threads through
// atomics TSan cannot see, so without it every gRPC-allocated object that
// our (instrumented) code touches on another thread is reported. Races
// between two instrumented accesses, ours or inline library code compiled
// into our binaries, are all still reported. (It is TSan's default on
// macOS, for the same reason.)
extern "C" const char* __tsan_default_options() {
  return "ignore_noninstrumented_modules=1";
}
