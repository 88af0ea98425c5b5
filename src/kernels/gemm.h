/* Matrix products (f32; bf16, fp16 and int8 weights; bf16 and fp16 backward
 * products) for the whole engine.
 *
 * Everything is row-major with leading dimensions (strides in elements), so
 * sub-blocks of larger buffers can be passed directly. Weights are stored
 * PyTorch-style as W[out, in]; activations as X[tokens, features].
 *
 * Large products go through oneDNN matmul primitives cached in the
 * whale_gemm object; products with few rows (decode) use our own AVX-512
 * kernels, which stream the weights at close to memory bandwidth where
 * oneDNN reaches a third of it. How a product is computed depends only on
 * its shape, never on call history, so with a given thread count the same
 * call always gives bit-identical results.
 */
#ifndef WHALE_KERNELS_GEMM_H
#define WHALE_KERNELS_GEMM_H

#include "whale.h"

#include <stddef.h>
#include <stdint.h>

/* oneDNN engine + stream + primitive cache; one per session, not
 * thread-shared (calls on one object must not overlap). */
typedef struct whale_gemm whale_gemm;

whale_code whale_gemm_new(whale_gemm **out, whale_err *err);
void whale_gemm_free(whale_gemm *g);

/* accumulate=0: C = product; accumulate=1: C += product.
 * M, N or K may be 0 (K=0: C = 0, or C unchanged with accumulate). */

/* C[M,N] = A[M,K] · W[N,K]^T   (forward of a Linear; attention scores Q·K^T) */
whale_code whale_gemm_nt(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *W, int ldw, float *C, int ldc, int accumulate,
                         whale_err *err);
/* C[M,N] = A[M,K] · B[K,N]     (input gradient dX = dY·W; attention P·V) */
whale_code whale_gemm_nn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err);
/* C[M,N] = A[K,M]^T · B[K,N]   (weight gradient dW = dY^T·X) */
whale_code whale_gemm_tn(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, int accumulate,
                         whale_err *err);

/* C[M,N] = A[M,K] · W[N,K]^T with W in bf16 (uint16_t bit patterns, row
 * stride ldw elements); A and C fp32; accumulate as above. A is first rounded
 * to bf16 (round to nearest even), then the bf16 products are summed in fp32:
 * what PyTorch's bf16 autocast Linear computes, up to summation order. Each
 * product of two bf16 values is exact in fp32, so the result differs from an
 * exact sum of the rounded operands by at most the fp32 summation error,
 * ~K·2^-24·sum|a·w|. The AVX512_BF16 instructions (our kernel, oneDNN) treat
 * subnormal inputs and results as zero; the plain C fallback (builds without
 * AVX512_BF16) does not, so the two may differ there. A NaN in a row of A or
 * W gives NaN in its row/column of C.
 * Routing as for whale_gemm_nt: our vdpbf16ps kernel up to
 * own_max_m_nt rows (whale_gemm_rules), oneDNN bf16 matmul (src bf16, weights bf16,
 * dst f32: "brg:avx512_core_bf16") above, with A rounded into a scratch
 * buffer of the whale_gemm that grows to the largest M·K seen and is kept
 * until whale_gemm_free. */
whale_code whale_gemm_nt_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                              whale_err *err);

/* ---- fp16 and int8 weights ----
 *
 * The reduced-precision products below round their fp32 operands to the
 * format first (nearest even), then sum the exact products in fp32, C fp32
 * (never rounded: round it yourself when you want fp16/bf16 outputs). They
 * differ from an exact sum of the rounded operands by at most the fp32
 * summation error, ~K·2^-24·sum|a·b|. Rounding to fp16 overflows to +-inf
 * from |x| >= 65520 (as a cast to float16 in PyTorch); so an A with larger
 * entries gives inf/NaN in C, as fp16 autocast would. NaN in a row of A
 * (column of B) gives NaN in that row (column) of C; the accumulate and
 * zero-size rules are those of whale_gemm_nt. Results depend only on the
 * shape, path and thread count. */

