// Torch binding of the ablate CUDA kernels: checks the tensors and calls the launchers of
// ablate_kernels.h. Needs no CUDA header (the stream arrives from Python as an integer, from
// torch.cuda.current_stream().cuda_stream), so it compiles with a plain C++ compiler against
// torch's headers. Outputs are allocated by the caller (ablate/kernels/ops_base.py).
// Only the headers it needs (not <torch/extension.h>, the whole C++ frontend): at::Tensor and
// torch's pybind11 type casters.
#include <ATen/core/Tensor.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>

#include "ablate_kernels.h"

namespace {

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return ablate::kFloat32;
  if (t.scalar_type() == at::kBFloat16) return ablate::kBFloat16;
  TORCH_CHECK(false, "ablate cuda kernels take float32 or bfloat16 tensors, got ", t.scalar_type());
  return -1;
}

// A 2-D CUDA input with unit column stride (rows may be strided).
void check_in(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1), name, " must be 2-D with unit column stride");
  TORCH_CHECK(t.sizes() == like.sizes() && t.scalar_type() == like.scalar_type() && t.device() == like.device(),
              name, " must match x in shape, dtype and device");
}

// A contiguous output of x's shape, dtype and device.
void check_out(const at::Tensor& t, const at::Tensor& like, const char* name) {
  check_in(t, like, name);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// A contiguous float32 vector (or matrix) on x's device with `numel` elements.
void check_f32(const at::Tensor& t, const at::Tensor& like, int64_t numel, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), name, " must be on x's device");
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == numel, name,
              " must be a contiguous float32 tensor of ", numel, " elements");
}

void* stream_ptr(int64_t stream) { return reinterpret_cast<void*>(static_cast<intptr_t>(stream)); }

void check_status(int code, const char* what) {
  TORCH_CHECK(code == 0, "ablate cuda kernel ", what, " failed: ", ablate::error_string(code));
}

void act_forward(int64_t act, const at::Tensor& x, const at::Tensor& y, int64_t stream) {
  check_in(x, x, "x");
  check_out(y, x, "y");
  check_status(ablate::act_forward(static_cast<int>(act), dtype_code(x), x.data_ptr(), x.stride(0), y.data_ptr(),
                                   x.size(0), x.size(1), stream_ptr(stream)),
               "act_forward");
}

void act_backward(int64_t act, const at::Tensor& x, const at::Tensor& dy, const at::Tensor& dx, int64_t stream) {
  check_in(x, x, "x");
  check_in(dy, x, "dy");
  check_out(dx, x, "dx");
  check_status(ablate::act_backward(static_cast<int>(act), dtype_code(x), x.data_ptr(), x.stride(0), dy.data_ptr(),
                                    dy.stride(0), dx.data_ptr(), x.size(0), x.size(1), stream_ptr(stream)),
               "act_backward");
}

void gated_forward(int64_t act, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& y, int64_t stream) {
  check_in(gate, gate, "gate");
  check_in(up, gate, "up");
  check_out(y, gate, "y");
  check_status(ablate::gated_forward(static_cast<int>(act), dtype_code(gate), gate.data_ptr(), gate.stride(0),
                                     up.data_ptr(), up.stride(0), y.data_ptr(), gate.size(0), gate.size(1),
                                     stream_ptr(stream)),
               "gated_forward");
}

void gated_backward(int64_t act, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy,
                    const at::Tensor& dgate, const at::Tensor& dup, int64_t stream) {
  check_in(gate, gate, "gate");
  check_in(up, gate, "up");
  check_in(dy, gate, "dy");
  check_out(dgate, gate, "dgate");
  check_out(dup, gate, "dup");
  check_status(ablate::gated_backward(static_cast<int>(act), dtype_code(gate), gate.data_ptr(), gate.stride(0),
                                      up.data_ptr(), up.stride(0), dy.data_ptr(), dy.stride(0), dgate.data_ptr(),
                                      dup.data_ptr(), gate.size(0), gate.size(1), stream_ptr(stream)),
               "gated_backward");
}

void bias_act_forward(int64_t act, const at::Tensor& x, const at::Tensor& bias, const at::Tensor& y, int64_t stream) {
  check_in(x, x, "x");
  check_out(y, x, "y");
  check_f32(bias, x, x.size(1), "bias");
  check_status(ablate::bias_act_forward(static_cast<int>(act), dtype_code(x), x.data_ptr(), x.stride(0),
                                        bias.data_ptr<float>(), y.data_ptr(), x.size(0), x.size(1),
                                        stream_ptr(stream)),
               "bias_act_forward");
}

