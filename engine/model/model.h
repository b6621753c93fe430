// A decoder-only language model written once against the Backend: what the generator, the
// worker, the CLI and the benchmarks see of OPT (opt_model.h) and Llama (llama_model.h).
// load_model reads config.json's model_type and builds the right one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_runtime.h"
#include "engine/model/model_spec.h"
#include "engine/model/quantized_checkpoint.h"
#include "engine/backend/weight_broadcast.h"
#include "engine/kv/weight_stream.h"

namespace kvpr {

class CheckpointDir;

struct ModelLoadOptions {
  // Storage dtype for weights; unset keeps each tensor's checkpoint dtype.
  bool convert_weights = false;
  DType weight_dtype = DType::F32;
  // Called after each tensor is uploaded with the bytes done and the checkpoint's total.
  std::function<void(size_t done, size_t total)> progress;
  // Several GPUs: rank 0 reads the checkpoint, the others receive the weights from it.
  WeightBroadcaster* broadcast = nullptr;
  // A digest of every weight as it landed on the backend (read back from the device, in load
  // order: weights_digest()). With a broadcast, rank 0 sends its digest too and a rank whose
  // received weights differ throws. Costs a read back of every weight, so it is asked for.
  bool verify_weights = false;
  // Keep the layers' matrices in pinned host memory and stream them to the device a layer
  // ahead of their use (weight_stream.h), for models that do not fit on the device. Every
  // rank then reads them from the checkpoint itself (the page cache shares the reads).
  bool stream_weights = false;
  // The KV cache the caller makes once the model is loaded (Generator::kv_plan), given the
  // model's shape and weight dtype: loading then refuses, before it allocates anything, a model
  // whose host memory (the streamed weights, the host KV store, and everything on a backend
  // whose device is the host) exceeds what the host has, naming the sizes. It is given the
  // backend and the bytes of weights the model will keep in host memory (a default-sized store
  // takes what they leave).
  std::function<KvPlan(const ModelSpec& spec, DType weight_dtype, const Backend& backend, double host_weight_bytes)>
      kv_plan;
  // Random weights (init_random): the layers' matrices quantized as this, round to nearest, one
  // scale a row and group of `random_group` inputs (0: a row) (kvpr-bench's quantized models), on
  // a backend that reads quantized weights.
  WeightFormat random_format = WeightFormat::Dense;
  int64_t random_group = 128;
  // ... and the LM head too, a matrix of its own when the model ties it (as GPTQModel's
  // lm_head=True checkpoints store it; the embedding stays dense).
  bool random_quantized_head = false;
};

// Scratch tensors reused across forward calls; grown on demand.
class Workspace {
 public:
  explicit Workspace(Backend& b) : backend_(b) {}
  Tensor get(const std::string& name, DType dtype, Shape shape);

 private:
  Backend& backend_;
  std::map<std::string, Tensor> buffers_;
};

// The KV cache's shape of a model of this spec.
inline KvShape kv_shape(const ModelSpec& spec) {
  return KvShape{spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.windows};
}

class Model : public KvProjector {
 public:
  explicit Model(Backend& backend) : backend_(backend) {}
  const ModelSpec& spec() const { return spec_; }
  Backend& backend() const { return backend_; }
  int64_t parameter_count() const { return parameter_count_; }
  size_t weight_bytes() const { return weight_bytes_; }
  DType weight_dtype() const { return weight_dtype_; }  // dtype of the big matrices
  const std::string& checkpoint_format() const { return format_; }
  // The checkpoint's quantization (quantized_checkpoint.h): its method and scheme, "" for none;
  // and the dtype its quantized matrices were dequantized into (the model's, or the one asked for).
  const QuantizedCheckpoint& quantization() const { return quant_; }
  DType dequantized_dtype() const { return dequantized_dtype_; }
  // Whether the quantized matrices are kept as stored, the GEMMs reading them (weight.h), rather
  // than dequantized at load: when the architecture and the backend both take them.
  bool kept_quantized() const { return kept_quantized_; }
  // Bytes of the checkpoint's files this process read while loading (page granular; a rank
  // that received its weights over a broadcast read the headers only).
  size_t checkpoint_bytes_read() const { return checkpoint_bytes_read_; }
  // ModelLoadOptions::verify_weights's digest, 16 hex digits ("" when not asked for).
  const std::string& weights_digest() const { return weights_digest_; }
  // The layers' weights streamed from host memory, or null when they are resident.
  LayerWeightStream* weight_stream() const { return weight_stream_.get(); }
  // Device bytes the weights take: all of them, or, when streamed, the resident ones plus the
  // two layer slots.
  size_t device_weight_bytes() const;
  // Host bytes the weights take: every weight on a backend whose device is the host, else the
  // streamed layers' (and one more layer while it is stacked); 0 when they are all on a device.
  double host_weight_bytes() const { return host_weight_bytes_; }

