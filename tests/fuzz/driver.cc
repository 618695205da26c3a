// A stand-in for libFuzzer's main in ordinary (GCC) builds, so every fuzz
// target also runs in CTest: it feeds the target each seed file given on the
// command line, then a fixed number of deterministic mutations of them
// (bit flips, truncations, duplicated and inserted bytes, huge varints).
// With -DOB_FUZZ=ON and clang, the real libFuzzer main is linked instead.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

std::string Mutate(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  switch (rng() % 6) {
    case 0:  // flip a bit
      if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:  // truncate
      s.resize(pick(s.size() + 1));
      break;
    case 2:  // duplicate a slice
      if (!s.empty()) {
        size_t a = pick(s.size()), n = pick(s.size() - a) + 1;
        s.insert(pick(s.size()), s.substr(a, n));
      }
      break;
    case 3:  // insert random bytes
      for (size_t i = 0, n = rng() % 8 + 1; i < n; ++i)
        s.insert(s.begin() + static_cast<long>(pick(s.size() + 1)), static_cast<char>(rng()));
      break;
    case 4:  // a huge varint where a length might be
      s.insert(pick(s.size() + 1), std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 9));
      break;
    default:  // overwrite with a special byte
      if (!s.empty()) s[pick(s.size())] = "\x00\xff\n#:=[]-,"[rng() % 10];
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 2000;
  std::vector<std::string> seeds{""};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("-runs=", 0) == 0) {
      iterations = std::atol(arg.c_str() + 6);
      continue;
    }
    std::ifstream in(arg, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz driver: cannot read seed %s\n", arg.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    seeds.push_back(ss.str());
  }
  LLVMFuzzerInitialize(&argc, &argv);
  std::mt19937_64 rng(20261121);
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  for (long i = 0; i < iterations; ++i) {
    std::string input = seeds[rng() % seeds.size()];
    for (int k = 0, n = static_cast<int>(rng() % 4) + 1; k < n; ++k) input = Mutate(input, rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  }
  std::printf("%zu seeds, %ld mutated inputs: no crash\n", seeds.size(), iterations);
  return 0;
}
