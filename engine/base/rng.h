// The engine's random numbers (sampling, the demo model's weights, tests and benches): seeded,
// so the same seed gives the same numbers on every machine.
#pragma once

#include <cstdint>

namespace kvpr {

// SplitMix64: small, fast, and fully specified, unlike std:: distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t s_;
};

}  // namespace kvpr
