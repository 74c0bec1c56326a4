#include "engine/cuda/recurrent.h"

#include <string>

#include "engine/cuda/cuda_status.h"

namespace shoal::engine::cuda {

Status CheckRnnGeometry(const RnnGeometry& g) {
  if (g.cell < 0 || g.cell > 2)
    return InvalidArgument("recurrent step: cell " + std::to_string(g.cell) + " is not 0-2");
  if (g.seq < 0 || g.batch < 0 || g.hidden < 0)
    return InvalidArgument("recurrent step: negative sizes");
  if ((g.dirs != 1 && g.dirs != 2) || g.dir < 0 || g.dir >= g.dirs)
    return InvalidArgument("recurrent step: direction " + std::to_string(g.dir) + " of " +
                           std::to_string(g.dirs));
  if (g.seq > 0 && (g.step < 0 || g.step >= g.seq))
    return InvalidArgument("recurrent step: step " + std::to_string(g.step) + " of " +
                           std::to_string(g.seq));
  for (const RnnActivationKernel& a : g.act)
    if (a.kind < 0 || a.kind > 10)
      return InvalidArgument("recurrent step: activation kind " + std::to_string(a.kind) +
                             " is not 0-10");
  return Status::Ok();
}

Status RnnStateIn(const float* initial, float* state, const RnnGeometry& g, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRnnGeometry(g));
  return CudaStatus(internal::LaunchRnnStateIn(initial, state, g, stream),
                    "recurrent state kernel launch");
}

Status RnnStateOut(const float* state, float* out, const RnnGeometry& g, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRnnGeometry(g));
  return CudaStatus(internal::LaunchRnnStateOut(state, out, g, stream),
                    "recurrent state kernel launch");
}

Status GruReset(const RnnGeometry& g, float* xw, const float* hr, const float* h,
                const int32_t* sequence_lens, float* rh, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRnnGeometry(g));
  if (g.cell != 1 || g.linear_before_reset)
    return InvalidArgument("GRU reset step: for a GRU without linear_before_reset only");
  return CudaStatus(internal::LaunchGruReset(g, xw, hr, h, sequence_lens, rh, stream),
                    "GRU reset kernel launch");
}

Status RnnCell(const RnnGeometry& g, const float* xw, const float* hr, int64_t hr_ld,
               const float* hr_h, const float* rbh, const float* peepholes,
               const int32_t* sequence_lens, float* h, float* c, float* y, int32_t* error_flag,
               cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRnnGeometry(g));
  const int64_t gates = g.cell == 0 ? 1 : g.cell == 1 ? 3 : 4;
  const bool split_h = g.cell == 1 && !g.linear_before_reset;
  if (hr_ld < (split_h ? 2 : gates) * g.hidden)
    return InvalidArgument("recurrent cell: the state's products are " + std::to_string(hr_ld) +
                           " wide, fewer than its gates need");
  if (split_h && hr_h == nullptr)
    return InvalidArgument("recurrent cell: a GRU without linear_before_reset needs hr_h");
  if (g.cell == 2 && c == nullptr) return InvalidArgument("recurrent cell: an LSTM needs c");
  if (error_flag == nullptr) return InvalidArgument("recurrent cell: no error flag");
  return CudaStatus(internal::LaunchRnnCell(g, xw, hr, hr_ld, hr_h, rbh, peepholes, sequence_lens,
                                            h, c, y, error_flag, stream),
                    "recurrent cell kernel launch");
}

}  // namespace shoal::engine::cuda