/* C[M,N] = A[M,K] · W[N,K]^T with W in fp16 (IEEE binary16 bit patterns,
 * row stride ldw), A rounded to fp16. No fp16 matmul exists on this CPU
 * (no AVX512-FP16; oneDNN 2.6 refuses f16 without it), so: up to
 * own_max_m_nt rows (whale_gemm_rules) our kernel (fp16 weights widened with
 * vcvtph2ps, fp32 FMAs: decode streams the 2-byte weights), above that the
 * f32 oneDNN path (same shape rules as whale_gemm_nt) on blocks of W
 * widened to f32 and A rounded, in scratch bounded by ~16 MB per block
 * (see gemm_converted in gemm.c). The vector kernel and oneDNN keep fp16
 * subnormals (unlike the bf16 instructions): all paths agree up to
 * summation order. */
whale_code whale_gemm_nt_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *W, int ldw, float *C, int ldc, int accumulate,
                             whale_err *err);

/* Weight-only int8 (W8A16): C[m,n] = scale[n] · sum_k bf16(A[m,k]) · W[n,k]
 * (+ C[m,n] with accumulate), W int8 [N,K] (row stride ldw), scale[N] fp32
 * per output row (whale_quantize_q8_rows), A rounded to bf16. Up to
 * own_max_m_nt rows (whale_gemm_rules) our kernel: int8 converted exactly to bf16
 * in registers (|q| <= 128 needs 8 bits; a vpermi2b table lookup) for
 * vdpbf16ps, or without AVX512_BF16/VBMI widened to fp32 for FMAs. Above
 * that oneDNN bf16 matmul on chunks of W converted exactly to bf16, each
 * thread converting and multiplying its own chunks (sized to its L2) with
 * the scales applied as oneDNN writes C; a K too deep for the scratch
 * bound, or a forced path, takes blocks of W and the scales after (shape
 * rules of whale_gemm_nt_bf16). As for nt_bf16, the
 * AVX512_BF16 paths treat subnormal (bf16) A values as zero. A NaN or inf
 * scale poisons its column. Decoding streams half the bytes of bf16
 * weights (bench_gemm --sweep measures it). */
whale_code whale_gemm_nt_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *W, int ldw, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err);

/* ---- int8 weights and int8 activations (W8A8) ----
 *
 * The int8 weights of whale_gemm_nt_q8 (q[N,K], scale[N]) repacked for
 * products with int8 activations: panels of 16 output rows; in a panel,
 * for each group of 4 consecutive k (4j .. 4j+3), the 16 rows' 4 values,
 * row after row, each stored as q + 128 (an unsigned byte). K is padded to a
 * multiple of 32 and N to one of 16 with zeros (stored as 128). One 64-byte
 * load then holds 4 terms of 16 outputs: vpdpbusd adds them to 16 int32
 * sums with no sum across lanes. whale_q8p_bytes(N, K) bytes, 64-aligned
 * panels if dst is. */
#define WHALE_A8_BLOCK 32
size_t whale_q8p_bytes(int N, int K);
void whale_q8p_pack(uint8_t *dst, const int8_t *q, int ldq, int N, int K);

/* Activations to int8 in blocks of 32 along a row (the last one padded with
 * zeros to Kp = K rounded up to 32), by the rule whale_quantize_q8_rows
 * applies to a weight row: d = max |a| / 127 over the block, q = a / d
 * rounded to nearest even, clamped to +-127; a block of zeros (or of values
 * below ~1e-43) gets d = 0 and q = 0, one holding inf or NaN d = NaN and
 * q = 0. Row m: aq[m*ldq ..] (Kp values), d[m*ldd ..] and
 * corr[m*ldd ..] = -128 * (sum of the block's q), Kp / 32 of each. */
void whale_quantize_a8_rows(int M, int K, const float *A, int lda, int8_t *aq, int ldq, float *d,
                            int32_t *corr, int ldd);

