#include "engine/base/host_memory.h"

#include <cstdint>
#include <fstream>
#include <string>

namespace kvpr {

size_t host_bytes_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return SIZE_MAX;
}

}  // namespace kvpr
