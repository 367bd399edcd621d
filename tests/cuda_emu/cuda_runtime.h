// A CPU emulation of the CUDA programming model, just enough to run ablate's kernels (and
// their host-side launchers) on a machine without a GPU: tests/ablate/kernels/test_parity.py compiles the .cu
// files as C++ against this directory (it shadows the real cuda_runtime.h and cuda_bf16.h), after
// rewriting each `kernel<<<grid, block, smem, stream>>>(args)` into `emu::launch(...)`.
//
// Model: the blocks of a launch run one after another; the threads of a block run concurrently
// on a pool of OS threads, so __syncthreads is a block-wide barrier and a warp shuffle is an
// exchange through memory between two warp-wide barriers. A function-static array stands in
// for __shared__ memory (one block at a time). A barrier that waits longer than a few seconds
// (threads of a block diverging at a __syncthreads) breaks, and the launch reports an error.
// Not modelled: memory ordering and caches, warp-synchronous behaviour beyond shuffles,
// occupancy, and any timing.
#pragma once

#include <math.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return {a, b}; }
using cudaStream_t = void*;
using cudaError_t = int;

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

namespace emu {

enum : int { kLaunchError = 9, kDeadlock = 6 };
inline std::atomic<bool> broken{false};
inline int last_error = 0;

class Barrier {
 public:
  explicit Barrier(int n) : n_(n), count_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    if (broken) return;
    const int gen = gen_;
    if (--count_ == 0) {
      ++gen_;
      count_ = n_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return gen_ != gen || broken.load(); })) {
      broken = true;
      cv_.notify_all();
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_, gen_ = 0;
};

struct Block {
  std::unique_ptr<Barrier> bar;
  std::vector<std::unique_ptr<Barrier>> warp;
  std::vector<float> xchg;
  std::vector<char> smem;  // dynamic shared memory
};
inline Block* blk = nullptr;
inline thread_local int tid = 0;

// Runs f(0..n-1) on n pooled threads and waits for all of them.
class Pool {
 public:
  void run(int n, const std::function<void(int)>& f) {
    while (static_cast<int>(workers_) < n) {
      const int id = static_cast<int>(workers_++);
      std::thread([this, id] { loop(id); }).detach();
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      job_ = &f;
      active_ = remaining_ = n;
      ++gen_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return remaining_ == 0; });
  }

 private:
  void loop(int id) {
    int seen = 0;
    for (;;) {
      const std::function<void(int)>* f;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return gen_ != seen && id < active_; });
        seen = gen_;
        f = job_;
      }
      (*f)(id);
      std::lock_guard<std::mutex> lock(m_);
      if (--remaining_ == 0) done_.notify_all();
    }
  }
  size_t workers_ = 0;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0, remaining_ = 0, gen_ = 0;
};
inline Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: its threads outlive static destruction
  return *p;
}

struct Cfg {
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};

template <typename... K, typename... A>
void launch(void (*kernel)(K...), Cfg c, A... args) {
  const unsigned n = c.block.x * c.block.y * c.block.z;
  if (n == 0 || n > 1024 || c.block.z > 64 || c.grid.x == 0 || c.grid.y == 0 || c.grid.y > 65535 ||
      c.grid.z > 65535 || c.smem > 48 * 1024) {
    last_error = kLaunchError;
    return;
  }
  gridDim = c.grid;
  blockDim = c.block;
  broken = false;
  for (unsigned bz = 0; bz < c.grid.z; ++bz)
    for (unsigned by = 0; by < c.grid.y; ++by)
      for (unsigned bx = 0; bx < c.grid.x; ++bx) {
        Block b;
        b.bar = std::make_unique<Barrier>(n);
        for (unsigned w = 0; w * 32 < n; ++w) b.warp.push_back(std::make_unique<Barrier>(std::min(32u, n - w * 32)));
        b.xchg.assign(n, 0.f);
        b.smem.assign(c.smem, 0);
        blk = &b;
        pool().run(static_cast<int>(n), [&](int t) {
          threadIdx = dim3(t % c.block.x, (t / c.block.x) % c.block.y, t / (c.block.x * c.block.y));
          blockIdx = dim3(bx, by, bz);
          tid = t;
          kernel(args...);
        });
        if (broken) {
          last_error = kDeadlock;
          return;
        }
      }
}

}  // namespace emu

inline void __syncthreads() { emu::blk->bar->wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int t = emu::tid, w = t / 32, lane = t % 32;
  emu::blk->xchg[t] = v;
  emu::blk->warp[w]->wait();
  const float r = emu::blk->xchg[w * 32 + (lane ^ lane_mask)];
  emu::blk->warp[w]->wait();
  return r;
}

// The blocks of a launch run one after another, so a block that counts itself last with
// atomicAdd sees every other block's writes: a fence only orders this block's own threads.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline float __ldcg(const float* p) { return *p; }

inline int cudaGetLastError() {
  const int e = emu::last_error;
  emu::last_error = 0;
  return e;
}

inline const char* cudaGetErrorString(int e) {
  if (e == emu::kDeadlock) return "emulated deadlock (threads of a block diverged at a barrier)";
  return e ? "emulated launch error (bad launch configuration)" : "no error";
}