/* W8A8: C[m,n] = scale[n] * sum_b d[m,b] * sum_{k in block b} q[n,k] * aq[m,k]
 * (+ C[m,n] with accumulate), A quantised by whale_quantize_a8_rows, W
 * packed by whale_q8p_pack from the int8 weights of whale_gemm_nt_q8. Each
 * block's sum is exact (int32); the blocks are summed in fp32 in order of
 * k, each term d * sum fused into the running sum (fmaf), then multiplied
 * by the scale (fused with the add under accumulate). So every path, tier,
 * thread count and row count gives the same bits for a row. What changes
 * against the W8A16 product: the activations are rounded to 8 bits per
 * block of 32 instead of to bf16 (docs/precision.md measures what that
 * costs). Paths: vpdpbusd (AVX512_VNNI) or plain C (forced by
 * WHALE_GEMM_OWN_PORTABLE; oneDNN has no per-block activation scales, so
 * the other forced paths take ours). A NaN or inf in a block of A poisons
 * its row of C, a NaN or inf scale its column.
 * A view of rows r .. r+N-1 of a packed matrix: Wp points at the panel
 * holding row r (whale_q8p_bytes(r - r % 16, K) bytes in) and row0 = r % 16;
 * scale[0] is row r's scale. */
whale_code whale_gemm_nt_a8(whale_gemm *g, int M, int N, int K, const float *A, int lda, const uint8_t *Wp,
                            int row0, const float *scale, float *C, int ldc, int accumulate, whale_err *err);

/* One product of whale_gemm_nt_a8_parts (the arguments of whale_gemm_nt_a8). */
typedef struct {
    int M, N;
    const float *A;
    int lda;
    const uint8_t *W;
    int row0;
    const float *scale;
    float *C;
    int ldc;
} whale_a8_part;

/* Up to 16 W8A8 products of one depth K, each exactly what its own
 * whale_gemm_nt_a8 call gives, in one parallel region (A quantised once
 * for consecutive parts that share it): a decode step's small weights pay
 * one fork/join. All parts are checked before any is computed. */
whale_code whale_gemm_nt_a8_parts(whale_gemm *g, int K, int n, const whale_a8_part *parts, int accumulate,
                                  whale_err *err);

/* Row `row` (counted from Wp's first panel) of a packed matrix with K
 * columns, times scale, as fp32 (an embedding lookup). */
void whale_q8p_row(float *dst, const uint8_t *Wp, int row, int K, float scale);
/* rows rows from row0 (counted from Wp's first panel) of a packed matrix
 * with K columns back to int8, dst rows ldd apart. */
void whale_q8p_unpack(int8_t *dst, int ldd, const uint8_t *Wp, int row0, int rows, int K);

/* whale_gemm_nn_q8 with B given packed (rows row0 .. row0+K-1 of a packed
 * matrix with N columns, scale[0] row row0's scale): the input gradient
 * through a packed int8 weight. Unpacks B in blocks of 1024 rows into
 * scratch kept until whale_gemm_free and runs whale_gemm_nn_q8 on each,
 * accumulating: the same rounding, summed over those blocks. */
whale_code whale_gemm_nn_q8p(whale_gemm *g, int M, int N, int K, const float *A, int lda, const uint8_t *Bp,
                             int row0, const float *scale, float *C, int ldc, int accumulate, whale_err *err);

/* One product of whale_gemm_nt_parts: C[M,N] = A[M,K] · W[N,K]^T, W of the
 * call's weight type (uint16_t bf16/fp16 patterns, int8 with scale[N], or
 * float), strides in elements. */
typedef struct {
    int M, N;
    const float *A;
    int lda;
    const void *W;
    int ldw;
    const float *scale; /* int8 weights only */
    float *C;
    int ldc;
} whale_nt_part;

/* n products with weights of type wtype (WHALE_F32, BF16, F16 or I8) and
 * depth K, each exactly what its own whale_gemm_nt / _nt_bf16 / _nt_f16 /
 * _nt_q8 call gives (same bits). Those our kernel takes (up to
 * own_max_m_nt rows (whale_gemm_rules)) share one parallel region, their W rows cut
 * into chunks the threads take as they finish (A converted once for parts
 * that share it): a decode step's small weights (the experts, the
 * attention inputs) pay one fork/join instead of one each. The rest (more
 * rows) run one by one. All parts are checked before any is computed. */
whale_code whale_gemm_nt_parts(whale_gemm *g, whale_dtype wtype, int K, int n, const whale_nt_part *parts,
                               int accumulate, whale_err *err);

