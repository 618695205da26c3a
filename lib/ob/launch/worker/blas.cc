#include "ob/launch/worker/blas.h"

#include <dlfcn.h>

#include <utility>

namespace ob::launch {

void SetBlasThreads(int openblas, int mkl) {
  using SetThreads = void (*)(int);
  for (auto [name, n] : {std::pair{"openblas_set_num_threads", openblas}, std::pair{"mkl_set_num_threads", mkl}}) {
    if (n <= 0) continue;
    if (auto f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, name))) f(n);
  }
}

}  // namespace ob::launch
