/* Causal self-attention on the CPU (float32), forward and backward: the form `blocked`
 * (ablate/kernels/cpu_attention.py).
 *
 * Why: at the harness's CPU widths (head dimension 16, context 64) torch's CPU flash kernel runs
 * at about a tenth of the matmul peak and was a fifth of a `tiny` step (issue #29). Here each
 * (batch, head) is packed once into zero-padded scratch (rows and columns to multiples of 16) and
 * the products are computed in register tiles: ROWS query rows by 16 keys (scores), ROWS rows by
 * 16 head dimensions (outputs and gradients); the softmax is exact (its row maximum subtracted),
 * with the exponential of exp_poly.h; the backward recomputes the probabilities from the saved
 * row maximum and sum, as flash attention does, instead of keeping T x T of them.
 *
 * Bits: built without fast math (IEEE operations, fused multiply-adds only where fmaf is
 * written). Every sum runs in one fixed order: over the head dimension for a score, over keys
 * in ascending order for an output or dq, over queries in ascending order for dk and dv, and a
 * row's softmax sum in 16 lanes added in a fixed order; vectors only ever run across independent
 * elements. So the AVX2 and AVX-512 copies give the same bits (tested), and so does any thread
 * count: one thread computes a whole (batch, head), in the caller's floating-point mode (its
 * flush-to-zero and denormals-are-zero bits, ablate/fpmode.py, copied into every thread).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "exp_poly.h"
#include "thread_mode.h"

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

/* Query rows per register tile: enough independent accumulators to hide the fused multiply-add's
 * latency, few enough to stay in registers (32 of 16 floats with AVX-512, 16 of 8 with AVX2). The
 * tiling never changes an element's order of operations, so the copies' bits agree. */
#ifdef __AVX512F__
#define ROWS 8
#else
#define ROWS 4
#endif
#define LANES 16 /* keys or head dimensions per register tile */
/* exp(v) below this is under 2^-126 (a subnormal): such a weight is 0, as a GPU's fast path and
 * the harness's flush-to-zero make it, and a NaN still passes through (it fails the test). */
#define EXP_FLOOR -87.0f

typedef struct { int64_t b, h, t; } Strides; /* in floats; the head dimension's stride is 1 */

static int64_t up16(int64_t n) { return (n + LANES - 1) / LANES * LANES; }

/* dst[0..n) = src[0..n), a vector of LANES at a time: a head's row is 16-64 floats, too short
 * for a call to memcpy to pay. */
typedef float lanes_t __attribute__((vector_size(4 * LANES), aligned(4), may_alias)); /* a move, not math */

static inline void copy_row(float *restrict dst, const float *restrict src, int64_t n) {
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) *(lanes_t *)(dst + d) = *(const lanes_t *)(src + d);
    for (; d < n; d++) dst[d] = src[d];
}

/* Copy rows (t, 0..D) of one head into dst[t * Dp + d], zeros in the padding. */
static void pack_rows(const float *restrict src, int64_t st, int64_t T, int64_t D, int64_t Tp, int64_t Dp,
                      float *restrict dst) {
    for (int64_t t = 0; t < Tp; t++) {
        int64_t n = t < T ? D : 0;
        copy_row(dst + t * Dp, src + t * st, n);
        for (int64_t d = n; d < Dp; d++) dst[t * Dp + d] = 0.0f; /* rows past T, head padding */
    }
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* dst[d * Tp + t] = src[t * st + d] for an 8 x 8 block: eight rows in, eight columns out, by
 * shuffles (the scalar loop's strided stores were a tenth of the forward's time with AVX2). */
static inline void transpose8(const float *src, int64_t st, float *dst, int64_t Tp) {
    __m256 r[8], u[8], w[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * st);
    for (int i = 0; i < 8; i += 2) {
        u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* rows i, i+1 interleaved, low pairs */
        u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) {
            w[i + 2 * j] = _mm256_shuffle_ps(u[i + j], u[i + j + 2], _MM_SHUFFLE(1, 0, 1, 0));
            w[i + 2 * j + 1] = _mm256_shuffle_ps(u[i + j], u[i + j + 2], _MM_SHUFFLE(3, 2, 3, 2));
        }
    for (int i = 0; i < 4; i++) { /* w[i]: columns i (low half) and i + 4 of rows 0-3; w[i + 4]: of rows 4-7 */
        _mm256_storeu_ps(dst + i * Tp, _mm256_permute2f128_ps(w[i], w[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * Tp, _mm256_permute2f128_ps(w[i], w[i + 4], 0x31));
    }
}
#endif

/* The same, transposed: dst[d * Tp + t]. A transpose only moves data, so the AVX-512 copy may
 * gather a column of LANES rows at a time. */
static void pack_cols(const float *restrict src, int64_t st, int64_t T, int64_t D, int64_t Tp, int64_t Dp,
                      float *restrict dst) {
#ifdef __AVX512F__
    __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                      _mm512_set1_epi32((int)st));
    for (int64_t t0 = 0; t0 < Tp; t0 += LANES) {
        int64_t left = T - t0;
        __mmask16 valid = left >= LANES ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1));
        for (int64_t d = 0; d < Dp; d++) {
            __m512 col = _mm512_setzero_ps();
            if (d < D && valid) col = _mm512_mask_i32gather_ps(col, valid, rows, src + t0 * st + d, 4);
            _mm512_storeu_ps(dst + d * Tp + t0, col);
        }
    }
#else
    int64_t T8 = 0, D8 = 0;
#ifdef __AVX2__
    T8 = T / 8 * 8;
    D8 = D / 8 * 8;
    for (int64_t t0 = 0; t0 < T8; t0 += 8)
        for (int64_t d0 = 0; d0 < D8; d0 += 8) transpose8(src + t0 * st + d0, st, dst + d0 * Tp + t0, Tp);
#endif
    for (int64_t t = 0; t < T; t++) /* what the 8 x 8 blocks left: the last columns, then the last rows */
        for (int64_t d = t < T8 ? D8 : 0; d < D; d++) dst[d * Tp + t] = src[t * st + d];
    for (int64_t d = 0; d < Dp; d++)
        for (int64_t t = d < D ? T : 0; t < Tp; t++) dst[d * Tp + t] = 0.0f;
#endif
}

