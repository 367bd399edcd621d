// LayerNorm and RMSNorm, with the residual add fused in front (s = x + r; y = norm(s)),
// forward and backward.
//
// Reference: ablate/kernels/reference.py (F.layer_norm, F.rms_norm, x + y then the norm).
// Mirror:    ablate/kernels/triton_kernels.py (_norm_fwd_kernel, _norm_bwd_kernel).
// Check:     ablate/kernels/parity.py, `ablate kernels check`, tests/ablate/kernels/test_parity.py.
// Bench:     ablate/bench/kernel_ops.py, `ablate kernels bench`.
//
// Layout. A block is (TPR, RG) threads: RG row groups of TPR threads (a multiple of 32, so no
// warp spans two rows). Row group g of block b handles rows b*RG + g, then + gridDim.x*RG, ...
// (the loop is uniform across the block, so every thread reaches every __syncthreads). Thread t
// of a row group owns the packs t, t + TPR, ..., at most P of them, and keeps them in registers
// between the passes over its row: the row is read from memory once.
//
// Forward: mean (LayerNorm), then the variance of the centred values (two passes in registers,
// no E[x^2] - E[x]^2 cancellation), rstd = 1 / sqrt(var + eps), y = (x - mean) rstd w + b.
// Saves mean and rstd (float32 per row).
// Backward: xhat = (x - mean) rstd, c1 = mean(xhat w dy), c2 = mean(w dy) (0 for RMSNorm),
// dx = rstd (w dy - (xhat c1 + c2)) (+ ds). Each thread owns fixed columns, so it sums dw += dy xhat
// and db += dy for them in registers; at the end the row groups of a block are summed in shared
// memory in a fixed order and the block writes one partial row. The block that finishes last
// (a counter, reset by that block) sums the partial rows in a fixed order into dw and db: the
// result is deterministic and needs no second launch (llm.c's layernorm backward does the same).
#include <type_traits>

#include "device_utils.h"

namespace ablate {
namespace {

constexpr int kMaxThreads = 512;  // per block
constexpr int kMaxRG = 16;        // row groups per block
constexpr int kRowThreads = 512;  // most threads on one row
constexpr int kAccSmemFloats = 11264;  // 44 KiB of shared memory for the backward's block sum

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
  }
  return v;
}

// Sum of v over the threads of this row group; every thread of the group gets it.
// Every thread of the block must call it (it synchronises the block).
__device__ __forceinline__ float row_sum(float v, float (*red)[32]) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31;
  const int nwarps = blockDim.x >> 5;
  __syncthreads();  // whoever read red last time is done
  if (lane == 0) red[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < nwarps ? red[threadIdx.y][lane] : 0.f;
  return warp_sum(v);
}

__device__ __forceinline__ float2 row_sum2(float2 v, float2 (*red)[32]) {
  v = warp_sum2(v);
  const int lane = threadIdx.x & 31;
  const int nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < nwarps ? red[threadIdx.y][lane] : make_float2(0.f, 0.f);
  return warp_sum2(v);
}

template <typename T, int N, int P>
__global__ void __launch_bounds__(kMaxThreads)
    norm_fwd_kernel(const T* __restrict__ x, int64_t x_rs, const T* __restrict__ res, int64_t r_rs,
                    T* __restrict__ s, T* __restrict__ y, const float* __restrict__ w, const float* __restrict__ b,
                    float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int cols, float eps,
                    bool rms) {
  __shared__ float red[kMaxRG][32];
  const int packs = cols / N;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < rows; row0 += row_step) {
    const int64_t row = row0 + threadIdx.y;
    const bool active = row < rows;
    float v[P][N];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (active && p < packs) {
        const Pack<T, N> px = load_pack<T, N>(x + row * x_rs + static_cast<int64_t>(p) * N);
        if (res != nullptr) {
          // s = x + r rounded to T, as torch's x + r; the norm is taken of the rounded s.
          const Pack<T, N> pr = load_pack<T, N>(res + row * r_rs + static_cast<int64_t>(p) * N);
          Pack<T, N> ps;
#pragma unroll
          for (int k = 0; k < N; ++k) {
            ps.v[k] = from_float<T>(to_float(px.v[k]) + to_float(pr.v[k]));
            v[i][k] = to_float(ps.v[k]);
          }
          store_pack<T, N>(s + row * cols + static_cast<int64_t>(p) * N, ps);
        } else {
#pragma unroll
          for (int k = 0; k < N; ++k) v[i][k] = to_float(px.v[k]);
        }
#pragma unroll
        for (int k = 0; k < N; ++k) sum += v[i][k];
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) v[i][k] = 0.f;
      }
    }
    float mu = 0.f;
    if (!rms) mu = row_sum(sum, red) / cols;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (active && p < packs) {
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float d = v[i][k] - mu;
          sq += d * d;
        }
      }
    }
    const float rstd = 1.f / sqrtf(row_sum(sq, red) / cols + eps);
    if (active && threadIdx.x == 0) {
      if (!rms) mean_out[row] = mu;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (active && p < packs) {
        Pack<T, N> py;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int c = p * N + k;
          float o = (v[i][k] - mu) * rstd * w[c];
          if (b != nullptr) o += b[c];
          py.v[k] = from_float<T>(o);
        }
        store_pack<T, N>(y + row * cols + static_cast<int64_t>(p) * N, py);
      }
    }
  }
}

