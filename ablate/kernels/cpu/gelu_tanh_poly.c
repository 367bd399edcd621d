/* GPT-2's tanh-GELU on the CPU in one pass forward and one backward (float32), with its own
 * exponential: the form `poly` (ablate/kernels/cpu_gelu.py).
 *
 * y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + exp(-2u))
 * (the same function), as gelu_tanh.c does. That file calls glibc's vector expf, a function
 * call per vector that spills registers and, with the division, cost about 1.3 ns an element
 * here, twice torch's erf GELU; the exponential here is inlined (exp_poly.h) and the loops are
 * written in vec.h's vectors: GCC vectorized the scalar form of this file into twice the
 * compares and blends its clamps need (fminf would not vectorize at all).
 *
 * Bits: IEEE operations only, fused multiply-adds where written, so the AVX2 and AVX-512
 * copies compute every element by the same operations and give the same bits (tested), and so
 * did the scalar form this replaced (every float32 input compared, both directions); the work
 * is cut into fixed BLOCK-element blocks from index 0, so an element's result never depends on
 * the thread count either, and every thread computes in the caller's flush-to-zero mode
 * (thread_mode.h). An array's last few elements go through the same vector code, padded.
 */
#include <stdint.h>
#include <string.h>

#include "vec.h"
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
 * floats, so no cap or overflow is needed and no subnormal is made. Past it y is x (x > 0:
 * x / (1 + exp(-2u(TAIL))) is x / 1) or 0 * x (x < 0: -0, and NaN at -inf, as torch's
 * 0.5 x (1 + tanh u) gives); a NaN x fails the tail tests and stays NaN through the formula. */
#define TAIL 9.5f

/* exp(-2u) at x clamped to [-TAIL, TAIL] (a NaN x to -TAIL: x86's max takes its second
 * operand), so sigmoid(2u) = 1 / (1 + exp(-2u)); -2u = c * -(KC c c + K). */
static inline vf e2u(vf x) {
    vf c = v_min(v_max(x, v_set(-TAIL)), v_set(TAIL));
    return exp_poly_v(v_mul(c, v_fnms(v_mul(v_set(KC), c), c, v_set(K))));
}

static inline vf gelu(vf x) {
    vf inner = v_div(x, v_add(v_set(1.0f), e2u(x)));
    return v_select(v_lt(x, v_set(-TAIL)), v_mul(v_set(0.0f), x), inner);
}

/* d/dx x s(2u) = s + x s (1 - s) d(2u)/dx, d(2u)/dx = K + 3 KC x^2, s = sigmoid(2u), 1 - s = e s
 * (without cancelling). */
static inline vf gelu_grad(vf x, vf dy) {
    vf e = e2u(x), s = v_div(v_set(1.0f), v_add(v_set(1.0f), e)), t = v_mul(e, s);
    vf inner = v_fma(v_mul(v_mul(x, s), t), v_fma(v_mul(v_set(3.0f * KC), x), x, v_set(K)), s);
    vf slope = v_select(v_gt(x, v_set(TAIL)), v_set(1.0f), inner);
    return v_mul(v_select(v_lt(x, v_set(-TAIL)), v_mul(v_set(0.0f), x), slope), dy);
}

/* y[i] = gelu(x[i]) (dy NULL) or dx[i] = gelu'(x[i]) dy[i], for i in [lo, hi). */
static inline void run(const float *x, const float *dy, float *out, int64_t lo, int64_t hi) {
    int64_t i = lo;
    for (; i + VW <= hi; i += VW)
        v_store(out + i, dy ? gelu_grad(v_load(x + i), v_load(dy + i)) : gelu(v_load(x + i)));
    if (i < hi) {
        float xs[VW] = {0}, dys[VW] = {0}, outs[VW];
        memcpy(xs, x + i, (hi - i) * sizeof(float));
        if (dy)
            memcpy(dys, dy + i, (hi - i) * sizeof(float));
        v_store(outs, dy ? gelu_grad(v_load(xs), v_load(dys)) : gelu(v_load(xs)));
        memcpy(out + i, outs, (hi - i) * sizeof(float));
    }
}

static void run_blocks(const float *x, const float *dy, float *out, int64_t n, int threads) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++)
            run(x, dy, out, b * BLOCK, b * BLOCK + BLOCK < n ? b * BLOCK + BLOCK : n);
        _mm_setcsr(own);
    }
}

void CAT(gelu_tanh_fwd_, ISA)(const float *x, float *y, int64_t n, int threads) {
    run_blocks(x, NULL, y, n, threads);
}

void CAT(gelu_tanh_bwd_, ISA)(const float *x, const float *dy, float *dx, int64_t n, int threads) {
    run_blocks(x, dy, dx, n, threads);
}

