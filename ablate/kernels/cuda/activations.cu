// Elementwise activations and gated products (act(gate) * up), forward and backward.
//
// Reference: variants/activations.py (ReferenceBackend.activation / .gated).
// Mirror:    ablate/kernels/triton_kernels.py (_act_*_kernel, _gated_*_kernel).
// Check:     ablate/kernels/parity.py, `ablate kernels check`, tests/ablate/kernels/test_parity.py.
// Bench:     ablate/bench/kernel_ops.py, `ablate kernels bench`.
//
// Layout: (rows, cols) with a row stride per input, contiguous outputs. A 2-D grid: blockIdx.y
// walks rows (grid-stride beyond 65535), blockIdx.x/threadIdx.x walk 16-byte packs of a row
// (grid-stride). A contiguous tensor arrives as one row, so it is one flat vectorised sweep.
// Vectorised (16-byte) loads and stores when every pointer is 16-byte aligned and cols and every
// row stride are multiples of the pack width; otherwise one element per thread step.
#include <type_traits>

#include "device_utils.h"

namespace ablate {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int64_t kMaxGridY = 65535;

struct Launch {
  dim3 grid;
  dim3 block;
};

Launch ew_config(int64_t rows, int64_t packs) {
  const int threads = packs >= kThreads ? kThreads : static_cast<int>((packs + 31) / 32 * 32);
  int64_t gx = (packs + threads - 1) / threads;
  gx = gx < kMaxGridX ? gx : kMaxGridX;
  const int64_t gy = rows < kMaxGridY ? rows : kMaxGridY;
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(static_cast<unsigned>(threads))};
}

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    act_fwd_kernel(const T* __restrict__ x, int64_t x_rs, T* __restrict__ y, int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pstep = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * x_rs;
    T* yr = y + r * cols;
    for (int64_t p = p0; p < packs; p += pstep) {
      const Pack<T, N> in = load_pack<T, N>(xr + p * N);
      Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(act_fwd<ACT>(to_float(in.v[k])));
      store_pack<T, N>(yr + p * N, out);
    }
  }
}

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    act_bwd_kernel(const T* __restrict__ x, int64_t x_rs, const T* __restrict__ dy, int64_t dy_rs,
                   T* __restrict__ dx, int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pstep = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * x_rs;
    const T* dyr = dy + r * dy_rs;
    T* dxr = dx + r * cols;
    for (int64_t p = p0; p < packs; p += pstep) {
      const Pack<T, N> in = load_pack<T, N>(xr + p * N);
      const Pack<T, N> g = load_pack<T, N>(dyr + p * N);
      Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float d;
        (void)act_fwd_grad<ACT>(to_float(in.v[k]), d);
        out.v[k] = from_float<T>(to_float(g.v[k]) * d);
      }
      store_pack<T, N>(dxr + p * N, out);
    }
  }
}

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    gated_fwd_kernel(const T* __restrict__ gate, int64_t g_rs, const T* __restrict__ up, int64_t u_rs,
                     T* __restrict__ y, int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pstep = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* gr = gate + r * g_rs;
    const T* ur = up + r * u_rs;
    T* yr = y + r * cols;
    for (int64_t p = p0; p < packs; p += pstep) {
      const Pack<T, N> g = load_pack<T, N>(gr + p * N);
      const Pack<T, N> u = load_pack<T, N>(ur + p * N);
      Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(act_fwd<ACT>(to_float(g.v[k])) * to_float(u.v[k]));
      store_pack<T, N>(yr + p * N, out);
    }
  }
}

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    gated_bwd_kernel(const T* __restrict__ gate, int64_t g_rs, const T* __restrict__ up, int64_t u_rs,
                     const T* __restrict__ dy, int64_t dy_rs, T* __restrict__ dgate, T* __restrict__ dup,
                     int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pstep = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* gr = gate + r * g_rs;
    const T* ur = up + r * u_rs;
    const T* dyr = dy + r * dy_rs;
    T* dgr = dgate + r * cols;
    T* dur = dup + r * cols;
    for (int64_t p = p0; p < packs; p += pstep) {
      const Pack<T, N> g = load_pack<T, N>(gr + p * N);
      const Pack<T, N> u = load_pack<T, N>(ur + p * N);
      const Pack<T, N> gy = load_pack<T, N>(dyr + p * N);
      Pack<T, N> og, ou;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float d;
        const float a = act_fwd_grad<ACT>(to_float(g.v[k]), d);
        const float dyv = to_float(gy.v[k]);
        og.v[k] = from_float<T>(dyv * to_float(u.v[k]) * d);
        ou.v[k] = from_float<T>(dyv * a);
      }
      store_pack<T, N>(dgr + p * N, og);
      store_pack<T, N>(dur + p * N, ou);
    }
  }
}

