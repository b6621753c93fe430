#include "engine/model/checkpoint.h"

#include <filesystem>
#include <set>

#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

namespace fs = std::filesystem;

CheckpointDir::CheckpointDir(const std::string& dir) : dir_(dir) {
  KVPR_CHECK(fs::is_directory(dir), dir, ": not a directory");
  auto has = [&](const char* f) { return fs::exists(fs::path(dir) / f); };
  std::string index_name;
  bool torch = false;
  if (has("model.safetensors.index.json")) {
    index_name = "model.safetensors.index.json";
  } else if (has("model.safetensors")) {
    add_file("model.safetensors", false);
    format_ = "safetensors";
  } else if (has("pytorch_model.bin.index.json")) {
    index_name = "pytorch_model.bin.index.json";
    torch = true;
  } else if (has("pytorch_model.bin")) {
    add_file("pytorch_model.bin", true);
    format_ = "pytorch zip";
  } else {
    KVPR_THROW(dir, ": no weights found (looked for model.safetensors, model.safetensors.index.json, "
                    "pytorch_model.bin, pytorch_model.bin.index.json)");
  }
  if (!index_name.empty()) {
    json::Value index = json::parse_file((fs::path(dir) / index_name).string());
    const json::Value* map = index.find("weight_map");
    KVPR_CHECK(map && map->is_object(), index_name, ": no \"weight_map\" object");
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : map->as_object()) {
      KVPR_CHECK(shard.is_string(), index_name, ": weight_map entry '", tensor, "' is not a file name");
      const std::string& s = shard.as_string();
      KVPR_CHECK(s.find('/') == std::string::npos, index_name, ": shard name '", s,
                 "' must be a file in the model directory");
      shards.insert(s);
    }
    for (const auto& s : shards) add_file(s, torch);
    for (const auto& [tensor, shard] : map->as_object()) {
      const TensorRecord* r = find(tensor);
      KVPR_CHECK(r, index_name, ": tensor '", tensor, "' is listed in ", shard.as_string(),
                 " but that file does not contain it");
      KVPR_CHECK(r->file == shard.as_string(), index_name, ": tensor '", tensor, "' is listed in ",
                 shard.as_string(), " but found in ", r->file);
    }
    format_ = std::string(torch ? "pytorch zip" : "safetensors") + ", " +
              std::to_string(shards.size()) + " shard" + (shards.size() == 1 ? "" : "s");
  }
}

void CheckpointDir::add_file(const std::string& file_name, bool torch) {
  files_.push_back(std::make_unique<MappedFile>((fs::path(dir_) / file_name).string()));
  std::vector<TensorRecord> recs = torch ? read_torch_zip(*files_.back()) : read_safetensors(*files_.back());
  for (auto& r : recs) {
    KVPR_CHECK(!index_.count(r.name), file_name, ": tensor '", r.name, "' also appears in ",
               tensors_[index_[r.name]].file);
    index_[r.name] = tensors_.size();
    tensors_.push_back(std::move(r));
  }
}

size_t CheckpointDir::bytes_read() const {
  std::vector<const MappedFile*> files;
  for (const auto& f : files_) files.push_back(f.get());
  return resident_bytes(files);
}

const TensorRecord* CheckpointDir::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace kvpr
