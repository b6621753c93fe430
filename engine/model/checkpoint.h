// Reading Hugging Face checkpoint directories: model.safetensors, sharded
// model.safetensors.index.json, pytorch_model.bin (PyTorch's zip format, unpickled here)
// and sharded pytorch_model.bin.index.json. Files are memory-mapped; tensors are views.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/dtype.h"
#include "engine/base/mapped_file.h"
#include "engine/base/tensor.h"

namespace kvpr {

struct TensorRecord {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // into a mapping, or into `owned`
  std::string file;            // file name (for error messages)
  std::shared_ptr<std::vector<uint8_t>> owned;  // set when the data had to be copied
  size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
};

// Tensors of one file. Used by CheckpointDir; exposed for tests and tools.
std::vector<TensorRecord> read_safetensors(const MappedFile& file);
std::vector<TensorRecord> read_torch_zip(const MappedFile& file);

class CheckpointDir {
 public:
  explicit CheckpointDir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // "safetensors", "safetensors, 3 shards", "pytorch zip", "pytorch zip, 2 shards"
  const std::string& format() const { return format_; }
  const TensorRecord* find(const std::string& name) const;
  const std::vector<TensorRecord>& tensors() const { return tensors_; }
  // Bytes of the checkpoint's files this process has read so far (resident_bytes in mapped_file.h).
  size_t bytes_read() const;

 private:
  void add_file(const std::string& file_name, bool torch);

  std::string dir_;
  std::string format_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<TensorRecord> tensors_;
  std::map<std::string, size_t> index_;
};

// Writes tensors as one safetensors file (used to make the demo model and test fixtures).
struct TensorToWrite {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace kvpr