/* C[M,N] = A[M,K] · W[N,K]^T in fp32 by our skinny kernel on the calling
 * thread alone: no parallel region, no whale_gemm state, so threads of a
 * caller's own region may each take a share of W's rows (the decode
 * attention over its key chunks). Each element is summed as whale_gemm_nt's
 * own kernel sums it, whatever the share. K > 0. */
void whale_gemm_nt_serial(int M, int N, int K, const float *A, int lda, const float *W, int ldw, float *C, int ldc);

/* Symmetric per-row int8 quantisation of W[rows, cols] (dense): scale[r] =
 * max_c |W[r,c]| / 127, q[r,c] = W[r,c] / scale[r] rounded to nearest even,
 * clamped to +-127; so |q·scale - W| <= scale/2 (up to fp32 rounding). A
 * row whose scale is 0 (all zeros, or below ~1e-43 in magnitude) gets scale
 * 0 and q 0; a row holding inf or NaN gets scale NaN and q 0, so the
 * product shows it. */
void whale_quantize_q8_rows(int8_t *q, float *scale, const float *W, int rows, int cols);
/* The same values and scales written packed (whale_q8p_pack's layout,
 * padding included): whale_q8p_bytes(rows, cols) bytes at dst. */
void whale_q8p_quantize(uint8_t *dst, float *scale, const float *W, int rows, int cols);

/* ---- backward products for mixed-precision training ----
 *
 * Same rounding and error statements as above (bf16: the oneDNN bf16
 * kernels treat subnormal inputs as zero). Computed in blocks bounded by
 * ~16 MB of scratch: at most 2048 rows and 2048 columns of C per block and
 * as much of K as fits (K blocks accumulate). */

/* C[M,N] = A[M,K] · B[K,N] with A rounded to bf16 and B bf16 [K,N] (row
 * stride ldb): the input gradient dX = dY·W of a Linear with bf16 weights
 * W[out,in]. oneDNN bf16 matmul (src and weights bf16, dst f32); exact-shape
 * primitives below whale_gemm_rules' bf16_exact_below_m_nn rows, the runtime-size
 * one above. Forced WHALE_GEMM_OWN / OWN_PORTABLE: our f32 kernels on the
 * operands rounded to bf16 (kept as f32), as a check. */
whale_code whale_gemm_nn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err);
/* C[M,N] = A[K,M]^T · B[K,N], A and B fp32 both rounded to bf16: the weight
 * gradient dW = dY^T·X. Paths as whale_gemm_nn_bf16 (A converted into a
 * [K,M] block, oneDNN reading it transposed). */
whale_code whale_gemm_tn_bf16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                              const float *B, int ldb, float *C, int ldc, int accumulate,
                              whale_err *err);
/* whale_gemm_nn_bf16 / whale_gemm_tn_bf16 with both operands already bf16
 * (uint16_t bit patterns, row strides lda / ldb), e.g. from
 * whale_f32_to_bf16_rows: the same products of the same rounded values,
 * for a caller that rounds an operand once for several products (the
 * gradient of a Linear's output feeds both dX and dW) or makes it in bf16
 * directly. One oneDNN call on the operands as they are (exact primitive
 * below bf16_exact_below_m_nn rows of C, the runtime one above),
 * so within the bound stated above, though not bit-identical to nn_bf16 /
 * tn_bf16 (which sum over blocks of K). Forced OWN / OWN_PORTABLE: our f32
 * kernels on blocks widened to f32. For the lm_head's backward, reading
 * the gradient once in bf16 beats nn_bf16 / tn_bf16 reading it in fp32
 * (bench_gemm measures both). */
