#include "common/arguments.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace fused {

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::array<int64_t, 3> expand3(const char* op, const char* name, at::IntArrayRef v, std::array<int64_t, 3> dflt,
                               bool allow_empty) {
  if (v.empty() && allow_empty) return dflt;
  TORCH_CHECK_VALUE(v.size() == 1 || v.size() == 3, op, ": ", name,
                    " must be a single int or a list of three ints, got ", shape_str(v));
  if (v.size() == 1) return {v[0], v[0], v[0]};
  return {v[0], v[1], v[2]};
}

}  // namespace fused