// Sum of column c over the n partial rows of `part`, in a fixed order; 8 independent sums
// keep 8 loads in flight per thread. __ldcg: through L2, where the other blocks' rows are.
__device__ __forceinline__ float column_sum(const float* __restrict__ part, int64_t n, int cols, int c) {
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t g = 0;
  for (; g + 8 <= n; g += 8) {
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] += __ldcg(part + (g + k) * cols + c);
  }
  for (; g < n; ++g) a[0] += __ldcg(part + g * cols + c);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Called by every block after it wrote its partial rows: the last block to arrive sums every
// block's rows into dw (and db when non-null) and resets the counter for the next launch.
__device__ __forceinline__ void sum_partials_if_last(const float* __restrict__ dw_part,
                                                     const float* __restrict__ db_part, float* __restrict__ dw,
                                                     float* __restrict__ db, unsigned* __restrict__ count, int cols) {
  if (!last_to_arrive(count, gridDim.x)) return;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t n = gridDim.x;
  for (int c = tid; c < cols; c += blockDim.x * blockDim.y) {
    dw[c] = column_sum(dw_part, n, cols, c);
    if (db != nullptr) db[c] = column_sum(db_part, n, cols, c);
  }
  if (tid == 0) *count = 0u;
}

template <typename T, int N, int P>
__global__ void __launch_bounds__(kMaxThreads)
    norm_bwd_kernel(const T* __restrict__ dy, int64_t dy_rs, const T* __restrict__ ds, int64_t ds_rs,
                    const T* __restrict__ x, int64_t x_rs, const float* __restrict__ w,
                    const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                    float* __restrict__ dw_part, float* __restrict__ db_part, float* __restrict__ dw_out,
                    float* __restrict__ db_out, unsigned* __restrict__ count, int64_t rows, int cols, bool rms) {
  __shared__ float2 red[kMaxRG][32];
  extern __shared__ float acc[];  // [blockDim.y][cols]
  const int packs = cols / N;
  float dw[P][N];
  float db[P][N];
#pragma unroll
  for (int i = 0; i < P; ++i) {
#pragma unroll
    for (int k = 0; k < N; ++k) dw[i][k] = db[i][k] = 0.f;
  }
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < rows; row0 += row_step) {
    const int64_t row = row0 + threadIdx.y;
    const bool active = row < rows;
    const float r = active ? rstd[row] : 0.f;
    const float mu = (active && !rms) ? mean[row] : 0.f;
    float xh[P][N];
    float g[P][N];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (active && p < packs) {
        const Pack<T, N> px = load_pack<T, N>(x + row * x_rs + static_cast<int64_t>(p) * N);
        const Pack<T, N> pg = load_pack<T, N>(dy + row * dy_rs + static_cast<int64_t>(p) * N);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          xh[i][k] = (to_float(px.v[k]) - mu) * r;
          g[i][k] = to_float(pg.v[k]);
          const float wdy = w[p * N + k] * g[i][k];
          s1 += xh[i][k] * wdy;
          s2 += wdy;
        }
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) xh[i][k] = g[i][k] = 0.f;
      }
    }
    const float2 t = row_sum2(make_float2(s1, s2), red);
    const float c1 = t.x / cols;
    const float c2 = rms ? 0.f : t.y / cols;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (active && p < packs) {
        Pack<T, N> pd;
        Pack<T, N> pds;
        if (ds != nullptr) pds = load_pack<T, N>(ds + row * ds_rs + static_cast<int64_t>(p) * N);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float wdy = w[p * N + k] * g[i][k];
          float d = (wdy - (xh[i][k] * c1 + c2)) * r;
          if (ds != nullptr) d += to_float(pds.v[k]);
          pd.v[k] = from_float<T>(d);
          dw[i][k] += g[i][k] * xh[i][k];
          db[i][k] += g[i][k];
        }
        store_pack<T, N>(dx + row * cols + static_cast<int64_t>(p) * N, pd);
      }
    }
  }
  // Sum the row groups' partials in a fixed order; the block writes one partial row.
  const int passes = db_part != nullptr ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    __syncthreads();
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int p = threadIdx.x + i * blockDim.x;
      if (p < packs) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[threadIdx.y * cols + p * N + k] = pass == 0 ? dw[i][k] : db[i][k];
      }
    }
    __syncthreads();
    float* out = (pass == 0 ? dw_part : db_part) + static_cast<int64_t>(blockIdx.x) * cols;
    for (int c = threadIdx.y * blockDim.x + threadIdx.x; c < cols; c += blockDim.x * blockDim.y) {
      float total = 0.f;
      for (int grp = 0; grp < static_cast<int>(blockDim.y); ++grp) total += acc[grp * cols + c];
      out[c] = total;
    }
  }
  sum_partials_if_last(dw_part, db_part, dw_out, db_out, count, cols);
}