  // Runs the chunks through the model with the runtime providing each layer's past K/V
  // (and storing the new ones), and leaves F32 logits in device memory: one row per chunk
  // (its last token), or one row per token for chunks with all_rows and for every chunk when
  // all_positions; rows in chunk order, [rows, vocab]. The result is a view of a workspace
  // buffer, valid until the next forward, with the work possibly still running on the
  // compute stream.
  virtual Tensor forward_device(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, bool all_positions = false) = 0;
  // The same, copied into `logits` (host memory, F32 [rows, vocab]) once finished.
  void forward(const std::vector<ForwardChunk>& chunks, KvRuntime& kv, const Tensor& logits,
               bool all_positions = false);

  // Whether a decode step's work is known before it runs, so that it may be captured and replayed
  // as a CUDA graph (not when the host reads results back mid-step, as a mixture of experts does).
  virtual bool graph_capturable() const { return true; }

  KvShape kv_shape() const { return kvpr::kv_shape(spec_); }
  // Runtime for this model over a KV store cut as `layout` says (paged KV).
  std::unique_ptr<KvRuntime> make_kv_runtime(const KvLayout& layout, const KvRuntimeOptions& opts);
  // The contiguous layout: `slots` sequences of up to `capacity` tokens (KvLayout::slots).
  std::unique_ptr<KvRuntime> make_kv_runtime(int64_t slots, int64_t capacity, const KvRuntimeOptions& opts);

 protected:
  // The checks every forward makes of its chunks; returns the token count T and sets *rows to
  // the logits rows wanted.
  int64_t check_chunks(const std::vector<ForwardChunk>& chunks, bool all_positions, int64_t* rows) const;
  // Uploads one I32 tensor [2T + rows]: the chunks' token ids, their positions plus
  // `position_offset`, and the indices of the tokens whose logits are wanted.
  Tensor upload_ids(const std::vector<ForwardChunk>& chunks, int64_t T, int64_t rows, bool all_positions,
                    int32_t position_offset);

