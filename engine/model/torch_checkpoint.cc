// PyTorch's checkpoint format (torch.save since 1.6): an uncompressed zip archive holding
// <root>/data.pkl (a pickle of the state dict whose tensors refer to storages by persistent
// id) and <root>/data/<key> (the raw little-endian storage bytes). We read the zip's central
// directory (zip64 included: multi-GB shards), run a small pickle machine that understands
// what torch.save writes, and return views into the mapped file.
#include <cstring>
#include <map>
#include <memory>
#include <variant>

#include "engine/model/checkpoint.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {

// ---------------------------------------------------------------- zip
struct ZipEntry {
  uint64_t data_offset = 0;
  uint64_t size = 0;
};

template <typename T>
T rd(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::map<std::string, ZipEntry> read_zip_directory(const MappedFile& f, const std::string& name) {
  const uint8_t* d = f.data();
  const size_t n = f.size();
  KVPR_CHECK(n >= 22, name, ": truncated file (too short for a zip archive)");
  // End of central directory: search backwards over the maximum comment length.
  size_t eocd = SIZE_MAX;
  size_t lo = n >= 22 + 65535 ? n - 22 - 65535 : 0;
  for (size_t p = n - 22 + 1; p-- > lo;) {
    if (rd<uint32_t>(d + p) == 0x06054b50u) {
      eocd = p;
      break;
    }
  }
  KVPR_CHECK(eocd != SIZE_MAX, name,
             ": not a zip archive (no end-of-central-directory record); legacy pre-1.6 torch "
             "checkpoints are not supported, re-save with torch.save or convert to safetensors");
  uint64_t entries = rd<uint16_t>(d + eocd + 10);
  uint64_t cd_size = rd<uint32_t>(d + eocd + 12);
  uint64_t cd_off = rd<uint32_t>(d + eocd + 16);
  if (entries == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
    KVPR_CHECK(eocd >= 20 && rd<uint32_t>(d + eocd - 20) == 0x07064b50u, name,
               ": zip64 locator missing");
    uint64_t e64 = rd<uint64_t>(d + eocd - 20 + 8);
    KVPR_CHECK(e64 + 56 <= n && rd<uint32_t>(d + e64) == 0x06064b50u, name,
               ": zip64 end-of-central-directory record missing");
    entries = rd<uint64_t>(d + e64 + 32);
    cd_size = rd<uint64_t>(d + e64 + 40);
    cd_off = rd<uint64_t>(d + e64 + 48);
  }
  KVPR_CHECK(cd_off <= n && cd_size <= n - cd_off, name, ": zip central directory overruns the file");
  std::map<std::string, ZipEntry> out;
  uint64_t p = cd_off;
  for (uint64_t i = 0; i < entries; ++i) {
    KVPR_CHECK(p + 46 <= cd_off + cd_size && rd<uint32_t>(d + p) == 0x02014b50u, name,
               ": corrupt zip central directory");
    uint16_t method = rd<uint16_t>(d + p + 10);
    uint64_t csize = rd<uint32_t>(d + p + 20);
    uint64_t usize = rd<uint32_t>(d + p + 24);
    uint16_t nlen = rd<uint16_t>(d + p + 28);
    uint16_t xlen = rd<uint16_t>(d + p + 30);
    uint16_t clen = rd<uint16_t>(d + p + 32);
    uint64_t local = rd<uint32_t>(d + p + 42);
    KVPR_CHECK(p + 46 + nlen + xlen + clen <= cd_off + cd_size, name, ": corrupt zip central directory");
    std::string entry(reinterpret_cast<const char*>(d + p + 46), nlen);
    // Zip64 extended information: the 64-bit values of the fields that were saturated.
    const uint8_t* x = d + p + 46 + nlen;
    for (size_t q = 0; q + 4 <= xlen;) {
      uint16_t id = rd<uint16_t>(x + q), sz = rd<uint16_t>(x + q + 2);
      if (id == 0x0001) {
        size_t r = q + 4;
        if (usize == 0xffffffffu && r + 8 <= q + 4 + sz) usize = rd<uint64_t>(x + r), r += 8;
        if (csize == 0xffffffffu && r + 8 <= q + 4 + sz) csize = rd<uint64_t>(x + r), r += 8;
        if (local == 0xffffffffu && r + 8 <= q + 4 + sz) local = rd<uint64_t>(x + r), r += 8;
      }
      q += 4 + sz;
    }
    KVPR_CHECK(method == 0, name, ": zip entry '", entry, "' is compressed (method ", method,
               "); torch checkpoints are stored uncompressed");
    KVPR_CHECK(local + 30 <= n && rd<uint32_t>(d + local) == 0x04034b50u, name,
               ": zip local header of '", entry, "' missing (truncated file?)");
    uint64_t data = local + 30 + rd<uint16_t>(d + local + 26) + rd<uint16_t>(d + local + 28);
    KVPR_CHECK(data <= n && usize <= n - data, name, ": zip entry '", entry, "' (", usize,
               " bytes) overruns the file (truncated file?)");
    out[entry] = ZipEntry{data, usize};
    p += 46 + nlen + xlen + clen;
  }
  return out;
}

// ---------------------------------------------------------------- pickle
struct PyObj;
using PyRef = std::shared_ptr<PyObj>;

struct StorageRef {
  DType dtype;
  std::string key;
  int64_t numel;
};
struct TensorRef {
  std::shared_ptr<StorageRef> storage;
  int64_t offset = 0;
  Shape shape, stride;
};
struct Global {
  std::string module, name;
};
struct Mark {};
using PyList = std::vector<PyRef>;
struct PyTuple {
  std::vector<PyRef> items;
};
using PyDict = std::vector<std::pair<PyRef, PyRef>>;
struct Opaque {
  std::string what;
};

struct PyObj {
  std::variant<std::monostate, bool, int64_t, double, std::string, PyTuple, PyList, PyDict, Global,
               std::shared_ptr<StorageRef>, TensorRef, Opaque>
      v;
};

PyRef make(auto&& x) {
  auto p = std::make_shared<PyObj>();
  p->v = std::forward<decltype(x)>(x);
  return p;
}

bool storage_dtype(const std::string& cls, DType* out) {
  if (cls == "FloatStorage") *out = DType::F32;
  else if (cls == "HalfStorage") *out = DType::F16;
  else if (cls == "BFloat16Storage") *out = DType::BF16;
  else if (cls == "IntStorage") *out = DType::I32;
  else if (cls == "LongStorage") *out = DType::I64;
  else if (cls == "ByteStorage" || cls == "BoolStorage") *out = DType::U8;
  else return false;
  return true;
}

class Unpickler {
 public:
  Unpickler(const uint8_t* p, size_t n, std::string name) : p_(p), n_(n), name_(std::move(name)) {}

  PyRef load() {
    while (true) {
      uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                 // PROTO
        case 0x95: bytes(8); break;             // FRAME
        case '}': push(make(PyDict{})); break;  // EMPTY_DICT
        case ']': push(make(PyList{})); break;  // EMPTY_LIST
        case ')': push(make(PyTuple{})); break; // EMPTY_TUPLE
        case '(': stack_.push_back(nullptr); marks_.push_back(stack_.size() - 1); break;  // MARK
        case 'N': push(make(std::monostate{})); break;
        case 0x88: push(make(true)); break;
        case 0x89: push(make(false)); break;
        case 'K': push(make(static_cast<int64_t>(u8()))); break;
        case 'M': push(make(static_cast<int64_t>(rd<uint16_t>(bytes(2))))); break;
        case 'J': push(make(static_cast<int64_t>(rd<int32_t>(bytes(4))))); break;
        case 0x8a: {  // LONG1
          size_t len = u8();
          const uint8_t* b = bytes(len);
          KVPR_CHECK(len <= 8, "integer too large");
          int64_t v = 0;
          for (size_t i = 0; i < len; ++i) v |= static_cast<int64_t>(b[i]) << (8 * i);
          if (len > 0 && len < 8 && (b[len - 1] & 0x80)) v -= static_cast<int64_t>(1) << (8 * len);
          push(make(v));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          const uint8_t* b = bytes(8);
          uint64_t u = 0;
          for (int i = 0; i < 8; ++i) u = (u << 8) | b[i];
          double d;
          std::memcpy(&d, &u, 8);
          push(make(d));
          break;
        }
        case 'X': { size_t len = rd<uint32_t>(bytes(4)); push(make(str(len))); break; }
        case 0x8c: { size_t len = u8(); push(make(str(len))); break; }
        case 0x8d: { size_t len = rd<uint64_t>(bytes(8)); push(make(str(len))); break; }
        case 'B': { size_t len = rd<uint32_t>(bytes(4)); push(make(str(len))); break; }
        case 'C': { size_t len = u8(); push(make(str(len))); break; }
        case 'c': {  // GLOBAL "module\nname\n"
          std::string module = line(), nm = line();
          push(make(Global{module, nm}));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          PyRef nm = pop(), module = pop();
          push(make(Global{as_str(module), as_str(nm)}));
          break;
        }
        case 'q': memo_[u8()] = top(); break;
        case 'r': memo_[rd<uint32_t>(bytes(4))] = top(); break;
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'h': push(memo(u8())); break;
        case 'j': push(memo(rd<uint32_t>(bytes(4)))); break;
        case 't': push(make(PyTuple{pop_mark()})); break;
        case 0x85: { PyRef a = pop(); push(make(PyTuple{{a}})); break; }
        case 0x86: { PyRef b = pop(), a = pop(); push(make(PyTuple{{a, b}})); break; }
        case 0x87: { PyRef c = pop(), b = pop(), a = pop(); push(make(PyTuple{{a, b, c}})); break; }
        case 'a': { PyRef v = pop(); list(top()).push_back(v); break; }
        case 'e': { auto items = pop_mark(); auto& l = list(top()); l.insert(l.end(), items.begin(), items.end()); break; }
        case 's': { PyRef v = pop(), k = pop(); dict(top()).emplace_back(k, v); break; }
        case 'u': {
          auto items = pop_mark();
          KVPR_CHECK(items.size() % 2 == 0, "SETITEMS with an odd number of items");
          auto& d = dict(top());
          for (size_t i = 0; i < items.size(); i += 2) d.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'Q': push(persistent_load(pop())); break;  // BINPERSID
        case 'R': { PyRef args = pop(), fn = pop(); push(reduce(fn, args)); break; }
        case 0x81: { PyRef args = pop(), cls = pop(); push(reduce(cls, args)); break; }  // NEWOBJ
        case 'b': pop(); break;  // BUILD: state of objects we treat as plain containers
        case '.': return pop();  // STOP
        default: KVPR_THROW("unsupported pickle opcode 0x", std::hex, static_cast<int>(op));
      }
    }
  }

 private:
  uint8_t u8() { return *bytes(1); }
  const uint8_t* bytes(size_t k) {
    KVPR_CHECK(k <= n_ - i_, "pickle truncated");
    const uint8_t* r = p_ + i_;
    i_ += k;
    return r;
  }
  std::string str(size_t k) { return std::string(reinterpret_cast<const char*>(bytes(k)), k); }
  std::string line() {
    std::string s;
    while (true) {
      char c = static_cast<char>(u8());
      if (c == '\n') return s;
      s.push_back(c);
    }
  }
  void push(PyRef r) { stack_.push_back(std::move(r)); }
  PyRef pop() {
    KVPR_CHECK(!stack_.empty() && (marks_.empty() || stack_.size() - 1 > marks_.back()),
               "pickle stack underflow");
    PyRef r = std::move(stack_.back());
    stack_.pop_back();
    return r;
  }
  PyRef top() {
    KVPR_CHECK(!stack_.empty() && stack_.back(), "pickle stack underflow");
    return stack_.back();
  }
  std::vector<PyRef> pop_mark() {
    KVPR_CHECK(!marks_.empty(), "pickle MARK missing");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(m) + 1, stack_.end());
    stack_.resize(m);
    return items;
  }
  PyRef memo(size_t k) {
    auto it = memo_.find(k);
    KVPR_CHECK(it != memo_.end(), "pickle memo key ", k, " missing");
    return it->second;
  }
  static const std::string& as_str(const PyRef& r) {
    auto* s = std::get_if<std::string>(&r->v);
    KVPR_CHECK(s, "expected a string in the pickle");
    return *s;
  }
  static PyList& list(const PyRef& r) {
    auto* l = std::get_if<PyList>(&r->v);
    KVPR_CHECK(l, "APPEND to a non-list");
    return *l;
  }
  static PyDict& dict(const PyRef& r) {
    auto* d = std::get_if<PyDict>(&r->v);
    KVPR_CHECK(d, "SETITEM on a non-dict");
    return *d;
  }
  static const std::vector<PyRef>& tuple(const PyRef& r) {
    auto* t = std::get_if<PyTuple>(&r->v);
    KVPR_CHECK(t, "expected a tuple in the pickle");
    return t->items;
  }
  static int64_t integer(const PyRef& r) {
    auto* v = std::get_if<int64_t>(&r->v);
    KVPR_CHECK(v, "expected an integer in the pickle");
    return *v;
  }

  PyRef persistent_load(const PyRef& pid) {
    const auto& t = tuple(pid);
    KVPR_CHECK(t.size() >= 5 && as_str(t[0]) == "storage", "unexpected persistent id");
    auto* cls = std::get_if<Global>(&t[1]->v);
    KVPR_CHECK(cls, "storage type is not a class");
    auto s = std::make_shared<StorageRef>();
    KVPR_CHECK(storage_dtype(cls->name, &s->dtype), "unsupported storage type ", cls->module, ".",
               cls->name, " (supported: Float, Half, BFloat16, Int, Long, Byte, Bool)");
    s->key = as_str(t[2]);
    s->numel = integer(t[4]);
    return make(s);
  }

  PyRef reduce(const PyRef& fn, const PyRef& args) {
    auto* g = std::get_if<Global>(&fn->v);
    if (!g) return make(Opaque{"call of a non-global"});
    const std::string q = g->module + "." + g->name;
    if (q == "collections.OrderedDict") return make(PyDict{});
    if (q == "torch._utils._rebuild_tensor_v2" || q == "torch._utils._rebuild_tensor") {
      const auto& a = tuple(args);
      KVPR_CHECK(a.size() >= 4, "short _rebuild_tensor arguments");
      auto* st = std::get_if<std::shared_ptr<StorageRef>>(&a[0]->v);
      KVPR_CHECK(st, "tensor without storage");
      TensorRef t;
      t.storage = *st;
      t.offset = integer(a[1]);
      for (const auto& d : tuple(a[2])) t.shape.push_back(integer(d));
      for (const auto& d : tuple(a[3])) t.stride.push_back(integer(d));
      KVPR_CHECK(t.shape.size() == t.stride.size(), "tensor size and stride ranks differ");
      return make(std::move(t));
    }
    if (q == "torch._utils._rebuild_parameter" || q == "torch._utils._rebuild_parameter_with_state") {
      const auto& a = tuple(args);
      KVPR_CHECK(!a.empty(), "short _rebuild_parameter arguments");
      return a[0];
    }
    return make(Opaque{q});
  }

  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
  std::string name_;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<size_t, PyRef> memo_;
};

// Copies a strided tensor into a new contiguous buffer.
std::shared_ptr<std::vector<uint8_t>> gather_strided(const uint8_t* base, const Shape& shape,
                                                     const Shape& stride, size_t esize) {
  auto out = std::make_shared<std::vector<uint8_t>>(shape_numel(shape) * esize);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0, n = shape_numel(shape); i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * stride[d];
    std::memcpy(out->data() + i * esize, base + off * static_cast<int64_t>(esize), esize);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The state dict in data.pkl, unwrapped from {"state_dict": {...}} or {"model": {...}}.
const PyDict& state_dict_of(const PyRef& obj, const std::string& name) {
  auto* dict = std::get_if<PyDict>(&obj->v);
  if (dict && dict->size() <= 4) {
    for (const auto& [k, v] : *dict) {
      auto* ks = std::get_if<std::string>(&k->v);
      auto* inner = std::get_if<PyDict>(&v->v);
      if (ks && inner && (*ks == "state_dict" || *ks == "model")) {
        dict = inner;
        break;
      }
    }
  }
  KVPR_CHECK(dict, name, ": data.pkl does not hold a state dict");
  return *dict;
}

// One tensor of the archive: its view checked to lie inside its storage, the data mapped in
// place (or gathered when the view is strided).
TensorRecord tensor_record(const MappedFile& file, const std::map<std::string, ZipEntry>& entries,
                           const std::string& root, const std::string& name, const std::string& key,
                           const TensorRef& t) {
  TensorRecord r;
  r.name = key;
  r.file = name;
  r.dtype = t.storage->dtype;
  r.shape = t.shape;
  auto e = entries.find(root + "data/" + t.storage->key);
  KVPR_CHECK(e != entries.end(), name, ": tensor '", r.name, "': storage ", t.storage->key,
             " missing from the archive");
  const size_t es = dtype_size(r.dtype);
  KVPR_CHECK(e->second.size >= static_cast<uint64_t>(t.storage->numel) * es, name, ": tensor '", r.name,
             "': storage ", t.storage->key, " is truncated");
  // Extent of the view inside its storage.
  int64_t last = t.offset;
  bool empty = false, overflow = t.offset < 0;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    int64_t span;
    if (r.shape[d] < 0 || t.stride[d] < 0) overflow = true;
    else if (r.shape[d] == 0) empty = true;
    else overflow |= __builtin_mul_overflow(r.shape[d] - 1, t.stride[d], &span) ||
                     __builtin_add_overflow(last, span, &last);
  }
  KVPR_CHECK(!overflow, name, ": tensor '", r.name, "' has an invalid size or stride");
  KVPR_CHECK(empty || (t.offset >= 0 && last < t.storage->numel), name, ": tensor '", r.name,
             "' lies outside its storage");
  const uint8_t* base = file.data() + e->second.data_offset + t.offset * es;
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t d = r.shape.size(); d-- > 0;) {
    if (r.shape[d] != 1 && t.stride[d] != expect) contiguous = false;
    expect *= r.shape[d];
  }
  if (contiguous || empty) {
    r.data = base;
  } else {
    r.owned = gather_strided(base, r.shape, t.stride, es);
    r.data = r.owned->data();
  }
  return r;
}

}  // namespace

std::vector<TensorRecord> read_torch_zip(const MappedFile& file) {
  std::string name = file.path().substr(file.path().find_last_of('/') + 1);
  auto entries = read_zip_directory(file, name);
  std::string root;
  for (const auto& [e, _] : entries) {
    if (e.size() >= 9 && e.compare(e.size() - 9, 9, "/data.pkl") == 0) {
      root = e.substr(0, e.size() - 8);
      break;
    }
    if (e == "data.pkl") break;
  }
  auto pkl = entries.find(root + "data.pkl");
  KVPR_CHECK(pkl != entries.end(), name, ": no data.pkl in the archive (not a torch checkpoint)");
  auto bo = entries.find(root + "byteorder");
  if (bo != entries.end()) {
    std::string order(reinterpret_cast<const char*>(file.data() + bo->second.data_offset), bo->second.size);
    KVPR_CHECK(order == "little", name, ": big-endian checkpoints are not supported");
  }
  PyRef obj;
  try {
    obj = Unpickler(file.data() + pkl->second.data_offset, pkl->second.size, name).load();
  } catch (const Error& e) {
    KVPR_THROW(name, ": cannot read data.pkl: ", e.what());
  }
  std::vector<TensorRecord> out;
  for (const auto& [k, v] : state_dict_of(obj, name)) {
    auto* ks = std::get_if<std::string>(&k->v);
    auto* t = std::get_if<TensorRef>(&v->v);
    if (ks && t) out.push_back(tensor_record(file, entries, root, name, *ks, *t));  // else a version number, say
  }
  return out;
}

}  // namespace kvpr
