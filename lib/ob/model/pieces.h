// Pieces of tensor-parallel shards (see tensor_parallel.h, "Pieces"): which
// pieces of a common refinement a rank holds. Torch-free, so that the
// runtime's topology (ob_core) and the tensor code count them alike.
#pragma once

namespace ob::model {

// The pieces rank r of t holds in a refinement of T: [first, first + T/t).
// REQUIRES: t divides T.
inline int FirstPiece(int t, int r, int T) { return r * (T / t); }

}  // namespace ob::model