  enum class WeightRole { Matrix, Embedding, NormGain, Bias };
  // Returns the weight `name` (as the architecture names it) of the given shape, or an
  // undefined tensor when it is absent and not required. Counts what it returns into
  // parameter_count_ and weight_bytes_.
  // Matrices may come quantized (when keeps_quantized()); every other role is dense.
  using WeightSource = std::function<Weight(const std::string& name, const Shape& shape, bool required, WeightRole)>;
  // Whether the architecture's layers compute on quantized matrices as they are (else a quantized
  // checkpoint's are dequantized at load).
  virtual bool keeps_quantized() const { return false; }
  // An architecture's weights come in three steps, which load_checkpoint and init_random both
  // take: assemble (every weight from a source, and nothing else: plan_weights runs it on a
  // source that allocates nothing, so it starts from empty layers), stack_weights (what runs stacked, once every
  // weight has its values, the broadcast included), stream_layers (the streamed layers' fields,
  // for start_streaming).
  virtual void assemble(const WeightSource& fetch) = 0;
  // Weights an architecture derives from other checkpoint tensors (gpt-oss's packed experts):
  // the dtype of the one under checkpoint key `key` (nullopt: there is none), and its value in
  // host memory, of the shape assemble asks for.
  virtual std::optional<DType> derived_dtype(const CheckpointDir& ckpt, const std::string& key) const {
    (void)ckpt, (void)key;
    return std::nullopt;
  }
  virtual Tensor derived_weight(const CheckpointDir& ckpt, const std::string& key) const {
    (void)ckpt, (void)key;
    return Tensor();
  }
  // Where the architecture computes on quantized matrices, a derived one kept as stored (gpt-oss's
  // MXFP4 experts, weight.h's fp4): the bytes a weight of it takes (0: derived dense only) and
  // the weight, in host memory.
  virtual double derived_quantized_bytes(const CheckpointDir& ckpt, const std::string& key) const {
    (void)ckpt, (void)key;
    return 0;
  }
  virtual Weight derived_quantized_weight(const CheckpointDir& ckpt, const std::string& key) const {
    (void)ckpt, (void)key;
    return Weight();
  }
  virtual void stack_weights() = 0;
  virtual void stream_layers() = 0;
  // Loads the checkpoint in model_dir: `prepare` looks at it first (key prefixes), then
  // assemble takes every weight from a source that reads checkpoint key key_of(name), checks
  // its shape and dtype, converts it when asked and uploads it; with a broadcast, rank 0 reads
  // and the others receive. Returns after every upload has finished, stacked and streaming.
  void load_checkpoint(const std::string& model_dir, const ModelLoadOptions& opts,
                       const std::function<void(const CheckpointDir&)>& prepare,
                       const std::function<std::string(const std::string&)>& key_of);
  // Random weights of `dtype` generated on the device (an absent lm_head.weight stays absent:
  // tied; norm gains near 1, matrices scaled by their fan-in), stacked and streaming; of `opts`,
  // stream_weights and kv_plan apply.
  void init_random(DType dtype, uint64_t seed, const ModelLoadOptions& opts);
  // What loading will allocate, from a dry run of assemble with each weight's dtype (none:
  // absent), before anything is allocated.
  struct WeightPlan {
    double all = 0, streamed = 0;    // bytes of every weight; of those streamed from pinned host memory
    double largest_streamed_layer = 0;  // bytes: stacking a layer holds its parts and the stack at once
    DType dtype = DType::F32;        // the embedding's: the model's weight dtype
  };
  struct PlannedWeight {
    DType dtype;               // the dense dtype (a quantized weight's: the model's)
    double bytes_per_element;  // as it will be stored
  };
  WeightPlan plan_weights(const std::function<std::optional<PlannedWeight>(const std::string& name, bool required)>& plan_of);
  // Throws a one-line error naming the sizes when `plan` and opts.kv_plan's KV cache need more
  // host memory than is available (nothing without a kv_plan).
  void check_host_memory(const WeightPlan& plan, const ModelLoadOptions& opts);
  // Device memory for a weight of a model of `model_bytes` (0: unknown); running out names the
  // way around it (--weights host).
  Tensor alloc_weight(DType dtype, const Shape& shape, size_t model_bytes);
  // Whether the weight `name` of this role lives in pinned host memory (streamed layers).
  bool streamed(const std::string& name, WeightRole role) const;
  // [n, ...] from n tensors of one shape, in the memory of the first (device, or pinned host
  // for streamed weights), converted to the first one's dtype.
  Tensor stack(std::initializer_list<const Tensor*> parts);
  Tensor stack_tensors(const std::vector<const Tensor*>& parts);
  // The same for matrices: quantized ones of one layout stack part by part (sharing the first's
  // input order); any other mix is stacked dense, the quantized ones dequantized into
  // dequantized_dtype().
  Weight stack(std::initializer_list<const Weight*> parts);
  // A quantized weight's parts copied into the backend's memory (pinned when `pinned`).
  Weight upload(const Weight& host, bool pinned, size_t model_bytes);
  // A broadcast's quantized matrix: rank 0 sends the layout of `sent` (what it repacked: its
  // format, blocks, and each part's dtype and shape; a dense one's "none") and returns it as it
  // is; a receiver returns a weight of that layout whose parts are allocated on the device, to be
  // filled by the broadcast, or an undefined one for "none". Collective, like the broadcast.
  Weight share_layout(WeightBroadcaster& bc, const Weight& sent, size_t model_bytes);
  // ModelLoadOptions::verify_weights: the digest of `loaded`, checked against rank 0's.
  void verify_weights(const std::vector<Tensor>& loaded, WeightBroadcaster* broadcast);
  // Hands the registered layer fields to a new LayerWeightStream (when stream_weights_).
  void start_streaming(const std::function<void(LayerWeightStream&)>& register_fields);

  Backend& backend_;
  ModelSpec spec_;
  std::string format_;
  QuantizedCheckpoint quant_;
  DType dequantized_dtype_ = DType::BF16;
  bool kept_quantized_ = false;
  size_t checkpoint_bytes_read_ = 0;
  double host_weight_bytes_ = 0;
  std::string weights_digest_;
  int64_t parameter_count_ = 0;
  size_t weight_bytes_ = 0;
  DType weight_dtype_ = DType::F32;
  bool stream_weights_ = false;
  std::unique_ptr<LayerWeightStream> weight_stream_;
  Workspace ws_{backend_};
};

// The model_type of <dir>/config.json ("opt", or "llama", "mistral", "qwen2", "qwen3": Llama's architecture); throws naming the file when it is
// missing or not one kvpr supports.
std::string model_type(const std::string& model_dir);
// The ModelSpec of <dir>/config.json without loading weights.
ModelSpec load_model_spec(const std::string& model_dir);
// The model in <dir>, whichever architecture its config.json names.
std::unique_ptr<Model> load_model(Backend& backend, const std::string& model_dir, const ModelLoadOptions& opts = {});

}  // namespace kvpr