// ---- host side ------------------------------------------------------------------------------

struct NormConfig {
  int p;    // packs per thread (0: too wide)
  int tpr;  // threads per row
  int rg;   // row groups per block
};

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Most packs per thread a row of kMaxNormCols needs within kRowThreads threads: 4 (float32
// 16-byte packs), 2 (bfloat16 packs), 16 (one element per pack).
template <int N>
constexpr int max_packs_per_thread() {
  return N > 1 ? kMaxNormCols / N / kRowThreads : kMaxNormCols / kRowThreads;
}

// The fewest packs per thread (a power of two) that keep a row within kRowThreads threads.
template <int N>
NormConfig norm_config(int cols, bool backward) {
  const int packs = cols / N;
  int p = 1;
  while (p <= max_packs_per_thread<N>() && (packs + p - 1) / p > kRowThreads) p *= 2;
  if (p > max_packs_per_thread<N>()) return {0, 0, 0};
  const int tpr = ((packs + p - 1) / p + 31) / 32 * 32;
  int rg = clamp_int(kMaxThreads / tpr, 1, kMaxRG);
  if (backward) rg = clamp_int(rg < kAccSmemFloats / cols ? rg : kAccSmemFloats / cols, 1, kMaxRG);
  return {p, tpr, rg};
}

// Calls f(std::integral_constant<int, P>) for the runtime p; instantiates only P <= the maximum.
template <int N, typename F>
int with_packs(int p, F&& f) {
  constexpr int M = max_packs_per_thread<N>();
  switch (p) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (M >= 2) return f(std::integral_constant<int, 2>{});
      break;
    case 4:
      if constexpr (M >= 4) return f(std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (M >= 8) return f(std::integral_constant<int, 8>{});
      break;
    case 16:
      if constexpr (M >= 16) return f(std::integral_constant<int, 16>{});
      break;
    default: break;
  }
  return kTooWide;
}

template <typename T, int N>
int norm_fwd_n(const T* x, int64_t x_rs, const T* res, int64_t r_rs, T* s, T* y, const float* w, const float* b,
               float* mean, float* rstd, int64_t rows, int cols, float eps, bool rms, cudaStream_t st) {
  const NormConfig c = norm_config<N>(cols, false);
  if (c.p == 0) return kTooWide;
  int64_t blocks = (rows + c.rg - 1) / c.rg;
  blocks = blocks < 0x7fffffff ? blocks : 0x7fffffff;
  return with_packs<N>(c.p, [&](auto pc) {
    norm_fwd_kernel<T, N, decltype(pc)::value><<<dim3(static_cast<unsigned>(blocks)), dim3(c.tpr, c.rg), 0, st>>>(
        x, x_rs, res, r_rs, s, y, w, b, mean, rstd, rows, cols, eps, rms);
    return static_cast<int>(cudaGetLastError());
  });
}

template <typename T>
int norm_fwd_t(const void* x, int64_t x_rs, const void* res, int64_t r_rs, void* s, void* y, const float* w,
               const float* b, float* mean, float* rstd, int64_t rows, int cols, float eps, bool rms,
               cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* xp = static_cast<const T*>(x);
  const T* rp = static_cast<const T*>(res);
  T* sp = static_cast<T*>(s);
  T* yp = static_cast<T*>(y);
  const bool vec = cols % V == 0 && x_rs % V == 0 && aligned16(x) && aligned16(y) &&
                   (res == nullptr || (r_rs % V == 0 && aligned16(res) && aligned16(s)));
  if (vec) return norm_fwd_n<T, V>(xp, x_rs, rp, r_rs, sp, yp, w, b, mean, rstd, rows, cols, eps, rms, st);
  return norm_fwd_n<T, 1>(xp, x_rs, rp, r_rs, sp, yp, w, b, mean, rstd, rows, cols, eps, rms, st);
}

template <typename T, int N>
int norm_bwd_n(const T* dy, int64_t dy_rs, const T* ds, int64_t ds_rs, const T* x, int64_t x_rs, const float* w,
               const float* mean, const float* rstd, T* dx, float* dw_part, float* db_part, float* dw, float* db,
               unsigned* count, int64_t rows, int cols, int64_t programs, bool rms, cudaStream_t st) {
  const NormConfig c = norm_config<N>(cols, true);
  if (c.p == 0) return kTooWide;
  const size_t smem = static_cast<size_t>(c.rg) * static_cast<size_t>(cols) * sizeof(float);
  return with_packs<N>(c.p, [&](auto pc) {
    norm_bwd_kernel<T, N, decltype(pc)::value>
        <<<dim3(static_cast<unsigned>(programs)), dim3(c.tpr, c.rg), smem, st>>>(
            dy, dy_rs, ds, ds_rs, x, x_rs, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rows, cols, rms);
    return static_cast<int>(cudaGetLastError());
  });
}

template <typename T>
int norm_bwd_t(const void* dy, int64_t dy_rs, const void* ds, int64_t ds_rs, const void* x, int64_t x_rs,
               const float* w, const float* mean, const float* rstd, void* dx, float* dw_part, float* db_part,
               float* dw, float* db, unsigned* count, int64_t rows, int cols, int64_t programs, bool rms,
               cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* dyp = static_cast<const T*>(dy);
  const T* dsp = static_cast<const T*>(ds);
  const T* xp = static_cast<const T*>(x);
  T* dxp = static_cast<T*>(dx);
  const bool vec = cols % V == 0 && dy_rs % V == 0 && x_rs % V == 0 && aligned16(dy) && aligned16(x) &&
                   aligned16(dx) && (ds == nullptr || (ds_rs % V == 0 && aligned16(ds)));
  if (vec)
    return norm_bwd_n<T, V>(dyp, dy_rs, dsp, ds_rs, xp, x_rs, w, mean, rstd, dxp, dw_part, db_part, dw, db, count,
                            rows, cols, programs, rms, st);
  return norm_bwd_n<T, 1>(dyp, dy_rs, dsp, ds_rs, xp, x_rs, w, mean, rstd, dxp, dw_part, db_part, dw, db, count,
                          rows, cols, programs, rms, st);
}

}  // namespace

