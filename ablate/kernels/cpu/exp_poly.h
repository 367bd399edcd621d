/* The exponential the CPU kernels inline (gelu_tanh_poly.c, attention.c): IEEE operations and
 * explicit fused multiply-adds only, so every instruction set computes it to the same bits. */
#ifndef ABLATE_EXP_POLY_H
#define ABLATE_EXP_POLY_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(v) for |v| <= 87: 2^n p(r), n = round(v / ln 2), r = v - n ln 2 (ln 2 in two parts,
 * Cody-Waite), p the Taylor polynomial to r^7 (|r| <= ln 2 / 2: relative error below 6e-9),
 * 2^n built in the exponent bits. */
static inline float exp_poly(float v) {
    float n = rintf(v * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, v);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.98412698412698413e-4f;
    p = fmaf(p, r, 1.38888888888888889e-3f);
    p = fmaf(p, r, 8.33333333333333333e-3f);
    p = fmaf(p, r, 4.16666666666666667e-2f);
    p = fmaf(p, r, 1.66666666666666667e-1f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
