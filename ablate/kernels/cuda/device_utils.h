// Device helpers shared by the .cu files: float conversion, 16-byte packs, activations.
// Included by CUDA sources only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ablate_kernels.h"

namespace ablate {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>  // round to nearest even, as torch
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// N elements moved as one (up to 16-byte) load or store.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// Elements per 16-byte pack.
template <typename T>
constexpr int vec_width() { return static_cast<int>(16 / sizeof(T)); }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- reductions across blocks: the last block to arrive sums the partial rows --------------
// Every block calls it after writing its partial rows; true in the one block that arrives last
// at `count` (which `blocks` blocks share), which then reads every block's rows and resets
// `count` to zero for the next launch. The fence before the count makes this block's rows
// visible device-wide; the one after it, in the last block, orders its reads after them.
__device__ __forceinline__ bool last_to_arrive(unsigned* count, unsigned blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(count, 1u) == blocks - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// ---- activations, in float32; the same formulas as triton_kernels.py -------------------------
// GELU tanh approximation: 0.5 x (1 + tanh(u)), u = K (x + C x^3), computed as the equal
// x * sigmoid(2u); derivative s + x s (1 - s) 2K (1 + 3C x^2) with s = sigmoid(2u).
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

template <int ACT>
__device__ __forceinline__ float act_fwd(float x) {
  if constexpr (ACT == kGelu) {
    const float u = kGeluK * (x + kGeluC * x * x * x);
    return x / (1.f + expf(-2.f * u));
  } else if constexpr (ACT == kGeluErf) {
    return 0.5f * x * (1.f + erff(x * kInvSqrt2));
  } else if constexpr (ACT == kRelu) {
    return x <= 0.f ? 0.f : x;  // NaN passes through, as torch.relu
  } else if constexpr (ACT == kSilu) {
    return x / (1.f + expf(-x));
  } else {
    const float r = x <= 0.f ? 0.f : x;
    return r * r;
  }
}

// act(x), and act'(x) in d (analytic).
template <int ACT>
__device__ __forceinline__ float act_fwd_grad(float x, float& d) {
  if constexpr (ACT == kGelu) {
    const float x2 = x * x;
    const float u = kGeluK * (x + kGeluC * x2 * x);
    const float e = expf(-2.f * u);
    const float s = 1.f / (1.f + e);
    const float om = s > 0.5f ? e * s : 1.f - s;  // 1 - s without cancellation as s -> 1
    d = s + x * s * om * (2.f * kGeluK) * (1.f + 3.f * kGeluC * x2);
    return x * s;
  } else if constexpr (ACT == kGeluErf) {
    const float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
    d = cdf + x * kInvSqrt2Pi * expf(-0.5f * x * x);
    return x * cdf;
  } else if constexpr (ACT == kRelu) {
    d = x > 0.f ? 1.f : 0.f;
    return x <= 0.f ? 0.f : x;
  } else if constexpr (ACT == kSilu) {
    const float e = expf(-x);
    const float s = 1.f / (1.f + e);
    const float om = s > 0.5f ? e * s : 1.f - s;
    d = s * (1.f + x * om);
    return x * s;
  } else {
    const float r = x <= 0.f ? 0.f : x;
    d = 2.f * r;
    return r * r;
  }
}

}  // namespace ablate