/* out[r][c0 + l] = scale * sum_d a[r][d] bt[d][c0 + l] for ROWS rows of a (row stride Dp) and
 * LANES columns of bt (row stride Tp), for every column tile up to `cols`. */
static void tile_products(const float *a, const float *bt, int64_t Dp, int64_t Tp, int64_t cols, float scale,
                          float *out) {
    for (int64_t c0 = 0; c0 < cols; c0 += LANES) {
        float acc[ROWS][LANES] = {{0}};
        for (int64_t d = 0; d < Dp; d++) {
            const float *b = bt + d * Tp + c0;
            for (int r = 0; r < ROWS; r++)
#pragma omp simd
                for (int l = 0; l < LANES; l++) acc[r][l] = fmaf(a[r * Dp + d], b[l], acc[r][l]);
        }
        for (int r = 0; r < ROWS; r++)
#pragma omp simd
            for (int l = 0; l < LANES; l++) out[r * Tp + c0 + l] = acc[r][l] * scale;
    }
}

/* out[r][d] = sum_{j < keys} w[r][j] x[j][d], j ascending, for ROWS rows of w (row stride Tp)
 * and the Dp columns of x (row stride Dp). */
static void weighted_rows(const float *w, const float *x, int64_t keys, int64_t Tp, int64_t Dp, float *out) {
    for (int64_t d0 = 0; d0 < Dp; d0 += LANES) {
        float acc[ROWS][LANES] = {{0}};
        for (int64_t j = 0; j < keys; j++) {
            const float *xj = x + j * Dp + d0;
            for (int r = 0; r < ROWS; r++)
#pragma omp simd
                for (int l = 0; l < LANES; l++) acc[r][l] = fmaf(w[r * Tp + j], xj[l], acc[r][l]);
        }
        for (int r = 0; r < ROWS; r++) memcpy(out + r * Dp + d0, acc[r], sizeof acc[r]);
    }
}

/* acc[j][d] += sum_r w[r][j] x[r][d], r ascending, for keys j < keys: the rows' share of dk or dv. */
static void accumulate_cols(const float *restrict w, const float *restrict x, int64_t keys, int64_t Tp, int64_t Dp,
                            float *restrict acc) {
    for (int64_t d0 = 0; d0 < Dp; d0 += LANES) /* x's ROWS vectors stay in registers across the keys */
        for (int64_t j = 0; j < keys; j++) {
            float *row = acc + j * Dp + d0;
            /* The rows inside the lane loop: a lane's sum stays in a register across them (with
             * the rows outside, the AVX2 copy went through memory, 4x slower). */
#pragma omp simd
            for (int l = 0; l < LANES; l++) {
                float a = row[l];
                for (int r = 0; r < ROWS; r++) a = fmaf(w[r * Tp + j], x[r * Dp + d0 + l], a);
                row[l] = a;
            }
        }
}

/* A pairwise sum of the lanes (lane l + lane l + width, halving the width): a fixed order with
 * a dependency chain of 4 additions, not 16. Overwrites `lane`. */
static inline float lanes_sum(float *lane) {
#pragma GCC unroll 4
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lane[l] += lane[l + width];
    return lane[0];
}

