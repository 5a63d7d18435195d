// gasloc's own parts for a Python loop: the model, the inner optimizers, the schedule and the data
// (parts.cpp), bound into gasloc._core by core.cpp.
#pragma once
#include <pybind11/pybind11.h>

void bind_parts(pybind11::module_& m);