int norm_forward(int dtype, const void* x, int64_t x_rs, const void* res, int64_t r_rs, void* s, void* y,
                 const float* weight, const float* bias, float* mean, float* rstd, int64_t rows, int64_t cols,
                 float eps, int rms, void* stream) {
  if (rows < 0 || cols < 1 || (res != nullptr && s == nullptr) || (!rms && mean == nullptr)) return kBadArgument;
  if (cols > kMaxNormCols) return kTooWide;
  if (rows == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int c = static_cast<int>(cols);
  if (dtype == kFloat32)
    return norm_fwd_t<float>(x, x_rs, res, r_rs, s, y, weight, bias, mean, rstd, rows, c, eps, rms != 0, st);
  if (dtype == kBFloat16)
    return norm_fwd_t<__nv_bfloat16>(x, x_rs, res, r_rs, s, y, weight, bias, mean, rstd, rows, c, eps, rms != 0, st);
  return kBadArgument;
}

int norm_backward(int dtype, const void* dy, int64_t dy_rs, const void* ds, int64_t ds_rs, const void* x,
                  int64_t x_rs, const float* weight, const float* mean, const float* rstd, void* dx,
                  float* dw_part, float* db_part, float* dw, float* db, unsigned* count, int64_t rows, int64_t cols,
                  int64_t programs, int rms, void* stream) {
  if (rows < 0 || cols < 1 || programs < 1 || programs > 0x7fffffff || (!rms && mean == nullptr) || dw == nullptr ||
      count == nullptr || (db == nullptr) != (db_part == nullptr))
    return kBadArgument;
  if (cols > kMaxNormCols) return kTooWide;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int c = static_cast<int>(cols);
  // With rows == 0 the kernel still runs: it writes the (zero) partial rows.
  if (dtype == kFloat32)
    return norm_bwd_t<float>(dy, dy_rs, ds, ds_rs, x, x_rs, weight, mean, rstd, dx, dw_part, db_part, dw, db, count,
                             rows, c, programs, rms != 0, st);
  if (dtype == kBFloat16)
    return norm_bwd_t<__nv_bfloat16>(dy, dy_rs, ds, ds_rs, x, x_rs, weight, mean, rstd, dx, dw_part, db_part, dw, db,
                                     count, rows, c, programs, rms != 0, st);
  return kBadArgument;
}

}  // namespace ablate