void bias_act_backward(int64_t act, const at::Tensor& x, const at::Tensor& bias, const at::Tensor& dy,
                       const at::Tensor& dx, const at::Tensor& db_part, const at::Tensor& db, const at::Tensor& count,
                       int64_t stream) {
  check_in(x, x, "x");
  check_in(dy, x, "dy");
  check_out(dx, x, "dx");
  const int64_t cols = x.size(1);
  check_f32(bias, x, cols, "bias");
  check_f32(db, x, cols, "db");
  TORCH_CHECK(db_part.dim() == 2 && db_part.size(1) == cols, "db_part must be (programs, cols)");
  check_f32(db_part, x, db_part.size(0) * cols, "db_part");
  TORCH_CHECK(count.is_cuda() && count.device() == x.device() && count.scalar_type() == at::kInt &&
                  count.is_contiguous() && count.numel() >= cols,
              "count must be a contiguous int32 tensor of at least cols elements on x's device");
  check_status(ablate::bias_act_backward(static_cast<int>(act), dtype_code(x), x.data_ptr(), x.stride(0),
                                         bias.data_ptr<float>(), dy.data_ptr(), dy.stride(0), dx.data_ptr(),
                                         db_part.data_ptr<float>(), db.data_ptr<float>(),
                                         reinterpret_cast<unsigned*>(count.data_ptr<int32_t>()), x.size(0), cols,
                                         db_part.size(0), stream_ptr(stream)),
               "bias_act_backward");
}

void norm_forward(const at::Tensor& x, const std::optional<at::Tensor>& res, const std::optional<at::Tensor>& s,
                  const at::Tensor& y, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& mean, const at::Tensor& rstd, double eps, bool rms,
                  int64_t stream) {
  check_in(x, x, "x");
  check_out(y, x, "y");
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(res.has_value() == s.has_value(), "res and s come together");
  if (res.has_value()) {
    check_in(*res, x, "res");
    check_out(*s, x, "s");
  }
  check_f32(weight, x, cols, "weight");
  if (bias.has_value()) check_f32(*bias, x, cols, "bias");
  TORCH_CHECK(rms || mean.has_value(), "LayerNorm needs a mean buffer");
  if (mean.has_value()) check_f32(*mean, x, rows, "mean");
  check_f32(rstd, x, rows, "rstd");
  check_status(
      ablate::norm_forward(dtype_code(x), x.data_ptr(), x.stride(0), res ? res->data_ptr() : nullptr,
                           res ? res->stride(0) : 0, s ? s->data_ptr() : nullptr, y.data_ptr(),
                           weight.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                           mean ? mean->data_ptr<float>() : nullptr, rstd.data_ptr<float>(), rows, cols,
                           static_cast<float>(eps), rms ? 1 : 0, stream_ptr(stream)),
      "norm_forward");
}

void norm_backward(const at::Tensor& dy, const std::optional<at::Tensor>& ds, const at::Tensor& x,
                   const at::Tensor& weight, const std::optional<at::Tensor>& mean, const at::Tensor& rstd,
                   const at::Tensor& dx, const at::Tensor& dw_part, const std::optional<at::Tensor>& db_part,
                   const at::Tensor& dw, const std::optional<at::Tensor>& db, const at::Tensor& count, bool rms,
                   int64_t stream) {
  check_in(x, x, "x");
  check_in(dy, x, "dy");
  if (ds.has_value()) check_in(*ds, x, "ds");
  check_out(dx, x, "dx");
  const int64_t rows = x.size(0), cols = x.size(1);
  check_f32(weight, x, cols, "weight");
  TORCH_CHECK(rms || mean.has_value(), "LayerNorm needs the saved mean");
  if (mean.has_value()) check_f32(*mean, x, rows, "mean");
  check_f32(rstd, x, rows, "rstd");
  TORCH_CHECK(dw_part.dim() == 2 && dw_part.size(1) == cols, "dw_part must be (programs, cols)");
  const int64_t programs = dw_part.size(0);
  check_f32(dw_part, x, programs * cols, "dw_part");
  if (db_part.has_value()) check_f32(*db_part, x, programs * cols, "db_part");
  check_f32(dw, x, cols, "dw");
  TORCH_CHECK(db.has_value() == db_part.has_value(), "db and db_part come together");
  if (db.has_value()) check_f32(*db, x, cols, "db");
  TORCH_CHECK(count.is_cuda() && count.device() == x.device() && count.scalar_type() == at::kInt &&
                  count.is_contiguous() && count.numel() >= 1,
              "count must be a contiguous int32 tensor on x's device");
  check_status(ablate::norm_backward(dtype_code(x), dy.data_ptr(), dy.stride(0), ds ? ds->data_ptr() : nullptr,
                                     ds ? ds->stride(0) : 0, x.data_ptr(), x.stride(0), weight.data_ptr<float>(),
                                     mean ? mean->data_ptr<float>() : nullptr, rstd.data_ptr<float>(), dx.data_ptr(),
                                     dw_part.data_ptr<float>(), db_part ? db_part->data_ptr<float>() : nullptr,
                                     dw.data_ptr<float>(), db ? db->data_ptr<float>() : nullptr,
                                     reinterpret_cast<unsigned*>(count.data_ptr<int32_t>()), rows, cols, programs,
                                     rms ? 1 : 0, stream_ptr(stream)),
               "norm_backward");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ablate CUDA kernels (see docs/kernels.md)";
  m.attr("max_norm_cols") = ablate::kMaxNormCols;
  m.def("act_forward", &act_forward);
  m.def("act_backward", &act_backward);
  m.def("gated_forward", &gated_forward);
  m.def("gated_backward", &gated_backward);
  m.def("bias_act_forward", &bias_act_forward);
  m.def("bias_act_backward", &bias_act_backward);
  m.def("norm_forward", &norm_forward);
  m.def("norm_backward", &norm_backward);
}
