// Layer weights kept in pinned host memory and streamed to the device one layer ahead of
// their use: the "weights offloaded" schedule of docs/design.md §2, for models whose weights do
// not fit on the GPU next to the KV buffers (OPT-30B/66B on one GPU, Llama-2-13B on a 24 GB
// card).
//
// Each layer's big matrices are packed into one pinned block, in two parts:
//   front  what the layer needs first (the stacked Q/K/V projection, which also recomputes
//          K/V[0:l] from X in kvpr mode)
//   back   the rest (attention output projection, MLP)
// The device holds two slots, each the size of the largest layer. The KV runtime issues, on
// the H2D stream, layer i+1's front, then its X[0:l] and KV[l:s'], then its back, while the
// compute stream works on layer i; compute waits for the front before the layer starts and
// for the back once attention is done. After the last layer, the next step's layer 0 is
// prefetched (weights do not depend on the step), and a layer still in a slot is not copied
// again (a model of two layers or fewer stays resident).
//
// The model registers the fields of its layer structs (add); from then on those fields hold
// views of whichever slot the layer was last put into, so the forward code reads its weights
// as always. Norm gains and biases are small and stay resident.
// Not thread-safe: one thread drives the model.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"

namespace kvpr {

class LayerWeightStream {
 public:
  enum class Part { Front = 0, Back = 1 };

  explicit LayerWeightStream(Backend& backend) : be_(backend) {}
  ~LayerWeightStream();

  // Registers one weight of `layer`; *field holds it in pinned host memory now, and holds a
  // view into the layer's device slot after finalize(). Layers are numbered from 0 and every
  // layer must register at least one field.
  void add(int64_t layer, Tensor* field, Part part);
  // A matrix's parts (a quantized one's codes, scales, zeros and order; a dense one's tensor).
  void add(int64_t layer, Weight* field, Part part);
  // Packs each layer into one pinned block and allocates the two device slots.
  void finalize();

  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }
  size_t layer_bytes(int64_t layer) const;      // front + back of one layer
  size_t max_layer_bytes() const { return slot_bytes_; }
  size_t host_bytes() const;                    // every layer's pinned block
  size_t device_bytes() const { return 2 * slot_bytes_; }

  // ---- used by the KV runtime while a step runs ----
  // Chooses the slot `layer` will be copied into and makes the H2D stream wait until the
  // compute stream is done with what that slot held (a no-op when the layer is already in a
  // slot). issue(layer, Front) does it when not called first; calling it first keeps that wait
  // out of a copy's measured time.
  void reserve(int64_t layer);
  // Issues the copy of `part` of `layer` on the H2D stream unless that layer is already in a
  // slot (or, for the back, was put there by the front just issued). Returns the bytes copied.
  size_t issue(int64_t layer, Part part);
  // The compute stream waits for the layer's front (bind) or back (wait_back); bind also
  // points the layer's fields at its slot.
  void bind(int64_t layer);
  void wait_back(int64_t layer);
  // The compute work issued so far is the layer's last use of its slot.
  void release(int64_t layer);

 private:
  struct Field {
    Tensor* dst;
    Tensor host;
    Part part;
    size_t offset = 0;  // in the layer's block
  };
  struct Layer {
    std::vector<Field> fields;
    Tensor block;          // pinned U8: front, then back
    size_t front_bytes = 0, bytes = 0;
  };
  struct Slot {
    int64_t layer = -1;    // which layer's copies were issued into it last
    bool front_issued = false, back_issued = false;
    bool in_use = false;   // bound and not yet released
    Event front_ready, back_ready, free;
    Tensor mem;            // device U8 [slot_bytes_]
  };
  int slot_of(int64_t layer) const;
  void point_fields(int64_t layer, int slot);

  Backend& be_;
  std::vector<Layer> layers_;
  Slot slots_[2];
  int last_slot_ = 1;      // the slot the latest front went to
  size_t slot_bytes_ = 0;
  bool finalized_ = false;
};

}  // namespace kvpr
