// Host-side launchers of the ablate CUDA kernels: plain C++ with raw pointers, so the torch
// binding (binding.cpp) includes this header without any CUDA header.
//
// Layout contract (the Python side, ablate/kernels/ops_base.py, prepares it): every tensor is
// 2-D (rows, cols) with unit column stride. Inputs may have a row stride (`*_rs`, in elements);
// outputs are contiguous (row stride = cols). dtype: 0 = float32, 1 = bfloat16, the same for
// every activation tensor of one call; norm weights, biases, mean, rstd and partial gradient rows
// are float32. `stream` is a cudaStream_t. Every launcher returns 0 on success, else an error
// code for error_string(): a cudaError_t, or one of the negative codes below.
#pragma once

#include <cstdint>

namespace ablate {

// Activation ids, the order of ops_base.ACTS.
enum Act : int { kGelu = 0, kGeluErf = 1, kRelu = 2, kSilu = 3, kRelu2 = 4 };
enum DType : int { kFloat32 = 0, kBFloat16 = 1 };
enum Error : int { kBadArgument = -1, kTooWide = -2 };

// Widest row the norm kernels take (wider rows fall back to `reference` in Python).
constexpr int kMaxNormCols = 8192;

const char* error_string(int code);

// y = act(x)
int act_forward(int act, int dtype, const void* x, int64_t x_rs, void* y, int64_t rows, int64_t cols, void* stream);
// dx = dy * act'(x)
int act_backward(int act, int dtype, const void* x, int64_t x_rs, const void* dy, int64_t dy_rs, void* dx,
                 int64_t rows, int64_t cols, void* stream);
// y = act(gate) * up
int gated_forward(int act, int dtype, const void* gate, int64_t g_rs, const void* up, int64_t u_rs, void* y,
                  int64_t rows, int64_t cols, void* stream);
// dgate = dy * up * act'(gate), dup = dy * act(gate)
int gated_backward(int act, int dtype, const void* gate, int64_t g_rs, const void* up, int64_t u_rs,
                   const void* dy, int64_t dy_rs, void* dgate, void* dup, int64_t rows, int64_t cols, void* stream);

// y = act(x + bias), bias float32 (cols)
int bias_act_forward(int act, int dtype, const void* x, int64_t x_rs, const float* bias, void* y, int64_t rows,
                     int64_t cols, void* stream);
// dx = dy * act'(x + bias); db (float32, cols) = the sum of dx over rows, before rounding. Launches
// (column blocks) x `programs` blocks (1 <= programs <= min(rows, 65535)); db_part (programs, cols)
// is scratch and `count` (zero on entry, one int32 per column block: `cols` suffice) ends zero.
int bias_act_backward(int act, int dtype, const void* x, int64_t x_rs, const float* bias, const void* dy,
                      int64_t dy_rs, void* dx, float* db_part, float* db, unsigned* count, int64_t rows,
                      int64_t cols, int64_t programs, void* stream);

// LayerNorm (rms = 0) or RMSNorm (rms = 1) of each row. With `res` non-null, first s = x + res
// (rounded to dtype, written to `s`) and the norm is taken of s. bias may be null; mean is
// written for LayerNorm only (may be null for RMSNorm); rstd always.
int norm_forward(int dtype, const void* x, int64_t x_rs, const void* res, int64_t r_rs, void* s, void* y,
                 const float* weight, const float* bias, float* mean, float* rstd, int64_t rows, int64_t cols,
                 float eps, int rms, void* stream);
// dx = the norm's input gradient (+ ds when ds is non-null); x is the norm's input. Launches
// `programs` blocks; block i writes row i of dw_part and (when non-null) db_part, each
// (programs, cols): partial sums of dy * xhat and dy over the rows it handled; the last block
// to finish sums those rows into dw and db (cols floats each; db and db_part null together)
// and sets `count` (zero on entry: an int32 on the device) back to zero.
int norm_backward(int dtype, const void* dy, int64_t dy_rs, const void* ds, int64_t ds_rs, const void* x,
                  int64_t x_rs, const float* weight, const float* mean, const float* rstd, void* dx,
                  float* dw_part, float* db_part, float* dw, float* db, unsigned* count, int64_t rows, int64_t cols,
                  int64_t programs, int rms, void* stream);

}  // namespace ablate