whale_code whale_gemm_nn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err);
whale_code whale_gemm_tn_b16(whale_gemm *g, int M, int N, int K, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err);
/* C[M,N] = sum_k bf16(A[m,k] · scale[k]) · B[k,n] with B int8 [K,N] (row
 * stride ldb) and scale[K] fp32 per row of B: the input gradient dX = dY·W
 * of a Linear with int8 weights W[out,in] = q[out,in]·scale[out] (B = q,
 * K = out). Each A value is multiplied by its scale in fp32 and rounded to
 * bf16; the int8 values are exact in bf16; the products are summed in fp32
 * (the bf16 policy, error bound as above). oneDNN bf16 matmul on blocks of
 * A converted that way and of B converted exactly to bf16, in the scratch
 * of the other converted products (bounded as stated above, kept until
 * whale_gemm_free: no allocation once it has grown to the largest block);
 * the shape rules of whale_gemm_nn_bf16 per block. A NaN or inf scale
 * poisons every row of C. Forced OWN / OWN_PORTABLE: our f32 kernels on
 * the same rounded values kept as f32. */
whale_code whale_gemm_nn_q8(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                            const int8_t *B, int ldb, const float *scale, float *C, int ldc,
                            int accumulate, whale_err *err);
/* The fp16 analogues: A rounded to fp16 and B fp16 [K,N] (nn), or A and B
 * both rounded to fp16 (tn); computed by whale_gemm_nn / whale_gemm_tn
 * (their shape rules, per block) on blocks converted to f32. */
whale_code whale_gemm_nn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const uint16_t *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err);
whale_code whale_gemm_tn_f16(whale_gemm *g, int M, int N, int K, const float *A, int lda,
                             const float *B, int ldb, float *C, int ldc, int accumulate,
                             whale_err *err);

/* dst[i] = src[i] rounded to bf16 (nearest even), NaN stays a (quiet) NaN,
 * subnormals are rounded like everything else; bit-identical to
 * whale_float_to_bf16 (kernels/convert.h), vectorised. For converting
 * weights to bf16. */
void whale_f32_to_bf16_rows(uint16_t *dst, const float *src, size_t n);

/* Best GFLOP/s of whale_gemm_nt over reps repetitions at the given shape
 * (own buffers; one untimed warm-up call). Returns 0 on failure. */
double whale_gemm_measure_gflops(whale_gemm *g, int M, int N, int K, int reps);
/* The same for whale_gemm_nt_bf16 (weights converted from the same values). */
double whale_gemm_measure_gflops_bf16(whale_gemm *g, int M, int N, int K, int reps);
/* The same with weights of type w: WHALE_F32 (whale_gemm_nt), WHALE_BF16
 * (nt_bf16), WHALE_F16 (nt_f16) or WHALE_I8 (nt_a8 on packed weights, as the models hold int8); 0 for other types. */
double whale_gemm_measure_gflops_dtype(whale_gemm *g, whale_dtype w, int M, int N, int K,
                                       int reps);

/* ---- introspection and tuning (benchmarks and tests) ---- */

/* Which implementation handles a call. AUTO is the normal shape-based
 * choice; the others force one path, to compare or test them. For the
 * products computed on converted blocks (nt_f16 and nt_q8 above
 * own_max_m_nt rows (whale_gemm_rules), nn/tn bf16 and f16) a forced DNNL path
 * applies to every block product; OWN on nn/tn bf16 and f16 runs our f32
 * kernels on the converted blocks. */
typedef enum {
    WHALE_GEMM_AUTO = 0,
    WHALE_GEMM_OWN,        /* our kernels (any M; fast only for few rows) */
    WHALE_GEMM_DNNL_EXACT, /* oneDNN primitive specialised to the exact shape */
    WHALE_GEMM_DNNL_RUNTIME, /* oneDNN primitive with runtime sizes and strides */
    WHALE_GEMM_OWN_PORTABLE  /* nt bf16 / f16 / q8: our plain C kernel, as in
                                builds without AVX-512; others: same as OWN */
} whale_gemm_path;
void whale_gemm_set_path(whale_gemm *g, whale_gemm_path path);

/* Block limits of the products computed on converted blocks: at most
 * max_mn rows and columns of C per block (default 2048), scratch_bytes for
 * one converted A block plus one B block (default 16 MB; K is split to fit).
 * 0 restores a default. For tests, to reach several blocks with small
 * matrices. */
void whale_gemm_set_block_limits(whale_gemm *g, int max_mn, size_t scratch_bytes);

