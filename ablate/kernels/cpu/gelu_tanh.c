/* GPT-2's tanh-GELU on the CPU in one pass forward and one backward (float32).
 *
 * y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x * sigmoid(2u)
 * (the same function). torch's CPU path for it is four elementwise passes forward and five
 * backward (variants/activations.py); here each element is read once and written once.
 *
 * Bits: the work is cut into fixed BLOCK-element blocks from index 0, whatever the thread
 * count, and every element of a block but the array's last partial one goes through the same
 * vector code, so an element's result depends on its value and position only, never on how
 * many threads ran. Built with -ffast-math but finite math kept (inf and NaN must propagate:
 * a diverging cell produces them) and linked without it (GCC 12 would link crtfastmath.o,
 * which sets flush-to-zero for the whole process at load time).
 */
#include <math.h>
#include <stdint.h>

/* Compiled once per instruction set (ablate/kernels/cpu_gelu.py): ISA names the copy. */
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

#define K 1.5957691216057308f      /* 2 sqrt(2/pi) */
#define KC (K * 0.044715f)
#define BLOCK 4096

/* exp(-2u), so sigmoid(2u) = 1 / (1 + exp(-2u)). The exponent is capped below expf's overflow (88.7): under fast math an
 * infinite exp would turn x * 1/(1 + inf) into NaN; at the cap the sigmoid is ~6e-39, so the
 * product is the same zero (or below 1e-36) that the exact function gives. */
static inline float e2u(float v) { return expf(fminf(-v * (K + KC * v * v), 88.0f)); } /* exp(-2u) */

void CAT(gelu_tanh_fwd_, ISA)(const float *x, float *y, int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) y[i] = x[i] / (1.0f + e2u(x[i]));
    }
}

void CAT(gelu_tanh_bwd_, ISA)(const float *x, const float *dy, float *dx, int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = b * BLOCK, hi = lo + BLOCK < n ? lo + BLOCK : n;
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) {
            float v = x[i], e = e2u(v), s = 1.0f / (1.0f + e), t = e / (1.0f + e); /* t = 1 - s */
            /* d/dx x s(2u) = s + x s (1 - s) d(2u)/dx, d(2u)/dx = K + 3 KC x^2, with 1 - s as its
             * own quotient: fast math may rewrite x s (1 - s) as x s - x s s, whose difference of
             * near-equal numbers cost 6e-5 at x = 16, where the exact term is 0. */
            dx[i] = (s + v * s * t * (K + 3.0f * KC * v * v)) * dy[i];
        }
    }
}
