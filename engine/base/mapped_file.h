// A read-only memory mapping of a whole file (checkpoints are mapped, not read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvpr {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws kvpr::Error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Bytes of the mapping this process has touched: its pages mapped in (Rss in
  // /proc/self/smaps), page granular and with the kernel's fault-around of pages that were
  // already cached. What this process read of the file; 0 where smaps cannot be read.
  size_t resident_bytes() const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvpr
