// Internal data layout of context parallelism (src/cp).
//
// A sequence pair (q side, kv side) of batch entry b is cut into 2*cp chunks per side; chunk x
// of sequence b covers unsharded positions [x * chunk_b, (x + 1) * chunk_b). A rank works on
// *chunk sets*: `Packed` buffers of rows ordered (chunk slot, b, row within the chunk), i.e.
// one chunk of every sequence after another, [slots * rows_per_chunk, heads, dim], contiguous.
// A chunk slot of a Packed set is a thd tensor of its own: the tiles (tile.h) view it with
// cu_seqlens = the valid lengths and cu_seqlens_padded = the chunk's row offsets.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dpa/cp.h"

namespace dpa::cp {

// The per-sequence chunk geometry of one side (q or kv); identical on every rank.
struct SideGeometry {
  std::vector<int64_t> length;       // [b] unsharded actual length
  std::vector<int64_t> chunk;        // [b] rows per chunk (padded slot / (2 cp))
  std::vector<int64_t> prefix;       // [b] first row of sequence b inside a chunk slot
  std::vector<int64_t> local_start;  // [b] thd: first local row of sequence b; 0 for bshd/sbhd
  int64_t rows_per_chunk = 0;        // sum of chunk[b]

  // Rows of chunk x of sequence b that hold real tokens (the rest is padding).
  int64_t valid(int64_t b, int64_t x) const {
    int64_t v = length[size_t(b)] - x * chunk[size_t(b)];
    return v < 0 ? 0 : (v > chunk[size_t(b)] ? chunk[size_t(b)] : v);
  }
  int64_t position(int64_t b, int64_t x) const { return x * chunk[size_t(b)]; }
};

struct Geometry {
  Format format = Format::kBSHD;
  int cp = 1;
  int64_t batch = 0;
  SideGeometry q, kv;
  std::vector<int64_t> diagonal;  // [b] delta of the unsharded pair (bottom-right: Lkv - Lq)
  int64_t window_left = -1, window_right = -1;
};

// Where a chunk set lives: host memory, or device memory on CUDA device `index`, whose contents
// are ordered on `stream` (every device operation on the set is enqueued there; a
// communicator's stream waits for it before a send: cp_exchange.h, order_for_comm).
struct Placement {
  Device device = Device::kCPU;
  int index = 0;
  void* stream = nullptr;  // cudaStream_t
  bool on_device() const { return device == Device::kCUDA; }
};

// A contiguous [rows, heads, dim] buffer of one dtype, in host or device memory. Copies are
// deep (a copy is a separate buffer, as the ring's receive buffers need), in the same place.
struct Packed {
  DType dtype = DType::kFloat32;
  int64_t rows = 0, heads = 0, dim = 0;
  Placement place;

  Packed() = default;
  Packed(DType type, int64_t r, int64_t h, int64_t d, Placement where = {});
  // A new buffer in the place of `where` (its contents undefined on the device, zero on the
  // host).
  static Packed alike(const Packed& where, DType type, int64_t r, int64_t h, int64_t d) {
    return Packed(type, r, h, d, where.place);
  }
  Packed(const Packed& other);
  Packed& operator=(const Packed& other);
  Packed(Packed&&) noexcept = default;
  Packed& operator=(Packed&&) noexcept = default;

  int64_t numel() const { return rows * heads * dim; }
  size_t size_bytes() const { return size_t(numel()) * dtype_size(dtype); }
  size_t row_bytes() const { return size_t(heads * dim) * dtype_size(dtype); }
  void* data() { return place.on_device() ? device_.get() : host_.data(); }
  const void* data() const { return place.on_device() ? device_.get() : host_.data(); }
  // Element access: host sets only.
  float* f32() { return reinterpret_cast<float*>(host_.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(host_.data()); }
  // An fp32 set's data wherever it lives (device kernels and copies take it).
  float* f32_data() { return static_cast<float*>(data()); }
  // thd view [count, heads, dim] of rows [first, first + count), on the set's device.
  TensorView view(int64_t first, int64_t count) const;

 private:
  std::vector<unsigned char> host_;
  std::shared_ptr<void> device_;  // device memory (cp/device_sets.h), owned by this set alone
};

// The chunks (global chunk indices) of rank `rank`'s shard: {rank, 2 cp - 1 - rank}.
inline std::vector<int> rank_chunks(int cp, int rank) { return {rank, 2 * cp - 1 - rank}; }

// User-local tensor <-> the rank's own 2-slot Packed set (all heads), the set in `where` (the
// tensor on the same device). unpack_local converts an fp32 set to the tensor's dtype.
Packed pack_local(const Geometry& g, const SideGeometry& side, const TensorView& local,
                  const Placement& where = {});
void unpack_local(const Geometry& g, const SideGeometry& side, const Packed& packed,
                  const TensorView& local);
// LSE: user-local [b, H, s/cp] / thd [H, t/cp]  <->  Packed fp32 [rows, H, 1].
Packed pack_lse(const Geometry& g, const TensorView& local, int64_t heads,
                const Placement& where = {});
void unpack_lse(const Geometry& g, const Packed& packed, const TensorView& local);

// [rows, H, d] -> [parts][rows, H / parts, d] (block p holds heads [p H/parts, (p+1) H/parts)).
Packed split_heads(const Packed& in, int parts);
// The inverse.
Packed merge_heads(const Packed& in, int parts);
// GQA for head-sharding: [rows, G, d] -> [rows, G * factor, d] (head g' reads g' / factor).
Packed replicate_heads(const Packed& in, int64_t factor);
// Sums the replicas back: [rows, G * factor, d] fp32 -> [rows, G, d] fp32.
Packed sum_replicas(const Packed& in, int64_t factor);

// Converts to another dtype (fp32 accumulators <-> storage dtype; on the device from fp32 only).
// Every operation here keeps its result where its input lives (Placement).
Packed convert(const Packed& in, DType dtype);
// dst += src (dst fp32), for `count` rows of src starting at src_row, into dst rows at dst_row.
void accumulate_rows(Packed& dst, int64_t dst_row, const Packed& src, int64_t src_row,
                     int64_t count);
// Every element of an fp32 set set to `value`.
void fill(Packed& set, float value);

}  // namespace dpa::cp