/* The dense MLP's first layer with its bias (the form `poly-bias`, ablate/kernels/cpu_gelu.py):
 * torch computes h = x W^T without the bias, and these add it as they read h, forward
 * y[r][c] = gelu(h[r][c] + b[c]) and backward dz[r][c] = gelu'(h[r][c] + b[c]) dy[r][c], with the
 * bias's gradient db[c] = sum over r of dz[r][c] in the same pass. So neither torch's addmm
 * (which first copies the bias into every row of its output) nor a separate column sum is paid.
 *
 * Bits: h + b is one IEEE add, then the same operations as gelu() and gelu_grad() above. Rows are
 * cut into fixed blocks of `rpb` rows from row 0 (the caller picks rpb from the shape alone);
 * a block adds its rows' dz in row order into its own row of `partial`, and db adds the blocks'
 * rows in block order, element by element, so neither the thread count nor the vector width
 * changes a bit. A row's last cols % VW elements go through the same code, padded. */

/* A row's last n < VW elements, padded: dy NULL, out = gelu(h + b); otherwise out = dz and
 * acc += dz. */
static void bias_tail(const float *h, const float *b, const float *dy, float *out, float *acc, int64_t n) {
    float hs[VW] = {0}, bs[VW] = {0}, dys[VW] = {0}, accs[VW] = {0}, outs[VW];
    memcpy(hs, h, n * sizeof(float));
    memcpy(bs, b, n * sizeof(float));
    vf z = v_add(v_load(hs), v_load(bs));
    if (!dy) {
        v_store(outs, gelu(z));
    } else {
        memcpy(dys, dy, n * sizeof(float));
        memcpy(accs, acc, n * sizeof(float));
        vf d = gelu_grad(z, v_load(dys));
        v_store(outs, d);
        v_store(accs, v_add(v_load(accs), d));
        memcpy(acc, accs, n * sizeof(float));
    }
    memcpy(out, outs, n * sizeof(float));
}

static inline void bias_fwd_row(const float *h, const float *b, float *y, int64_t cols) {
    int64_t c = 0;
    for (; c + VW <= cols; c += VW)
        v_store(y + c, gelu(v_add(v_load(h + c), v_load(b + c))));
    if (c < cols)
        bias_tail(h + c, b + c, NULL, y + c, NULL, cols - c);
}

static inline void bias_bwd_row(const float *h, const float *b, const float *dy, float *dz, float *acc,
                                int64_t cols) {
    int64_t c = 0;
    for (; c + VW <= cols; c += VW) {
        vf d = gelu_grad(v_add(v_load(h + c), v_load(b + c)), v_load(dy + c));
        v_store(dz + c, d);
        v_store(acc + c, v_add(v_load(acc + c), d));
    }
    if (c < cols)
        bias_tail(h + c, b + c, dy + c, dz + c, acc + c, cols - c);
}

/* Every block of rows, in parallel; with dy, each block's dz summed into its row of partial. */
static void bias_blocks(const float *h, const float *b, const float *dy, float *out, float *partial,
                        int64_t rows, int64_t cols, int64_t rpb, int threads) {
    int64_t blocks = (rows + rpb - 1) / rpb;
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
#pragma omp for schedule(static)
        for (int64_t k = 0; k < blocks; k++) {
            float *acc = dy ? partial + k * cols : NULL;
            if (acc)
                memset(acc, 0, cols * sizeof(float));
            int64_t end = (k + 1) * rpb < rows ? (k + 1) * rpb : rows;
            if (dy)
                for (int64_t r = k * rpb; r < end; r++)
                    bias_bwd_row(h + r * cols, b, dy + r * cols, out + r * cols, acc, cols);
            else
                for (int64_t r = k * rpb; r < end; r++)
                    bias_fwd_row(h + r * cols, b, out + r * cols, cols);
        }
        _mm_setcsr(own);
    }
}

void CAT(gelu_bias_fwd_, ISA)(const float *h, const float *b, float *y, int64_t rows, int64_t cols, int64_t rpb,
                              int threads) {
    bias_blocks(h, b, NULL, y, NULL, rows, cols, rpb, threads);
}

/* partial: (rows + rpb - 1) / rpb rows of cols floats, scratch. */
void CAT(gelu_bias_bwd_, ISA)(const float *h, const float *b, const float *dy, float *dz, float *partial, float *db,
                              int64_t rows, int64_t cols, int64_t rpb, int threads) {
    bias_blocks(h, b, dy, dz, partial, rows, cols, rpb, threads);
    int64_t blocks = (rows + rpb - 1) / rpb;
    memset(db, 0, cols * sizeof(float));
    for (int64_t k = 0; k < blocks; k++) {
        const float *p = partial + k * cols;
        int64_t c = 0;
        for (; c + VW <= cols; c += VW)
            v_store(db + c, v_add(v_load(db + c), v_load(p + c)));
        for (; c < cols; c++)
            db[c] = db[c] + p[c];
    }
}
