/* GPT-2's tanh-GELU on the CPU in one pass forward and one backward (float32), with its own
 * exponential: the form `poly` (ablate/kernels/cpu_gelu.py).
 *
 * y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + exp(-2u))
 * (the same function), as gelu_tanh.c does. That file calls glibc's vector expf, a function
 * call per vector that spills registers and, with the division, cost about 1.3 ns an element
 * here, twice torch's erf GELU; the exponential below is inlined (Cody-Waite reduction by
 * ln 2, a degree-7 polynomial, 2^n built in the exponent bits) and the loops vectorize whole.
 *
 * Bits: built without fast math (IEEE operations, fused multiply-adds only where fmaf is
 * written), so the AVX2 and AVX-512 copies compute every element by the same operations and
 * give the same bits (tested); the work is cut into fixed BLOCK-element blocks from index 0,
 * so an element's result never depends on the thread count either, and every thread computes in
 * the caller's flush-to-zero mode (thread_mode.h).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp_poly.h"
#include "thread_mode.h"

/* Compiled once per instruction set (ablate/kernels/cpu_gelu.py): ISA names the copy. */
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

#define K 1.5957691216057308f /* 2 sqrt(2/pi) */
#define KC (K * 0.044715f)
#define BLOCK 4096

/* Beyond |x| = TAIL the function is x or 0 to float precision (at x = 9.5, exp(-2u) = 7e-34)
 * and so is its derivative, 1 or 0; inside it exp(-2u) stays within [7e-34, 1.4e33], normal
 * floats, so no cap or overflow is needed and no subnormal is made. Past it y is x (x > 0) or
 * 0 * x (x < 0: -0, and NaN at -inf, as torch's 0.5 x (1 + tanh u) gives); a NaN x fails both
 * tests and stays NaN through the formula. */
#define TAIL 9.5f

/* exp(-2u) for |v| <= TAIL, so sigmoid(2u) = 1 / (1 + exp(-2u)); the clamp keeps a NaN or
 * tail v's (unused) lane inside exp_poly's range. */
static inline float e2u(float v) {
    float c = v > TAIL ? TAIL : (v < -TAIL ? -TAIL : v);
    return exp_poly(-c * fmaf(KC * c, c, K));
}

void CAT(gelu_tanh_fwd_, ISA)(const float *x, float *y, int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t lo = b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
#pragma omp simd
            for (int64_t i = lo; i < hi; i++) {
                float v = x[i], inner = v / (1.0f + e2u(v));
                y[i] = v > TAIL ? v : (v < -TAIL ? 0.0f * v : inner);
            }
        }
        _mm_setcsr(own);
    }
}

void CAT(gelu_tanh_bwd_, ISA)(const float *x, const float *dy, float *dx, int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t lo = b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
#pragma omp simd
            for (int64_t i = lo; i < hi; i++) {
                float v = x[i], e = e2u(v), s = 1.0f / (1.0f + e), t = e * s; /* t = 1 - s, without cancelling */
                /* d/dx x s(2u) = s + x s (1 - s) d(2u)/dx, d(2u)/dx = K + 3 KC x^2 */
                float inner = fmaf(v * s * t, fmaf(3.0f * KC * v, v, K), s);
                dx[i] = (v > TAIL ? 1.0f : (v < -TAIL ? 0.0f * v : inner)) * dy[i];
            }
        }
        _mm_setcsr(own);
    }
}
