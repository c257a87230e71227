// Argument helpers every op's checks use, so that all ops word their errors alike.
#pragma once

#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <string>

namespace fused {

// A shape as "[a, b, c]", for error messages.
std::string shape_str(at::IntArrayRef s);

// An int[3] argument: one value stands for all three dims (max_pool3d's rule); an empty list gives `dflt` where
// `allow_empty`, else raises ValueError naming `name`, prefixed by `op`, as does any other length.
std::array<int64_t, 3> expand3(const char* op, const char* name, at::IntArrayRef v,
                               std::array<int64_t, 3> dflt = {0, 0, 0}, bool allow_empty = false);

}  // namespace fused
