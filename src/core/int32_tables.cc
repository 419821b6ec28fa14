#include "core/int32_tables.h"

#include <string>

#include "core/device_access.h"
#include "dpa/error.h"

namespace dpa {

std::vector<int64_t> read_int32_vector(const TensorView& t, void* stream) {
  std::vector<int32_t> host;
  const int32_t* data = static_cast<const int32_t*>(t.data);
  int64_t stride = t.strides[0];
  if (t.device == Device::kCUDA) {
    const DeviceAccess* device = device_access();
    if (device == nullptr)
      throw Error(ErrorCode::kNotSupported, "cu_seqlens", "this build has no CUDA support");
    require(stride == 1, "cu_seqlens", "device-resident sequence tables must be contiguous");
    host.resize(size_t(t.numel()));
    device->copy_to_host(host.data(), t.data, host.size() * sizeof(int32_t), stream);
    data = host.data();
    stride = 1;
  }
  std::vector<int64_t> values(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) values[size_t(i)] = data[i * stride];
  return values;
}

std::vector<int64_t> lengths_from_cu(const std::vector<int64_t>& cu, const char* name) {
  require(cu[0] == 0, name, [&] { return "must start at 0, got " + std::to_string(cu[0]); });
  std::vector<int64_t> lengths(cu.size() - 1);
  for (size_t i = 0; i + 1 < cu.size(); ++i) {
    require(cu[i + 1] >= cu[i], name, [&] {
      return "must be non-decreasing (entry " + std::to_string(i + 1) + " is " +
             std::to_string(cu[i + 1]) + " < " + std::to_string(cu[i]) + ")";
    });
    lengths[i] = cu[i + 1] - cu[i];
  }
  return lengths;
}

}  // namespace dpa
