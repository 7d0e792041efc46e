// Finding a shared library's own definition of a function that the TSan
// annotations interpose, and defining one under its symbol.
#ifndef SYNCNORM_TESTS_TSAN_REAL_SYMBOL_H_
#define SYNCNORM_TESTS_TSAN_REAL_SYMBOL_H_

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/base/options.h"

#define SYNCNORM_TSAN_STR2(x) #x
#define SYNCNORM_TSAN_STR(x) SYNCNORM_TSAN_STR2(x)

// The mangled names in the annotations spell Debian's inline namespace.
static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE == 1 &&
                  std::string_view(SYNCNORM_TSAN_STR(
                      ABSL_OPTION_INLINE_NAMESPACE_NAME)) == "debian3",
              "tests/tsan spells Abseil's symbols with namespace debian3");

namespace syncnorm::tsan {

// The next definition of the symbol `mangled` after this executable's: the
// one in libabsl_synchronization.so, libgrpc.so... Resolved once per symbol
// by the caller's function-local static (libraries lock mutexes in their
// initializers, before any constructor of ours could run). A missing symbol
// means a library this code does not describe: the process stops with a
// message rather than run unannotated.
template <typename Fn>
Fn RealSymbol(const char* mangled, Fn self) {
  void* real = dlsym(RTLD_NEXT, mangled);
  if (real == nullptr || real == reinterpret_cast<void*>(self)) {
    std::fprintf(stderr, "tests/tsan: no definition of %s after ours\n",
                 mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(real);
}

}  // namespace syncnorm::tsan

// Declares `ret name params` (a parenthesized, named parameter list;
// member functions take `this` first) as the program's definition of the
// C++ symbol `mangled`, and `name##Real()`, the library's own definition.
// Use at global scope, followed by the function body.
#define SYNCNORM_TSAN_INTERPOSE(ret, name, mangled, params)         \
  extern "C" ret name params __asm__(mangled);                      \
  static auto name##Real() {                                        \
    static ret(*const real) params =                                \
        ::syncnorm::tsan::RealSymbol<ret(*) params>(mangled, name); \
    return real;                                                    \
  }                                                                 \
  extern "C" ret name params

#endif  // SYNCNORM_TESTS_TSAN_REAL_SYMBOL_H_