static inline float lanes_max(float *lane) {
#pragma GCC unroll 4
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; l++) lane[l] = lane[l + width] > lane[l] ? lane[l + width] : lane[l];
    return lane[0];
}

/* The unnormalised softmax weights of the ROWS rows from i0, in place over their scores
 * (keys beyond a row's own position get 0), with each row's maximum and sum when `m`/`sum` are
 * written (forward) or read (backward, `from_stats`). */
static void softmax_rows(float *s, int64_t i0, int64_t cols, int64_t Tp, float *m, float *sum, int from_stats) {
    for (int r = 0; r < ROWS; r++) {
        float *row = s + r * Tp;
        int64_t i = i0 + r;
        if (!from_stats) { /* the maximum in LANES lanes, then across them: exact in any order */
            float top[LANES];
            for (int l = 0; l < LANES; l++) top[l] = -INFINITY;
            for (int64_t c0 = 0; c0 < cols; c0 += LANES)
#pragma omp simd
                for (int l = 0; l < LANES; l++) top[l] = (c0 + l <= i && row[c0 + l] > top[l]) ? row[c0 + l] : top[l];
            m[r] = lanes_max(top);
        }
        float lane[LANES] = {0};
        for (int64_t c0 = 0; c0 < cols; c0 += LANES)
#pragma omp simd
            for (int l = 0; l < LANES; l++) {
                float v = row[c0 + l] - m[r], e = exp_poly(v < EXP_FLOOR ? EXP_FLOOR : v);
                row[c0 + l] = (c0 + l > i || v < EXP_FLOOR) ? 0.0f : e;
                lane[l] += row[c0 + l];
            }
        if (!from_stats) sum[r] = lanes_sum(lane);
    }
}

/* Scratch floats a thread needs for one (batch, head), the larger of the two passes': forward 3
 * packed heads, ROWS score rows and ROWS output rows; backward 5 packed heads, the dk and dv
 * accumulators, ROWS rows of P and of dS, ROWS dq rows and each row's D_i. */
static int64_t scratch_floats(int64_t Tp, int64_t Dp) { return 7 * Tp * Dp + 2 * ROWS * Tp + ROWS * Dp + Tp; }

/* The (batch, head, position) strides of the i-th tensor in the callers' array. */
static Strides strides_of(const int64_t *strides, int i) {
    return (Strides){strides[3 * i], strides[3 * i + 1], strides[3 * i + 2]};
}

/* sum_d a[d] b[d] over Dp (a multiple of LANES) in LANES lanes, then pairwise across them. */
static float row_dot(const float *a, const float *b, int64_t Dp) {
    float lane[LANES] = {0};
    for (int64_t d0 = 0; d0 < Dp; d0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) lane[l] = fmaf(a[d0 + l], b[d0 + l], lane[l]);
    return lanes_sum(lane);
}

void CAT(attention_fwd_, ISA)(const float *q, const float *k, const float *v, const int64_t *strides,
                              int64_t B, int64_t H, int64_t T, int64_t D, float scale, float *o, float *stats,
                              int threads) {
    Strides sq = strides_of(strides, 0), sk = strides_of(strides, 1), sv = strides_of(strides, 2);
    int64_t Tp = up16(T), Dp = up16(D);
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
        float *buf = malloc(sizeof(float) * scratch_floats(Tp, Dp));
        float *qp = buf, *kt = qp + Tp * Dp, *vp = kt + Tp * Dp, *s = vp + Tp * Dp, *out = s + ROWS * Tp;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; bh++) {
            int64_t b = bh / H, h = bh % H;
            pack_rows(q + b * sq.b + h * sq.h, sq.t, T, D, Tp, Dp, qp);
            pack_cols(k + b * sk.b + h * sk.h, sk.t, T, D, Tp, Dp, kt);
            pack_rows(v + b * sv.b + h * sv.h, sv.t, T, D, Tp, Dp, vp);
            float *st = stats + bh * T * 2;
            for (int64_t i0 = 0; i0 < T; i0 += ROWS) {
                int64_t keys = i0 + ROWS < T ? i0 + ROWS : T, cols = up16(keys);
                float m[ROWS], sum[ROWS];
                tile_products(qp + i0 * Dp, kt, Dp, Tp, cols, scale, s);
                softmax_rows(s, i0, cols, Tp, m, sum, 0);
                weighted_rows(s, vp, keys, Tp, Dp, out);
                for (int r = 0; r < ROWS && i0 + r < T; r++) {
                    float *dst = o + ((b * T + i0 + r) * H + h) * D;
                    for (int64_t d = 0; d < D; d++) dst[d] = out[r * Dp + d] / sum[r];
                    st[(i0 + r) * 2] = m[r];
                    st[(i0 + r) * 2 + 1] = sum[r];
                }
            }
        }
        free(buf);
        _mm_setcsr(own);
    }
}

