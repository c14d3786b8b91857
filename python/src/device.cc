// tierkv.RegisteredDevice: KV memory the engine owns (numpy arrays or torch
// CPU tensors), registered as a RegisteredDeviceTier without a copy. The
// arrays are read through their own metadata (data pointer, shape, byte
// strides, element type), checked against the store's KvLayout, and kept
// alive by the device, which every client using it keeps alive in turn.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "python/src/native.h"
#include "tierkv/kv_layout.h"

namespace tierkv::python {
namespace {

// What the device tier needs to know of one array or tensor.
struct TensorView {
  std::byte* data = nullptr;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // Bytes.
  size_t element_size = 0;
  std::string dtype;  // As the library names it: "torch.bfloat16", "uint16".
  bool matches_dtype = false;
};

bool IsTorchTensor(const py::handle& obj) {
  py::object type = py::type::of(obj);
  return py::hasattr(type, "__module__") &&
         py::str(type.attr("__module__"))
                 .cast<std::string>()
                 .rfind("torch", 0) == 0 &&
         py::hasattr(obj, "data_ptr") && py::hasattr(obj, "stride");
}

// numpy has no bfloat16: a bf16 cache is viewed as 16-bit integers.
bool NumpyDTypeMatches(const py::dtype& dtype, DType want) {
  // Bytes are copied as they are: another byte order would be stored, and
  // served to every worker, as other values.
  constexpr char kForeignOrder =
      std::endian::native == std::endian::little ? '>' : '<';
  if (dtype.byteorder() == kForeignOrder) return false;
  const char kind = dtype.kind();
  const size_t size = static_cast<size_t>(dtype.itemsize());
  switch (want) {
    case DType::kF32:
      return kind == 'f' && size == 4;
    case DType::kF16:
      return kind == 'f' && size == 2;
    case DType::kBF16:
      return (kind == 'u' || kind == 'i') && size == 2;
  }
  return false;
}

std::string TorchDTypeFor(DType want) {
  switch (want) {
    case DType::kF32:
      return "torch.float32";
    case DType::kF16:
      return "torch.float16";
    case DType::kBF16:
      return "torch.bfloat16";
  }
  return "?";
}

TensorView ViewOf(const py::handle& obj, DType want, const std::string& what) {
  TensorView view;
  if (IsTorchTensor(obj)) {
    const std::string device = py::str(obj.attr("device").attr("type"));
    if (device != "cpu") {
      Raise(
          Status::InvalidArgument(what + " is on device '" + device +
                                  "'; this build registers CPU tensors only"));
    }
    view.data =
        reinterpret_cast<std::byte*>(obj.attr("data_ptr")().cast<uintptr_t>());
    view.element_size = obj.attr("element_size")().cast<size_t>();
    view.shape = py::cast<std::vector<int64_t>>(obj.attr("shape"));
    for (int64_t s : py::cast<std::vector<int64_t>>(obj.attr("stride")())) {
      view.strides.push_back(s * static_cast<int64_t>(view.element_size));
    }
    view.dtype = py::str(obj.attr("dtype"));
    view.matches_dtype = view.dtype == TorchDTypeFor(want);
    return view;
  }
  if (!py::isinstance<py::array>(obj)) {
    Raise(Status::InvalidArgument(
        what + " is a " +
        std::string(py::str(py::type::of(obj).attr("__name__"))) +
        ", not a numpy array or a torch tensor"));
  }
  auto array = py::reinterpret_borrow<py::array>(obj);
  if (!array.writeable()) {
    Raise(Status::InvalidArgument(what + " is a read-only numpy array"));
  }
  view.data = static_cast<std::byte*>(array.mutable_data());
  view.element_size = static_cast<size_t>(array.itemsize());
  for (py::ssize_t d = 0; d < array.ndim(); ++d) {
    view.shape.push_back(array.shape(d));
    view.strides.push_back(array.strides(d));
  }
  view.dtype = py::str(array.dtype());
  view.matches_dtype = NumpyDTypeMatches(array.dtype(), want);
  return view;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

// Raises unless `view` has shape `want` (-1: any size) and `layout`'s dtype.
void CheckShape(const TensorView& view, const std::vector<int64_t>& want,
                const std::string& what, const std::string& dims,
                const KvLayout& layout) {
  bool ok = view.shape.size() == want.size();
  for (size_t i = 0; ok && i < want.size(); ++i) {
    ok = want[i] < 0 || view.shape[i] == want[i];
  }
  if (!ok) {
    std::string expected = "[";
    for (size_t i = 0; i < want.size(); ++i) {
      expected += (i ? ", " : "") +
                  (want[i] < 0 ? std::string("*") : std::to_string(want[i]));
    }
    Raise(Status::InvalidArgument(what + " has shape " + ShapeText(view.shape) +
                                  "; the layout (" + layout.ToString() +
                                  ") needs " + expected + "] (" + dims + ")"));
  }
  if (!view.matches_dtype) {
    Raise(Status::InvalidArgument(
        what + " has dtype " + view.dtype + "; the layout's dtype is " +
        std::string(DTypeName(layout.dtype)) +
        " (torch: " + TorchDTypeFor(layout.dtype) + "; numpy: " +
        (layout.dtype == DType::kBF16
             ? "uint16 or int16 views"
             : (layout.dtype == DType::kF16 ? "float16" : "float32")) +
        ", in the machine's byte order)"));
  }
  for (int64_t s : view.strides) {
    if (s <= 0) {
      Raise(Status::InvalidArgument(
          what +
          " has a stride <= 0 (a broadcast or reversed view); "
          "register the tensor the engine writes"));
    }
  }
}

// Raises unless the innermost [heads, head_dim] of `view` (its last two
// dimensions) are densely packed, as the copies read them.
void CheckDenseHeads(const TensorView& view, const std::string& what) {
  const size_t n = view.shape.size();
  const auto elem = static_cast<int64_t>(view.element_size);
  if (view.strides[n - 1] != elem ||
      view.strides[n - 2] != view.shape[n - 1] * elem) {
    Raise(Status::InvalidArgument(
        what +
        ": its [heads, head_dim] dimensions must be densely packed "
        "(strides " +
        std::to_string(view.shape[n - 1] * elem) + ", " + std::to_string(elem) +
        " bytes), not " + std::to_string(view.strides[n - 2]) + ", " +
        std::to_string(view.strides[n - 1])));
  }
}

struct Shard {
  int32_t first_head = 0;
  int32_t num_heads = 0;
};

Shard ShardOf(const KvLayout& layout, int32_t rank, int32_t num_ranks) {
  if (num_ranks < 1 || rank < 0 || rank >= num_ranks) {
    Raise(Status::InvalidArgument(
        "rank " + std::to_string(rank) +
        " is not in [0, num_ranks=" + std::to_string(num_ranks) + ")"));
  }
  if (layout.num_kv_heads % num_ranks != 0) {
    Raise(Status::InvalidArgument(
        "num_kv_heads " + std::to_string(layout.num_kv_heads) +
        " is not divisible by num_ranks " + std::to_string(num_ranks)));
  }
  const int32_t heads = layout.num_kv_heads / num_ranks;
  return {rank * heads, heads};
}

std::shared_ptr<RegisteredDevice> Build(const KvLayout& layout,
                                        int32_t num_blocks,
                                        std::vector<LayerMemory> layers,
                                        Shard shard, int32_t rank,
                                        int32_t num_ranks,
                                        std::vector<py::object> owners) {
  if (num_blocks < 1) {
    Raise(Status::InvalidArgument("the tensors hold no block (num_blocks 0)"));
  }
  RegisteredDeviceOptions options{.layout = layout,
                                  .num_blocks = num_blocks,
                                  .layers = std::move(layers),
                                  .first_head = shard.first_head,
                                  .num_heads = shard.num_heads};
  auto device = std::make_shared<RegisteredDevice>();
  device->tier = ValueOrRaise(RegisteredDeviceTier::Create(std::move(options)));
  // A torch tensor's storage too: `t.data = ...` or `t.set_(...)` gives the
  // tensor other memory and would free the registered one under the copy
  // engine. (`t.resize_` to more bytes reallocates the storage itself:
  // registered tensors must not be resized.)
  const size_t tensors = owners.size();
  for (size_t i = 0; i < tensors; ++i) {
    if (!IsTorchTensor(owners[i])) continue;
    owners.push_back(py::hasattr(owners[i], "untyped_storage")
                         ? owners[i].attr("untyped_storage")()
                         : owners[i].attr("storage")());
  }
  device->owners = std::move(owners);
  device->rank = rank;
  device->num_ranks = num_ranks;
  return device;
}

std::string LayerName(size_t layer) {
  return "kv_caches[" + std::to_string(layer) + "]";
}

std::shared_ptr<RegisteredDevice> Paged(const KvLayout& layout,
                                        const py::object& kv_caches,
                                        int32_t rank, int32_t num_ranks) {
  const Shard shard = ShardOf(layout, rank, num_ranks);
  std::vector<py::object> tensors;
  const py::object values = py::isinstance<py::dict>(kv_caches)
                                ? kv_caches.attr("values")()
                                : kv_caches;
  for (py::handle t : values)
    tensors.push_back(py::reinterpret_borrow<py::object>(t));
  if (static_cast<int32_t>(tensors.size()) != layout.num_layers) {
    Raise(Status::InvalidArgument(
        "kv_caches has " + std::to_string(tensors.size()) +
        " tensors; the layout has " + std::to_string(layout.num_layers) +
        " layers (one tensor per layer, in order)"));
  }
  int64_t num_blocks = -1;
  std::vector<LayerMemory> layers;
  for (size_t l = 0; l < tensors.size(); ++l) {
    const TensorView v = ViewOf(tensors[l], layout.dtype, LayerName(l));
    CheckShape(
        v, {2, num_blocks, layout.block_size, shard.num_heads, layout.head_dim},
        LayerName(l), "2, num_blocks, block_size, heads, head_dim", layout);
    CheckDenseHeads(v, LayerName(l));
    num_blocks = v.shape[1];
    layers.push_back({.key = v.data,
                      .value = v.data + v.strides[0],
                      .block_stride = static_cast<size_t>(v.strides[1]),
                      .token_stride = static_cast<size_t>(v.strides[2])});
  }
  return Build(layout, static_cast<int32_t>(num_blocks), std::move(layers),
               shard, rank, num_ranks, std::move(tensors));
}

std::shared_ptr<RegisteredDevice> CrossLayer(const KvLayout& layout,
                                             const py::object& tensor,
                                             int32_t rank, int32_t num_ranks) {
  const Shard shard = ShardOf(layout, rank, num_ranks);
  const TensorView v = ViewOf(tensor, layout.dtype, "tensor");
  CheckShape(v,
             {-1, layout.num_layers, 2, layout.block_size, shard.num_heads,
              layout.head_dim},
             "tensor", "num_blocks, num_layers, 2, block_size, heads, head_dim",
             layout);
  CheckDenseHeads(v, "tensor");
  std::vector<LayerMemory> layers;
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    std::byte* key = v.data + l * v.strides[1];
    layers.push_back({.key = key,
                      .value = key + v.strides[2],
                      .block_stride = static_cast<size_t>(v.strides[0]),
                      .token_stride = static_cast<size_t>(v.strides[3])});
  }
  return Build(layout, static_cast<int32_t>(v.shape[0]), std::move(layers),
               shard, rank, num_ranks, {tensor});
}

std::shared_ptr<RegisteredDevice> FromLayers(const KvLayout& layout,
                                             const py::sequence& pairs,
                                             int32_t rank, int32_t num_ranks) {
  const Shard shard = ShardOf(layout, rank, num_ranks);
  if (static_cast<int32_t>(py::len(pairs)) != layout.num_layers) {
    Raise(
        Status::InvalidArgument("layers has " + std::to_string(py::len(pairs)) +
                                " (key, value) pairs; the layout has " +
                                std::to_string(layout.num_layers) + " layers"));
  }
  int64_t num_blocks = -1;
  std::vector<LayerMemory> layers;
  std::vector<py::object> owners;
  for (size_t l = 0; l < py::len(pairs); ++l) {
    auto pair = pairs[l].cast<py::sequence>();
    if (py::len(pair) != 2) {
      Raise(Status::InvalidArgument("layers[" + std::to_string(l) +
                                    "] is not a (key, value) pair"));
    }
    TensorView kv[2];
    for (int p = 0; p < 2; ++p) {
      const std::string what = "layers[" + std::to_string(l) + "][" +
                               (p ? "1] (value)" : "0] (key)");
      kv[p] = ViewOf(pair[p], layout.dtype, what);
      CheckShape(
          kv[p],
          {num_blocks, layout.block_size, shard.num_heads, layout.head_dim},
          what, "num_blocks, block_size, heads, head_dim", layout);
      CheckDenseHeads(kv[p], what);
      num_blocks = kv[p].shape[0];
      owners.push_back(pair[p]);
    }
    if (kv[0].strides != kv[1].strides) {
      Raise(Status::InvalidArgument(
          "layers[" + std::to_string(l) +
          "]: key and value have different strides; they must share one "
          "block stride and one token stride"));
    }
    layers.push_back({.key = kv[0].data,
                      .value = kv[1].data,
                      .block_stride = static_cast<size_t>(kv[0].strides[0]),
                      .token_stride = static_cast<size_t>(kv[0].strides[1])});
  }
  return Build(layout, static_cast<int32_t>(num_blocks), std::move(layers),
               shard, rank, num_ranks, std::move(owners));
}

}  // namespace

void RegisterDevice(py::module_& m) {
  py::class_<RegisteredDevice, std::shared_ptr<RegisteredDevice>>(
      m, "RegisteredDevice",
      "Device memory the engine owns (numpy arrays or torch CPU tensors), "
      "registered without a copy; holds references to the tensors.")
      .def_static("paged", &Paged, py::arg("layout"), py::arg("kv_caches"),
                  py::arg("rank") = 0, py::arg("num_ranks") = 1,
                  "vLLM's paged layout: per layer (a list in layer order, or "
                  "a dict name -> tensor in layer order) a tensor shaped "
                  "[2, num_blocks, block_size, heads_per_rank, head_dim].")
      .def_static("cross_layer", &CrossLayer, py::arg("layout"),
                  py::arg("tensor"), py::arg("rank") = 0,
                  py::arg("num_ranks") = 1,
                  "One tensor shaped [num_blocks, num_layers, 2, block_size, "
                  "heads_per_rank, head_dim].")
      .def_static("from_layers", &FromLayers, py::arg("layout"),
                  py::arg("layers"), py::arg("rank") = 0,
                  py::arg("num_ranks") = 1,
                  "Per layer a (key, value) pair of views shaped "
                  "[num_blocks, block_size, heads_per_rank, head_dim], "
                  "[heads, head_dim] dense, K and V with the same strides.")
      .def_property_readonly(
          "num_blocks",
          [](const RegisteredDevice& d) { return d.tier->num_blocks(); })
      .def_property_readonly(
          "shard_bytes",
          [](const RegisteredDevice& d) { return d.tier->shard_bytes(); })
      .def_property_readonly(
          "block_bytes",
          [](const RegisteredDevice& d) { return d.tier->block_bytes(); })
      .def_property_readonly(
          "layout",
          [](const RegisteredDevice& d) { return d.tier->options().layout; })
      .def_readonly("rank", &RegisteredDevice::rank)
      .def_readonly("num_ranks", &RegisteredDevice::num_ranks)
      .def("__repr__", [](const RegisteredDevice& d) {
        return "RegisteredDevice(num_blocks=" +
               std::to_string(d.tier->num_blocks()) +
               ", rank=" + std::to_string(d.rank) + "/" +
               std::to_string(d.num_ranks) + ", " +
               d.tier->options().layout.ToString() + ")";
      });
}

}  // namespace tierkv::python