// ---- bias + activation: y = act(x + b); backward dx = dy act'(x + b), db = sum of dx over rows --
// Forward: as act_fwd_kernel, with the float32 bias of each column added first.
// Backward: a grid of (column blocks, R row programs); thread t of column block j owns one pack
// of columns and walks the rows blockIdx.y, + R, ..., summing its dx in float32 registers; row
// blockIdx.y of db_part gets those sums, and the last of the R blocks of column block j (counter
// j) sums the R rows in a fixed order into db: deterministic, in the same launch.

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    bias_act_fwd_kernel(const T* __restrict__ x, int64_t x_rs, const float* __restrict__ b, T* __restrict__ y,
                        int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pstep = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * x_rs;
    T* yr = y + r * cols;
    for (int64_t p = p0; p < packs; p += pstep) {
      const Pack<T, N> in = load_pack<T, N>(xr + p * N);
      Pack<T, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(act_fwd<ACT>(to_float(in.v[k]) + b[p * N + k]));
      store_pack<T, N>(yr + p * N, out);
    }
  }
}

template <int ACT, typename T, int N>
__global__ void __launch_bounds__(kThreads)
    bias_act_bwd_kernel(const T* __restrict__ x, int64_t x_rs, const float* __restrict__ b, const T* __restrict__ dy,
                        int64_t dy_rs, T* __restrict__ dx, float* __restrict__ db_part, float* __restrict__ db,
                        unsigned* __restrict__ count, int64_t rows, int64_t cols) {
  const int64_t packs = cols / N;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool owner = p < packs;
  float bias[N];
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    bias[k] = owner ? b[p * N + k] : 0.f;
    acc[k] = 0.f;
  }
  for (int64_t r = blockIdx.y; owner && r < rows; r += gridDim.y) {
    const Pack<T, N> in = load_pack<T, N>(x + r * x_rs + p * N);
    const Pack<T, N> g = load_pack<T, N>(dy + r * dy_rs + p * N);
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float d;
      (void)act_fwd_grad<ACT>(to_float(in.v[k]) + bias[k], d);
      const float v = to_float(g.v[k]) * d;
      out.v[k] = from_float<T>(v);
      acc[k] += v;
    }
    store_pack<T, N>(dx + r * cols + p * N, out);
  }
  if (owner) {
#pragma unroll
    for (int k = 0; k < N; ++k) db_part[static_cast<int64_t>(blockIdx.y) * cols + p * N + k] = acc[k];
  }
  if (!last_to_arrive(count + blockIdx.x, gridDim.y)) return;
  if (owner) {
    float sum[N];
#pragma unroll
    for (int k = 0; k < N; ++k) sum[k] = 0.f;
    for (int64_t g = 0; g < gridDim.y; ++g) {
#pragma unroll
      for (int k = 0; k < N; ++k) sum[k] += __ldcg(db_part + g * cols + p * N + k);  // N loads in flight
    }
#pragma unroll
    for (int k = 0; k < N; ++k) db[p * N + k] = sum[k];
  }
  if (threadIdx.x == 0) count[blockIdx.x] = 0u;
}

// ---- host side ------------------------------------------------------------------------------

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(std::integral_constant<int, ACT>, Tag<T>) for the runtime (act, dtype).
template <typename F>
int dispatch(int act, int dtype, F&& f) {
  auto by_dtype = [&](auto a) -> int {
    if (dtype == kFloat32) return f(a, Tag<float>{});
    if (dtype == kBFloat16) return f(a, Tag<__nv_bfloat16>{});
    return kBadArgument;
  };
  switch (act) {
    case kGelu: return by_dtype(std::integral_constant<int, kGelu>{});
    case kGeluErf: return by_dtype(std::integral_constant<int, kGeluErf>{});
    case kRelu: return by_dtype(std::integral_constant<int, kRelu>{});
    case kSilu: return by_dtype(std::integral_constant<int, kSilu>{});
    case kRelu2: return by_dtype(std::integral_constant<int, kRelu2>{});
    default: return kBadArgument;
  }
}

bool bad_shape(int64_t rows, int64_t cols) { return rows < 0 || cols < 0; }

