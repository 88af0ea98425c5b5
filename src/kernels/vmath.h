/* Vectorised fp32 math over arrays: exp (with a fused sum for softmax), max
 * and scaling, the passes of a softmax over long rows.
 *
 * exp(x) = 2^k · p(r), with k = round(x·log2 e), r = x − k·ln2 taken in two
 * steps (ln2 split into a float head and a float tail, both applied with
 * FMA), and p(r) = 1 + r + r²·q(r), q of degree 4 fitted by Remez to the
 * relative error of exp on |r| ≤ 0.3473 (fit error 0.035 ulp). 2^k is
 * applied as one correctly rounded scaling, so:
 *   - normal results (x in [−87.336, 88.722]) are within 1.02 ulp of exp(x)
 *     (max 1.014 ulp, measured against double exp over every float in that
 *     range: test_vmath with WHALE_VMATH_EXHAUSTIVE=1);
 *   - x in (−103.97, −87.336) gives the correctly scaled subnormal (gradual
 *     underflow, abs error ≤ 1 subnormal step, measured 0.75), x below
 *     about −103.97 (where exp < 2^-150) and −inf give exactly +0;
 *   - x > 88.722 and +inf give +inf; NaN gives NaN.
 * The AVX-512 path and the portable scalar path run the same operations in
 * the same order (FMA where the AVX-512 path uses FMA), so they return the
 * same bits; tests/test_vmath.c checks this. */
#ifndef WHALE_VMATH_H
#define WHALE_VMATH_H

/* exp of one float, the scalar path of the functions below. */
float k_exp1(float x);

/* dst[i] = exp(x[i]) for i < n. dst may alias x. */
void k_exp(float *dst, const float *x, long n);

/* dst[i] = exp((x[i] − sub)·scale) (the argument rounded to float after the
 * subtraction and after the product, no FMA), and returns Σ dst[i].
 * dst may alias x, or be NULL to get the sum only.
 * Summation order (fixed, so the sum is deterministic): element i goes to
 * lane i mod 16; each lane sums its elements in fp32 within blocks of 256
 * array elements (16 per lane) and adds each block's partial to a double
 * lane total; the 16 lane totals are added in lane order in double. With
 * u = 2^-24, the sum of the returned exps is off by at most
 *   15u·S + (n/256 + 16)·2^-53·S   (S = exact sum of the exps, all ≥ 0),
 * i.e. ≤ 9.0e-7·S relative, on top of each exp's own ≤ 1.02 ulp. */
double k_exp_sum(float *dst, const float *x, float sub, float scale, long n);

/* What k_exp_sum computes on a machine without AVX-512 (the same bits); the
 * AVX-512 build keeps it so tests can compare the two paths. */
double k_exp_sum_scalar(float *dst, const float *x, float sub, float scale, long n);

/* Σ a[i]·b[i] over i < n in double: each product is exact in double, and
 * element i goes to lane i mod 32 (four 8-lane double accumulators); the
 * lanes are added in lane order at the end. Rounding: at most
 * (n/32 + 31)·2^-53 relative to Σ|a·b|, so as good as a sequential double
 * loop, and vectorised. Same bits on both paths. */
double k_dot_f64(const float *a, const float *b, long n);

/* x[i] *= a for i < n. */
void k_scale(float *x, float a, long n);

/* max of x[0..n), ignoring NaNs; −inf when n is 0 or every x is NaN. */
float k_max(const float *x, long n);

#endif
