// tierkv._native: the pybind11 extension behind the `tierkv` package
// (python/tierkv/__init__.py re-exports what it defines).
#include "python/src/native.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "tierkv's C++ client, bound for Python; import tierkv instead.";
  tierkv::python::InitErrors();
  tierkv::python::RegisterTypes(m);
  tierkv::python::RegisterDevice(m);
  tierkv::python::RegisterClient(m);
  tierkv::python::RegisterBench(m);
}