template <int ACT, typename T>
int act_fwd_t(const void* x, int64_t x_rs, void* y, int64_t rows, int64_t cols, cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* xp = static_cast<const T*>(x);
  T* yp = static_cast<T*>(y);
  if (cols % V == 0 && x_rs % V == 0 && aligned16(x) && aligned16(y)) {
    const Launch l = ew_config(rows, cols / V);
    act_fwd_kernel<ACT, T, V><<<l.grid, l.block, 0, st>>>(xp, x_rs, yp, rows, cols);
  } else {
    const Launch l = ew_config(rows, cols);
    act_fwd_kernel<ACT, T, 1><<<l.grid, l.block, 0, st>>>(xp, x_rs, yp, rows, cols);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T>
int act_bwd_t(const void* x, int64_t x_rs, const void* dy, int64_t dy_rs, void* dx, int64_t rows, int64_t cols,
              cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* xp = static_cast<const T*>(x);
  const T* dyp = static_cast<const T*>(dy);
  T* dxp = static_cast<T*>(dx);
  if (cols % V == 0 && x_rs % V == 0 && dy_rs % V == 0 && aligned16(x) && aligned16(dy) && aligned16(dx)) {
    const Launch l = ew_config(rows, cols / V);
    act_bwd_kernel<ACT, T, V><<<l.grid, l.block, 0, st>>>(xp, x_rs, dyp, dy_rs, dxp, rows, cols);
  } else {
    const Launch l = ew_config(rows, cols);
    act_bwd_kernel<ACT, T, 1><<<l.grid, l.block, 0, st>>>(xp, x_rs, dyp, dy_rs, dxp, rows, cols);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T>
int gated_fwd_t(const void* gate, int64_t g_rs, const void* up, int64_t u_rs, void* y, int64_t rows, int64_t cols,
                cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* gp = static_cast<const T*>(gate);
  const T* upp = static_cast<const T*>(up);
  T* yp = static_cast<T*>(y);
  if (cols % V == 0 && g_rs % V == 0 && u_rs % V == 0 && aligned16(gate) && aligned16(up) && aligned16(y)) {
    const Launch l = ew_config(rows, cols / V);
    gated_fwd_kernel<ACT, T, V><<<l.grid, l.block, 0, st>>>(gp, g_rs, upp, u_rs, yp, rows, cols);
  } else {
    const Launch l = ew_config(rows, cols);
    gated_fwd_kernel<ACT, T, 1><<<l.grid, l.block, 0, st>>>(gp, g_rs, upp, u_rs, yp, rows, cols);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T>
int gated_bwd_t(const void* gate, int64_t g_rs, const void* up, int64_t u_rs, const void* dy, int64_t dy_rs,
                void* dgate, void* dup, int64_t rows, int64_t cols, cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* gp = static_cast<const T*>(gate);
  const T* upp = static_cast<const T*>(up);
  const T* dyp = static_cast<const T*>(dy);
  T* dgp = static_cast<T*>(dgate);
  T* dup_ = static_cast<T*>(dup);
  if (cols % V == 0 && g_rs % V == 0 && u_rs % V == 0 && dy_rs % V == 0 && aligned16(gate) && aligned16(up) &&
      aligned16(dy) && aligned16(dgate) && aligned16(dup)) {
    const Launch l = ew_config(rows, cols / V);
    gated_bwd_kernel<ACT, T, V><<<l.grid, l.block, 0, st>>>(gp, g_rs, upp, u_rs, dyp, dy_rs, dgp, dup_, rows, cols);
  } else {
    const Launch l = ew_config(rows, cols);
    gated_bwd_kernel<ACT, T, 1><<<l.grid, l.block, 0, st>>>(gp, g_rs, upp, u_rs, dyp, dy_rs, dgp, dup_, rows, cols);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T>
int bias_act_fwd_t(const void* x, int64_t x_rs, const float* b, void* y, int64_t rows, int64_t cols,
                   cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* xp = static_cast<const T*>(x);
  T* yp = static_cast<T*>(y);
  if (cols % V == 0 && x_rs % V == 0 && aligned16(x) && aligned16(y)) {
    const Launch l = ew_config(rows, cols / V);
    bias_act_fwd_kernel<ACT, T, V><<<l.grid, l.block, 0, st>>>(xp, x_rs, b, yp, rows, cols);
  } else {
    const Launch l = ew_config(rows, cols);
    bias_act_fwd_kernel<ACT, T, 1><<<l.grid, l.block, 0, st>>>(xp, x_rs, b, yp, rows, cols);
  }
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T, int N>
int bias_act_bwd_n(const T* x, int64_t x_rs, const float* b, const T* dy, int64_t dy_rs, T* dx, float* db_part,
                   float* db, unsigned* count, int64_t rows, int64_t cols, int64_t programs, cudaStream_t st) {
  const int64_t packs = cols / N;
  const int threads = packs >= kThreads ? kThreads : static_cast<int>((packs + 31) / 32 * 32);
  const int64_t col_blocks = (packs + threads - 1) / threads;
  if (col_blocks > kMaxGridX) return kBadArgument;
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(programs));
  bias_act_bwd_kernel<ACT, T, N><<<grid, dim3(static_cast<unsigned>(threads)), 0, st>>>(
      x, x_rs, b, dy, dy_rs, dx, db_part, db, count, rows, cols);
  return static_cast<int>(cudaGetLastError());
}

template <int ACT, typename T>
int bias_act_bwd_t(const void* x, int64_t x_rs, const float* b, const void* dy, int64_t dy_rs, void* dx,
                   float* db_part, float* db, unsigned* count, int64_t rows, int64_t cols, int64_t programs,
                   cudaStream_t st) {
  constexpr int V = vec_width<T>();
  const T* xp = static_cast<const T*>(x);
  const T* dyp = static_cast<const T*>(dy);
  T* dxp = static_cast<T*>(dx);
  if (cols % V == 0 && x_rs % V == 0 && dy_rs % V == 0 && aligned16(x) && aligned16(dy) && aligned16(dx))
    return bias_act_bwd_n<ACT, T, V>(xp, x_rs, b, dyp, dy_rs, dxp, db_part, db, count, rows, cols, programs, st);
  return bias_act_bwd_n<ACT, T, 1>(xp, x_rs, b, dyp, dy_rs, dxp, db_part, db, count, rows, cols, programs, st);
}

}  // namespace

const char* error_string(int code) {
  if (code == kBadArgument) return "bad argument (unknown activation or dtype, or a negative size)";
  if (code == kTooWide) return "row wider than the norm kernels take";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int act_forward(int act, int dtype, const void* x, int64_t x_rs, void* y, int64_t rows, int64_t cols, void* stream) {
  if (bad_shape(rows, cols)) return kBadArgument;
  if (rows == 0 || cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return act_fwd_t<decltype(a)::value, typename decltype(t)::type>(x, x_rs, y, rows, cols, st);
  });
}

int act_backward(int act, int dtype, const void* x, int64_t x_rs, const void* dy, int64_t dy_rs, void* dx,
                 int64_t rows, int64_t cols, void* stream) {
  if (bad_shape(rows, cols)) return kBadArgument;
  if (rows == 0 || cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return act_bwd_t<decltype(a)::value, typename decltype(t)::type>(x, x_rs, dy, dy_rs, dx, rows, cols, st);
  });
}

int gated_forward(int act, int dtype, const void* gate, int64_t g_rs, const void* up, int64_t u_rs, void* y,
                  int64_t rows, int64_t cols, void* stream) {
  if (bad_shape(rows, cols)) return kBadArgument;
  if (rows == 0 || cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return gated_fwd_t<decltype(a)::value, typename decltype(t)::type>(gate, g_rs, up, u_rs, y, rows, cols, st);
  });
}

int gated_backward(int act, int dtype, const void* gate, int64_t g_rs, const void* up, int64_t u_rs,
                   const void* dy, int64_t dy_rs, void* dgate, void* dup, int64_t rows, int64_t cols, void* stream) {
  if (bad_shape(rows, cols)) return kBadArgument;
  if (rows == 0 || cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return gated_bwd_t<decltype(a)::value, typename decltype(t)::type>(gate, g_rs, up, u_rs, dy, dy_rs, dgate, dup,
                                                                        rows, cols, st);
  });
}

int bias_act_forward(int act, int dtype, const void* x, int64_t x_rs, const float* bias, void* y, int64_t rows,
                     int64_t cols, void* stream) {
  if (bad_shape(rows, cols) || bias == nullptr) return kBadArgument;
  if (rows == 0 || cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return bias_act_fwd_t<decltype(a)::value, typename decltype(t)::type>(x, x_rs, bias, y, rows, cols, st);
  });
}

int bias_act_backward(int act, int dtype, const void* x, int64_t x_rs, const float* bias, const void* dy,
                      int64_t dy_rs, void* dx, float* db_part, float* db, unsigned* count, int64_t rows,
                      int64_t cols, int64_t programs, void* stream) {
  if (bad_shape(rows, cols) || programs < 1 || programs > kMaxGridY || programs > rows || bias == nullptr ||
      db_part == nullptr || db == nullptr || count == nullptr)
    return kBadArgument;
  if (cols == 0) return 0;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  return dispatch(act, dtype, [&](auto a, auto t) {
    return bias_act_bwd_t<decltype(a)::value, typename decltype(t)::type>(x, x_rs, bias, dy, dy_rs, dx, db_part, db,
                                                                          count, rows, cols, programs, st);
  });
}

}  // namespace ablate
