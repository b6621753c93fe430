#include "engine/base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "engine/base/error.h"

namespace kvpr {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KVPR_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    KVPR_THROW(path, ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      KVPR_THROW(path, ": cannot map: ", std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

size_t resident_bytes(const std::vector<const MappedFile*>& files) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  size_t kib = 0;
  bool inside = false;  // the lines after a range header belong to that range
  while (std::getline(smaps, line)) {
    char* end = nullptr;
    const uintptr_t start = std::strtoull(line.c_str(), &end, 16);
    if (end && *end == '-' && end != line.c_str()) {
      const uintptr_t stop = std::strtoull(end + 1, nullptr, 16);
      inside = false;  // (one mapping may show as several ranges)
      for (const MappedFile* f : files) {
        const uintptr_t lo = reinterpret_cast<uintptr_t>(f->data()), hi = lo + f->size();
        if (f->data() && start < hi && stop > lo) inside = true;
      }
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      kib += std::strtoull(line.c_str() + 4, nullptr, 10);
    }
  }
  return kib * 1024;
}

}  // namespace kvpr
