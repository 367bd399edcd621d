/* Float vectors of the instruction set a copy is built for (AVX-512: 16 lanes, AVX2: 8), for the
 * kernels whose loops GCC will not vectorize as written (gelu_tanh_poly.c): each operation is
 * the same IEEE operation in every lane, so both copies compute an element to the same bits. */
#ifndef ABLATE_VEC_H
#define ABLATE_VEC_H
#include <immintrin.h>

#ifdef __AVX512F__
#define VW 16
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vmask;
#define v_set(x) _mm512_set1_ps(x)
#define v_load(p) _mm512_loadu_ps(p)
#define v_store(p, a) _mm512_storeu_ps(p, a)
#define v_add(a, b) _mm512_add_ps(a, b)
#define v_sub(a, b) _mm512_sub_ps(a, b)
#define v_mul(a, b) _mm512_mul_ps(a, b)
#define v_div(a, b) _mm512_div_ps(a, b)
#define v_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define v_fnms(a, b, c) _mm512_fnmsub_ps(a, b, c)     /* -(a b + c), one rounding */
#define v_max(a, b) _mm512_max_ps(a, b)               /* x86's: b where either is NaN */
#define v_min(a, b) _mm512_min_ps(a, b)
#define v_lt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define v_gt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)
#define v_select(m, a, b) _mm512_mask_blend_ps(m, b, a) /* m ? a : b */
#define v_bits(a) _mm512_castps_si512(a)
#define v_float(i) _mm512_castsi512_ps(i)
#define vi_add(i, j) _mm512_add_epi32(i, j)
#define vi_set(x) _mm512_set1_epi32(x)
#define vi_shl(i, n) _mm512_slli_epi32(i, n)
#else
#define VW 8
typedef __m256 vf;
typedef __m256i vi;
typedef __m256 vmask;
#define v_set(x) _mm256_set1_ps(x)
#define v_load(p) _mm256_loadu_ps(p)
#define v_store(p, a) _mm256_storeu_ps(p, a)
#define v_add(a, b) _mm256_add_ps(a, b)
#define v_sub(a, b) _mm256_sub_ps(a, b)
#define v_mul(a, b) _mm256_mul_ps(a, b)
#define v_div(a, b) _mm256_div_ps(a, b)
#define v_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define v_fnms(a, b, c) _mm256_fnmsub_ps(a, b, c)
#define v_max(a, b) _mm256_max_ps(a, b)
#define v_min(a, b) _mm256_min_ps(a, b)
#define v_lt(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define v_gt(a, b) _mm256_cmp_ps(a, b, _CMP_GT_OQ)
#define v_select(m, a, b) _mm256_blendv_ps(b, a, m)
#define v_bits(a) _mm256_castps_si256(a)
#define v_float(i) _mm256_castsi256_ps(i)
#define vi_add(i, j) _mm256_add_epi32(i, j)
#define vi_set(x) _mm256_set1_epi32(x)
#define vi_shl(i, n) _mm256_slli_epi32(i, n)
#endif

#endif
