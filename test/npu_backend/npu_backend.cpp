// A minimal PrivateUse1 backend for torch_serial_testing's device tests.
//
// It is renamed "npu" from Python (see __init__.py).  Tensors live in host memory
// (malloc), so every byte can be checked, but they are PrivateUse1 tensors in every
// other respect: their own dispatch key, allocator, device guard and hooks, storage
// location tag "npu:0", and torch.save / torch.load go through torch's own
// privateuse1 code paths.  A handful of kernels are native (the ones serialization
// and tensor construction cannot do without); everything else runs on the CPU
// through at::native::cpu_fallback.
#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstring>

namespace tst_npu {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kDeviceCount = 1;

c10::DispatchKeySet backend_keys() {
  return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
}

// -- memory: plain host allocations tagged with the device -----------------------------

struct HostMemoryAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    return {data, data, &release, c10::Device(kDeviceType, 0)};
  }
  static void release(void* data) {
    if (data != nullptr) {
      c10::free_cpu(data);
    }
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostMemoryAllocator allocator;

// -- one device, index 0 ---------------------------------------------------------------

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index == 0 || index == -1, "npu device index ", static_cast<int>(index),
              " is out of range: this backend has ", static_cast<int>(kDeviceCount), " device");
}

struct OneDeviceGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDeviceType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d.index());
    return c10::Device(kDeviceType, 0);
  }
  c10::Device getDevice() const override { return c10::Device(kDeviceType, 0); }
  void setDevice(c10::Device d) const override { check_index(d.index()); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kDeviceType, 0));
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kDeviceType, 0));
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
};

// No `override` here on purpose: this interface gained methods and const qualifiers across torch
// releases (isBuilt/isAvailable arrived in 2.6), and the backend must compile against each of them;
// on a torch whose interface lacks a method, the function is simply unused.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const { return true; }
  bool isAvailable() const { return true; }
  bool hasPrimaryContext(c10::DeviceIndex index) const { return index == 0; }
  at::Device getDeviceFromPtr(void*) const { return c10::Device(kDeviceType, 0); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const {
    static at::Generator generator = at::make_generator<at::CPUGeneratorImpl>();
    return generator;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), nbytes);
  }
};

// -- kernels -----------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  if (device.has_value()) {
    check_index(device->index());
  }
  return at::detail::empty_generic(size, &allocator, backend_keys(), c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device> device, std::optional<bool>) {
  if (device.has_value()) {
    check_index(device->index());
  }
  return at::detail::empty_strided_generic(size, stride, &allocator, backend_keys(),
                                           c10::dtype_or_default(dtype));
}

// A CPU tensor aliasing the same host memory (no copy): lets CPU kernels read and write it.
at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kDeviceType) {
    return t;
  }
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  for (const at::Tensor* t : {&self, &dst}) {
    TORCH_CHECK(t->device().type() == at::kCPU || t->device().type() == kDeviceType,
                "npu copies go to and from cpu only, got ", t->device());
  }
  if (self.numel() != 0) {
    host_alias(dst).copy_(host_alias(self));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  at::OptionalIntArrayRef stride_opt =
      stride.data() != nullptr ? at::OptionalIntArrayRef(stride) : std::nullopt;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, stride_opt, /*resize_storage=*/true);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, source, 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (!self.is_same(source)) {
    set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                       source.strides());
  }
  return self;
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  at::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  at::native::maybe_resize_storage_cpu(
      impl, at::detail::computeStorageNbytesContiguous(size, impl->dtype().itemsize(),
                                                       impl->storage_offset()));
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve,
                "resize_ does not take memory format Preserve");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);
}

c10::DeviceIndex device_count() { return kDeviceCount; }

}  // namespace tst_npu

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &tst_npu::allocator);
C10_REGISTER_GUARD_IMPL(PrivateUse1, tst_npu::OneDeviceGuard);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &tst_npu::empty_memory_format);
  m.impl("empty_strided", &tst_npu::empty_strided);
  m.impl("_copy_from", &tst_npu::copy_from);
  m.impl("_copy_from_and_resize", &tst_npu::copy_from_and_resize);
  m.impl("view", &at::native::view);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("set_.source_Storage", &tst_npu::set_storage);
  m.impl("set_.source_Storage_storage_offset", &tst_npu::set_storage_offset);
  m.impl("set_.source_Tensor", &tst_npu::set_tensor);
  m.impl("resize_", &tst_npu::resize);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tst_npu::fallback>());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_hooks", [] {
    static tst_npu::Hooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }, "Register the backend's PrivateUse1 hooks (once per process).");
  m.def("device_count", &tst_npu::device_count, "Number of devices (always 1).");
}
