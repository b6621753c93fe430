#include "engine/kv/weight_stream.h"

#include <algorithm>
#include <cstring>

#include "engine/base/error.h"

namespace kvpr {

namespace {
constexpr size_t kAlign = 256;  // each weight starts on a GEMM-friendly boundary
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

LayerWeightStream::~LayerWeightStream() {
  // Copies into the slots may still be running from the blocks freed with this object.
  be_.synchronize();
}

void LayerWeightStream::add(int64_t layer, Tensor* field, Part part) {
  KVPR_CHECK(!finalized_, "weight stream: add after finalize");
  KVPR_CHECK(layer >= 0 && field && field->defined(), "weight stream: bad field for layer ", layer);
  KVPR_CHECK(field->memory() == MemoryKind::PinnedHost, "weight stream: layer ", layer, " weight ",
             field->describe(), " is not in pinned host memory");
  if (static_cast<size_t>(layer) >= layers_.size()) layers_.resize(static_cast<size_t>(layer) + 1);
  layers_[static_cast<size_t>(layer)].fields.push_back(Field{field, *field, part});
}

void LayerWeightStream::add(int64_t layer, Weight* field, Part part) {
  for (Tensor* t : field->parts())
    if (t->defined()) add(layer, t, part);
}

void LayerWeightStream::finalize() {
  KVPR_CHECK(!finalized_, "weight stream: finalize twice");
  KVPR_CHECK(!layers_.empty(), "weight stream: no layers");
  be_.synchronize();  // the weights have landed in their pinned tensors
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& L = layers_[i];
    KVPR_CHECK(!L.fields.empty(), "weight stream: layer ", i, " has no weights");
    // Front fields first, then the back ones; each part is one contiguous copy.
    std::stable_sort(L.fields.begin(), L.fields.end(),
                     [](const Field& a, const Field& b) { return a.part < b.part; });
    size_t off = 0;
    for (Field& f : L.fields) {
      if (f.part == Part::Back && L.front_bytes == 0 && off > 0) L.front_bytes = off;
      f.offset = off;
      off = align_up(off + f.host.nbytes());
    }
    L.bytes = off;
    if (L.fields.back().part == Part::Front) L.front_bytes = off;  // no back part
    L.block = be_.alloc_pinned(DType::U8, {static_cast<int64_t>(std::max<size_t>(off, 1))});
    for (Field& f : L.fields) {
      std::memcpy(static_cast<char*>(L.block.data()) + f.offset, f.host.data(), f.host.nbytes());
      f.host = L.block.rows(static_cast<int64_t>(f.offset), static_cast<int64_t>(f.host.nbytes()))
                   .view_as(f.host.dtype(), f.host.shape());
      *f.dst = f.host;  // the separate pinned tensor goes once nothing else holds it
    }
    slot_bytes_ = std::max(slot_bytes_, L.bytes);
  }
  for (Slot& s : slots_) s.mem = be_.alloc(DType::U8, {static_cast<int64_t>(std::max<size_t>(slot_bytes_, 1))});
  finalized_ = true;
  // Start with the first two layers in place, so a model of two layers never copies again and
  // the fields point at real weights before the first step.
  for (int64_t i = 0; i < std::min<int64_t>(2, layers()); ++i) {
    issue(i, Part::Front);
    issue(i, Part::Back);
    point_fields(i, slot_of(i));
  }
  for (int64_t i = 2; i < layers(); ++i) point_fields(i, static_cast<int>(i % 2));
  be_.synchronize();
}

size_t LayerWeightStream::layer_bytes(int64_t layer) const { return layers_.at(static_cast<size_t>(layer)).bytes; }

size_t LayerWeightStream::host_bytes() const {
  size_t n = 0;
  for (const Layer& L : layers_) n += L.bytes;
  return n;
}

int LayerWeightStream::slot_of(int64_t layer) const {
  for (int s = 0; s < 2; ++s)
    if (slots_[s].layer == layer) return s;
  return -1;
}

void LayerWeightStream::point_fields(int64_t layer, int slot) {
  const Tensor& mem = slots_[slot].mem;
  for (const Field& f : layers_.at(static_cast<size_t>(layer)).fields)
    *f.dst = mem.rows(static_cast<int64_t>(f.offset), static_cast<int64_t>(f.host.nbytes()))
                 .view_as(f.host.dtype(), f.host.shape());
}

void LayerWeightStream::reserve(int64_t layer) {
  KVPR_CHECK(finalized_, "weight stream: used before finalize");
  KVPR_CHECK(layer >= 0 && layer < layers(), "weight stream: no layer ", layer);
  if (slot_of(layer) >= 0) return;
  // Layers are issued in the order they run, so the other slot holds the layer before the one
  // most recently issued: the one the compute stream finished with last.
  const int s = 1 - last_slot_;
  Slot& sl = slots_[s];
  // A slot still bound (a step that stopped half way) is free once what is queued is done.
  if (sl.in_use) {
    sl.free = be_.record(Stream::Compute);
    sl.in_use = false;
  }
  if (sl.free.impl()) be_.wait(Stream::H2D, sl.free);
  sl.layer = layer;
  sl.front_issued = sl.back_issued = false;
  last_slot_ = s;
}

size_t LayerWeightStream::issue(int64_t layer, Part part) {
  const Layer& L = layers_.at(static_cast<size_t>(layer));
  if (part == Part::Front) {
    reserve(layer);
    Slot& sl = slots_[slot_of(layer)];
    if (sl.front_issued) return 0;  // still there from an earlier step
    if (L.front_bytes > 0)
      be_.copy(sl.mem.rows(0, static_cast<int64_t>(L.front_bytes)), L.block.rows(0, static_cast<int64_t>(L.front_bytes)),
               Stream::H2D, "W front");
    sl.front_ready = be_.record(Stream::H2D);
    sl.front_issued = true;
    return L.front_bytes;
  }
  const int s = slot_of(layer);
  KVPR_CHECK(s >= 0, "weight stream: back of layer ", layer, " issued before its front");
  Slot& sl = slots_[s];
  if (sl.back_issued) return 0;
  const size_t n = L.bytes - L.front_bytes;
  if (n > 0)
    be_.copy(sl.mem.rows(static_cast<int64_t>(L.front_bytes), static_cast<int64_t>(n)),
             L.block.rows(static_cast<int64_t>(L.front_bytes), static_cast<int64_t>(n)), Stream::H2D, "W back");
  sl.back_ready = be_.record(Stream::H2D);
  sl.back_issued = true;
  return n;
}

void LayerWeightStream::bind(int64_t layer) {
  int s = slot_of(layer);
  if (s < 0) {  // not prefetched (the first step, or after an error): fetch it now
    issue(layer, Part::Front);
    s = slot_of(layer);
  }
  Slot& sl = slots_[s];
  if (sl.front_ready.impl()) be_.wait(Stream::Compute, sl.front_ready);
  point_fields(layer, s);
  sl.in_use = true;
}

void LayerWeightStream::wait_back(int64_t layer) {
  const int s = slot_of(layer);
  KVPR_CHECK(s >= 0, "weight stream: layer ", layer, " is not bound");
  issue(layer, Part::Back);
  if (slots_[s].back_ready.impl()) be_.wait(Stream::Compute, slots_[s].back_ready);
}

void LayerWeightStream::release(int64_t layer) {
  const int s = slot_of(layer);
  if (s < 0 || !slots_[s].in_use) return;
  slots_[s].free = be_.record(Stream::Compute);
  slots_[s].in_use = false;
}

}  // namespace kvpr
