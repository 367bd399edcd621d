/* The exponential the CPU kernels inline (gelu_tanh_poly.c, attention.c): IEEE operations and
 * explicit fused multiply-adds only, so every instruction set computes it to the same bits.
 *
 * exp(v) for |v| <= 87: 2^n p(r), n = round(v / ln 2), r = v - n ln 2 (ln 2 in two parts,
 * Cody-Waite), p the Taylor polynomial to r^7 (|r| <= ln 2 / 2: relative error below 6e-9),
 * 2^n built in the exponent bits. exp_poly is the scalar form (loops GCC vectorizes), exp_poly_v
 * the same operations on vec.h's vectors, defined where vec.h is included before this file. */
#ifndef ABLATE_EXP_POLY_H
#define ABLATE_EXP_POLY_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI -0.693145751953125f
#define EXP_LN2_LO -1.428606765330187045e-06f
#define EXP_P7 1.98412698412698413e-4f
#define EXP_P6 1.38888888888888889e-3f
#define EXP_P5 8.33333333333333333e-3f
#define EXP_P4 4.16666666666666667e-2f
#define EXP_P3 1.66666666666666667e-1f

static inline float exp_poly(float v) {
    float n = rintf(v * EXP_LOG2E);
    float r = fmaf(n, EXP_LN2_LO, fmaf(n, EXP_LN2_HI, v));
    float p = EXP_P7;
    p = fmaf(p, r, EXP_P6);
    p = fmaf(p, r, EXP_P5);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#ifdef ABLATE_VEC_H
/* rint by the 1.5 * 2^23 shifter: v / ln 2 rounded, plus the shifter, rounds to the nearest
 * integer (ties to even, as rintf in the default mode) for |v / ln 2| < 2^22, and that integer
 * is the sum's low bits, so 2^n comes from them without a conversion. */
#define EXP_SHIFTER 12582912.0f
static inline vf exp_poly_v(vf v) {
    vf shifted = v_add(v_mul(v, v_set(EXP_LOG2E)), v_set(EXP_SHIFTER));
    vf n = v_sub(shifted, v_set(EXP_SHIFTER));
    vf r = v_fma(n, v_set(EXP_LN2_LO), v_fma(n, v_set(EXP_LN2_HI), v));
    vf p = v_set(EXP_P7);
    p = v_fma(p, r, v_set(EXP_P6));
    p = v_fma(p, r, v_set(EXP_P5));
    p = v_fma(p, r, v_set(EXP_P4));
    p = v_fma(p, r, v_set(EXP_P3));
    p = v_fma(p, r, v_set(0.5f));
    p = v_fma(p, r, v_set(1.0f));
    p = v_fma(p, r, v_set(1.0f));
    /* (n + 127) << 23 with n = bits(shifted) - bits(shifter) */
    vi scale = vi_shl(vi_add(v_bits(shifted), vi_set(127 - 0x4b400000)), 23);
    return v_mul(p, v_float(scale));
}
#endif

#endif