/* dq, dk, dv from the output's gradient `dout` (strides[9..11]), each position's H x D values
 * `grad_row` floats after the last's: H D for three (B, T, H, D) tensors, 3 H D for one
 * (B, T, 3 H D) gradient of c_attn's output, dk and dv at dq + H D and + 2 H D. A row's
 * D_i = sum_d dout[i][d] o[i][d] (= sum_j P[i][j] dP[i][j]) is summed as row_dot does. */
void CAT(attention_bwd_, ISA)(const float *q, const float *k, const float *v, const float *dout,
                              const int64_t *strides, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                              const float *o, const float *stats, float *dq, float *dk, float *dv, int64_t grad_row,
                              int threads) {
    Strides sq = strides_of(strides, 0), sk = strides_of(strides, 1), sv = strides_of(strides, 2),
            sd = strides_of(strides, 3);
    int64_t Tp = up16(T), Dp = up16(D);
    unsigned int mode = _mm_getcsr();
#pragma omp parallel num_threads(threads)
    {
        unsigned int own = take_mode(mode);
        float *buf = malloc(sizeof(float) * scratch_floats(Tp, Dp));
        float *qp = buf, *kp = qp + Tp * Dp, *kt = kp + Tp * Dp, *vt = kt + Tp * Dp, *dop = vt + Tp * Dp;
        float *dkp = dop + Tp * Dp, *dvp = dkp + Tp * Dp, *p = dvp + Tp * Dp, *ds = p + ROWS * Tp;
        float *dqrow = ds + ROWS * Tp, *dis = dqrow + ROWS * Dp;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; bh++) {
            int64_t b = bh / H, h = bh % H;
            pack_rows(q + b * sq.b + h * sq.h, sq.t, T, D, Tp, Dp, qp);
            pack_rows(k + b * sk.b + h * sk.h, sk.t, T, D, Tp, Dp, kp);
            pack_cols(k + b * sk.b + h * sk.h, sk.t, T, D, Tp, Dp, kt);
            pack_cols(v + b * sv.b + h * sv.h, sv.t, T, D, Tp, Dp, vt);
            pack_rows(dout + b * sd.b + h * sd.h, sd.t, T, D, Tp, Dp, dop);
            pack_rows(o + (b * T * H + h) * D, H * D, T, D, Tp, Dp, dkp); /* o, briefly */
            for (int64_t t = 0; t < Tp; t++) dis[t] = row_dot(dop + t * Dp, dkp + t * Dp, Dp);
            memset(dkp, 0, sizeof(float) * 2 * Tp * Dp); /* dkp and dvp */
            const float *st = stats + bh * T * 2;
            for (int64_t i0 = 0; i0 < T; i0 += ROWS) {
                int64_t keys = i0 + ROWS < T ? i0 + ROWS : T, cols = up16(keys);
                float m[ROWS], sum[ROWS];
                const float *di = dis + i0;
                for (int r = 0; r < ROWS; r++) { /* rows past T: zero gradients, finite weights */
                    m[r] = i0 + r < T ? st[(i0 + r) * 2] : 0.0f;
                    sum[r] = i0 + r < T ? st[(i0 + r) * 2 + 1] : 1.0f;
                }
                tile_products(qp + i0 * Dp, kt, Dp, Tp, cols, scale, p);
                softmax_rows(p, i0, cols, Tp, m, sum, 1);
                tile_products(dop + i0 * Dp, vt, Dp, Tp, cols, 1.0f, ds); /* dP */
                for (int r = 0; r < ROWS; r++)
#pragma omp simd
                    for (int64_t j = 0; j < cols; j++) {
                        float pj = p[r * Tp + j] / sum[r];
                        p[r * Tp + j] = pj;
                        ds[r * Tp + j] = pj * (ds[r * Tp + j] - di[r]) * scale;
                    }
                accumulate_cols(p, dop + i0 * Dp, keys, Tp, Dp, dvp);
                accumulate_cols(ds, qp + i0 * Dp, keys, Tp, Dp, dkp);
                weighted_rows(ds, kp, keys, Tp, Dp, dqrow);
                for (int r = 0; r < ROWS && i0 + r < T; r++)
                    copy_row(dq + (b * T + i0 + r) * grad_row + h * D, dqrow + r * Dp, D);
            }
            for (int64_t t = 0; t < T; t++) {
                copy_row(dk + (b * T + t) * grad_row + h * D, dkp + t * Dp, D);
                copy_row(dv + (b * T + t) * grad_row + h * D, dvp + t * Dp, D);
            }
        }
        free(buf);
        _mm_setcsr(own);
    }
}
