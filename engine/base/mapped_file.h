// A read-only memory mapping of a whole file (checkpoints are mapped, not read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Bytes of these mappings this process has touched, in one read of /proc/self/smaps: their
// pages mapped in (Rss), page granular and with the kernel's fault-around of pages that were
// already cached. What this process read of the files; 0 where smaps cannot be read.
size_t resident_bytes(const std::vector<const MappedFile*>& files);

}  // namespace kvpr
