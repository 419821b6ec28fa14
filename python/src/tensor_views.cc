#include "tensor_views.h"

#include <string>

#include "dpa/error.h"

namespace nb = nanobind;

namespace dpa::python {
namespace {

DType dtype_from_dlpack(const nb::dlpack::dtype& t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  require(t.lanes == 1, name, "must not be a vector dtype");
  if (t.code == uint8_t(Code::Float) && t.bits == 16) return DType::kFloat16;
  if (t.code == uint8_t(Code::Float) && t.bits == 32) return DType::kFloat32;
  if (t.code == uint8_t(Code::Float) && t.bits == 64) return DType::kFloat64;
  if (t.code == uint8_t(Code::Bfloat) && t.bits == 16) return DType::kBFloat16;
  if (t.code == uint8_t(Code::Int) && t.bits == 32) return DType::kInt32;
  if (t.code == uint8_t(Code::Bool) && t.bits == 8) return DType::kBool;
  throw Error(ErrorCode::kInvalidArgument, name,
              "has a dtype dpa does not take (DLPack code " + std::to_string(t.code) + ", " +
                  std::to_string(t.bits) + " bits)");
}

void set_extents(TensorView& view, nb::handle shape, nb::handle strides, const char* name) {
  const size_t ndim = nb::len(shape);
  require(
      ndim >= 1 && ndim <= size_t(kMaxDims), name,
      "must have 1 to " + std::to_string(kMaxDims) + " dimensions, got " + std::to_string(ndim));
  require(nb::len(strides) == ndim, name, "has strides of another rank than its shape");
  view.ndim = int(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    view.shape[d] = nb::cast<int64_t>(shape[d]);
    view.strides[d] = nb::cast<int64_t>(strides[d]);
  }
}

TensorView from_view_tuple(nb::handle object, const char* name) {
  nb::tuple tuple = nb::borrow<nb::tuple>(object);
  require(nb::len(tuple) == 5, name,
          "a view tuple must be (data_ptr, dtype, device, shape, strides)");
  TensorView view;
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(tuple[0]));
  const int dtype = nb::cast<int>(tuple[1]);
  require(dtype >= int(DType::kFloat16) && dtype <= int(DType::kBool), name,
          "has an unknown dtype code " + std::to_string(dtype));
  view.dtype = DType(dtype);
  const int device = nb::cast<int>(tuple[2]);
  view.device = device < 0 ? Device::kCPU : Device::kCUDA;
  view.device_index = device < 0 ? 0 : device;
  set_extents(view, tuple[3], tuple[4], name);
  return view;
}

TensorView from_dlpack(nb::handle object, const char* name, Keepalive& keepalive) {
  nb::ndarray<> array;
  if (!nb::try_cast(object, array))
    throw Error(
        ErrorCode::kInvalidArgument, name,
        "must be a tensor or array (DLPack), got " + nb::cast<std::string>(nb::str(object.type())));
  TensorView view;
  view.data = array.data();
  view.dtype = dtype_from_dlpack(array.dtype(), name);
  const int device_type = array.device_type();
  if (device_type == nb::device::cpu::value) {
    view.device = Device::kCPU;
  } else if (device_type == nb::device::cuda::value) {
    view.device = Device::kCUDA;
    view.device_index = array.device_id();
  } else {
    throw Error(ErrorCode::kInvalidArgument, name,
                "is on a device dpa does not run on (DLPack device type " +
                    std::to_string(device_type) + ")");
  }
  require(array.ndim() >= 1 && array.ndim() <= size_t(kMaxDims), name,
          "must have 1 to " + std::to_string(kMaxDims) + " dimensions");
  view.ndim = int(array.ndim());
  for (size_t d = 0; d < array.ndim(); ++d) {
    view.shape[d] = int64_t(array.shape(d));
    view.strides[d] = array.stride(d);
  }
  keepalive.push_back(std::move(array));
  return view;
}

}  // namespace

TensorView to_view(nb::handle object, const char* name, Keepalive& keepalive) {
  if (object.is_none()) return {};
  if (nb::isinstance<nb::tuple>(object)) return from_view_tuple(object, name);
  return from_dlpack(object, name, keepalive);
}

}  // namespace dpa::python
