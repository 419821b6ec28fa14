#include "cp/device_stage.h"

#include "dpa/error.h"

namespace dpa::cp {

#if defined(DPA_WITH_CUDA)

namespace {

size_t bytes_of(const TensorView& t) { return size_t(t.numel()) * dtype_size(t.dtype); }

void require_contiguous_host(const TensorView& t) {
  if (t.device != Device::kCPU || !t.is_contiguous())
    throw Error(ErrorCode::kInternal, "", "device staging takes contiguous host tensors");
}

}  // namespace

DeviceStage::DeviceStage(int device_index) : device_index_(device_index) {}

TensorView DeviceStage::allocate(const TensorView& host) {
  memory_.emplace_back(bytes_of(host), device_index_);
  TensorView view = TensorView::contiguous(memory_.back().get(), host.dtype, host.shape.data(),
                                           host.ndim, Device::kCUDA);
  view.device_index = device_index_;
  return view;
}

TensorView DeviceStage::allocate_like(const TensorView& host) {
  if (!host.defined()) return {};
  TensorView view = allocate(host);
  cuda::fill_device_bytes(view.data, 0xFF, bytes_of(host), device_index_);
  return view;
}

TensorView DeviceStage::upload(const TensorView& host) {
  if (!host.defined()) return {};
  require_contiguous_host(host);
  TensorView view = allocate(host);  // no poison: the copy writes every byte
  cuda::copy_host_to_device(view.data, host.data, bytes_of(host), device_index_);
  return view;
}

void DeviceStage::download(const TensorView& device, const TensorView& host) const {
  require_contiguous_host(host);
  cuda::copy_device_to_host(host.data, device.data, bytes_of(host), device_index_);
}

#else

DeviceStage::DeviceStage(int device_index) : device_index_(device_index) {
  throw Error(ErrorCode::kNotSupported, "q",
              "CUDA tensors under context parallelism need a build with CUDA");
}
TensorView DeviceStage::upload(const TensorView&) { return {}; }
TensorView DeviceStage::allocate(const TensorView&) { return {}; }
TensorView DeviceStage::allocate_like(const TensorView&) { return {}; }
void DeviceStage::download(const TensorView&, const TensorView&) const {}

#endif

}  // namespace dpa::cp
