// The tensor maps of the sm_90a kernel's whole-unit stores (the 16-bit training forms: store_unit_rows,
// epilogue.cuh): the outputs, selected values and offsets, each seen by the TMA unit as a 5-d tensor (w, c, h, d, n)
// with the output's strides, boxes of one unit's kTW columns x 32 channels x kTH rows, so that each tensor of a unit
// leaves shared memory by one `cp.async.bulk.tensor` where per-channel bulk copies took 96 a unit, issued lane after
// lane (their issue loop took ~16 % of the form's warp samples: Nsight Compute on an H100).
#pragma once

#include "conv_transpose3d_post_pool/cuda/params.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// Encodes p.unit_maps for p.out, p.sel (16-bit elements) and p.off (bytes) and returns true, or returns false where
// the TMA unit cannot take them (an address or a stride not a multiple of 16 bytes, rows not kTW apart, a dimension
// too large, or the driver lacks the encoder): the kernel then stores those units through the warps' rows.
bool encode_unit_maps(Params& p);

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