/* Implementation name used by the last successful call: a oneDNN impl
 * string such as "brg:avx512_core" / "gemm:jit", or "whale:..." for ours
 * ("whale:skinny_nt_f16", "whale:nt_q8_c", ...). Products on converted
 * blocks prefix what ran the (last) block: "cvt_f16+brg:avx512_core",
 * "cvt_q8+gemm:jit", "cvt_bf16+whale:skinny_nn" (nn/tn bf16 through oneDNN
 * report its name alone, as nt_bf16 does). */
const char *whale_gemm_last_impl(const whale_gemm *g);

typedef struct {
    int64_t calls;        /* products computed through oneDNN (each block of a
                             converted product counts) */
    int64_t hits;         /* ... of which found their primitive in the cache */
    int64_t created;      /* oneDNN primitives created */
    int64_t evicted;      /* ... and dropped again because the cache was full */
    int64_t own_calls;    /* products computed by our kernels */
    int cached;           /* primitives currently held */
} whale_gemm_stats;
void whale_gemm_get_stats(const whale_gemm *g, whale_gemm_stats *st);

/* Shape rules for WHALE_GEMM_AUTO, per instruction tier (whale_gemm_rules):
 *  - nt with M <= own_max_m_nt rows: our kernel (decode: it streams
 *    weights from DRAM at close to the read rate, where oneDNN's per-call
 *    work dominates), for every weight format;
 *  - nn/tn with M <= own_max_m_nn rows: our kernel;
 *  - above, where oneDNN's primitives for the exact shape stop paying
 *    against one runtime-size primitive per (kind, accumulate).
 * fp16 and row-major int8 weights (nt_q8) follow the nt / nt_bf16 rules
 * (their blocks are f32 / bf16 products); the W8A8 product (nt_a8) is ours
 * at every row count. The figures behind every rule, per tier, are in
 * docs/architecture.md (bench_gemm --sweep and --sweep-bf16). */

/* Exact-shape primitives below these many rows of C, one runtime-size
 * primitive from there on (so the varying token counts of the experts
 * create no new primitive). For tn the rows are the output features of a
 * weight gradient and K the tokens, which may change every call: a rule on
 * K would create a primitive per token count. */
typedef struct {
    int own_max_m_nt;          /* nt, every weight format: our kernel up to these many rows */
    int own_max_m_nn;          /* f32 nn and tn: our kernel up to these many rows */
    int exact_below_m_nt;      /* f32 nt */
    int bf16_exact_below_m_nt; /* bf16 nt (and int8 weights above our kernel) */
    int bf16_exact_below_m_nn; /* bf16 nn and tn */
} whale_gemm_rules;

/* The rules of tier t (WHALE_ISA_BASE .. WHALE_ISA_AMX); products follow
 * those of whale_isa_active(). */
const whale_gemm_rules *whale_gemm_rules_for(whale_isa t);

/* Products on converted operands (the formats oneDNN does not take, and
 * bf16 ones where whale_gemm_bf16_native says no) run on blocks of at most
 * this many rows of each operand, as deep as this many bytes of scratch
 * allow (kernels/gemm_blocks.c; the memory estimate counts them). */
#define WHALE_CONV_BLOCK_MN 2048
#define WHALE_CONV_SCRATCH_BYTES ((size_t)16 << 20)

/* Are the bf16 products (and int8 weights beyond our kernels) oneDNN's
 * bf16 ones at the active tier: AMX, or AVX512_BF16 where vdpbf16ps is
 * fast (whale_cpu_bf16_dot_fast)? Else they are f32 products of the
 * operands rounded to bf16 and widened, in blocks ("cvt_bf16+...");
 * so too when DNNL_MAX_CPU_ISA keeps oneDNN below avx512_core. */
int whale_gemm_bf16_native(void);

/* Primitives kept per whale_gemm; the least recently used one is dropped
 * when a new shape needs room. Exact shapes whose N or K change every call
 * (attention over a growing context) each create a primitive once (a
 * fraction of a millisecond; a few microseconds when oneDNN's own
 * process-wide cache of 1024 entries still holds it). */
#define WHALE_GEMM_CACHE_CAP 128

#endif
