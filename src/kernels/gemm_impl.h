/* What the files of the matrix products share (not a public header):
 *   gemm.c         the entry points, their checks and the routing by kind,
 *                  shape and tier; the object and its scratch
 *   gemm_rows.c    our kernels for products with few rows (decode): nt on
 *                  f32, fp16, int8 and bf16 weights, nn / tn, and the split
 *                  of the weight rows over threads
 *   gemm_dnnl.c    oneDNN matmul primitives and their cache
 *   gemm_blocks.c  products of the other formats as oneDNN products on
 *                  converted blocks of the operands
 *   gemm_measure.c the GFLOP/s and read-rate probes of the benchmarks
 * gemm.c's opening comment says which path a product takes and why. */
#ifndef WHALE_GEMM_IMPL_H
#define WHALE_GEMM_IMPL_H

#include "kernels/gemm.h"

#include "core/core.h"
#include "core/cpu.h"
#include "kernels/convert.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#if WHALE_X86
#include <immintrin.h>
#endif

/* The products. The first six are what oneDNN primitives are made for:
 * f32, and bf16 A and B (already converted) with f32 C. The others are
 * computed by our kernels or through those six on converted blocks. The
 * layout (nt, nn, tn) of kind k is k % 3 for the first nine; layout() gives
 * it for all (KIND_NT_Q8 and KIND_NT_A8 are nt, KIND_NN_B16 and KIND_NN_Q8 nn,
 * KIND_TN_B16 tn). */
enum {
    KIND_NT = 0, KIND_NN, KIND_TN,
    KIND_NT_BF16, KIND_NN_BF16, KIND_TN_BF16,
    KIND_NT_F16, KIND_NN_F16, KIND_TN_F16,
    KIND_NT_Q8,
    KIND_NN_B16, KIND_TN_B16, /* nn_bf16 / tn_bf16 with A (and B) given in bf16 */
    KIND_NN_Q8,               /* nn with int8 B and per-row scales of B */
    KIND_NT_A8,               /* nt with int8 activations, packed int8 W (gemm_a8.c) */
    KIND_COUNT
};
extern const char *const gemm_kind_names[KIND_COUNT];

/* KIND_NT, KIND_NN or KIND_TN */
static inline int layout(int kind) {
    return kind == KIND_NN_Q8 ? KIND_NN : kind == KIND_NT_A8 ? KIND_NT : kind % 3;
}
static inline int is_bf16_kind(int kind) { return kind >= KIND_NT_BF16 && kind <= KIND_TN_BF16; }

/* The int8 rule of weight rows and activation blocks alike: the scale of
 * n values, max |w| / 127 (0 for (all but) zeros, NaN when one is inf or
 * NaN), and a value w / s rounded to nearest even (the default rounding
 * mode), clamped to +-127 (0 where s is 0 or NaN). */
static inline float q8_row_scale(const float *w, int n) {
    float amax = 0;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        const float a = fabsf(w[i]);
        if (!(a <= FLT_MAX)) finite = 0; /* inf or NaN */
        else if (a > amax) amax = a;
    }
    return finite ? amax / 127.0f : NAN;
}
static inline int8_t q8_value(float w, float s) {
    if (!(s > 0)) return 0;
    float v = nearbyintf(w / s);
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    return (int8_t)v;
}

/* Our kernels run single-threaded below this many multiply-adds, where the
 * fork/join of a parallel region (~1-2 us) eats the gain; at 2^16 two
 * threads are already ~1.6x faster than one. */
#define OWN_PARALLEL_MIN_WORK (1 << 16)

/* ------------------------------------------------------------ cache types */

/* What a primitive is specialised to. Runtime entries have every size and
 * stride -1 (given at execution), so one serves all shapes of its kind. */
typedef struct {
    int kind, acc, M, N, K, lda, ldb, ldc;
} gemm_key;

typedef struct {
    gemm_key key;
    int used;
    uint64_t last_use;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3]; /* exact entries only: A, B, C; pointers set per call */
    char impl[64];
} gemm_entry;

typedef struct {
    void *p;
    size_t bytes;
} scratch;

struct whale_gemm {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    gemm_entry cache[WHALE_GEMM_CACHE_CAP];
    uint64_t tick;
    whale_gemm_path path;
    whale_gemm_stats stats;
    char last_impl[64];
    /* Scratch: sa holds A converted (A rounded for our kernels, or an A block
     * for gemm_converted), sb a converted B block, sc a C block (nt_q8 with
     * accumulate), sd the unpacked rows of whale_gemm_nn_q8p. Each grows to
     * the largest size used and is freed with the object. */
    scratch sa, sb, sc, sd;
    int block_mn;       /* gemm_converted block limits; 0: the defaults */
    size_t block_bytes;
    dnnl_stream_t *thread_stream; /* one per thread of gemm_nt_q8_chunks */
    int n_thread_stream;
};

/* One product as requested by the caller. */
typedef struct {
    gemm_key s; /* the actual shape (no -1) */
    const void *A, *B; /* float, uint16_t (bf16, fp16 bits) or int8_t, by kind */
    float *C;
    const float *scale; /* KIND_NT_Q8: per output column; KIND_NN_Q8: per row of B */
} gemm_call;

/* Our nt kernels, by weight type: fp32 FMAs on f32, fp16 or int8 weights
 * (A as is, or rounded to fp16 / bf16 and kept as f32), vdpbf16ps on bf16
 * weights or on int8 ones expanded in registers (A in bf16). */
typedef enum { SK_F32, SK_F16, SK_I8, SK_BF16, SK_Q8, SK_BF16_FMA } sk_kind;
#define SK_PARTS_MAX 16 /* products in one skinny run (whale_gemm_nt_parts) */

/* How gemm_converted brings an operand block into the inner product's type. */
typedef enum {
    CV_NONE = 0,  /* used in place: already the inner type (bf16 B of nn_bf16) */
    CV_F32_BF16,  /* f32 -> bf16, nearest even */
    CV_F32_BF16R, /* f32 -> f32 rounded to bf16 */
    CV_F32_F16R,  /* f32 -> f32 rounded to fp16 */
    CV_BF16_F32,  /* bf16 -> f32, exact */
    CV_F16_F32,   /* fp16 -> f32, exact */
    CV_I8_BF16,   /* int8 -> bf16, exact */
    CV_I8_F32,    /* int8 -> f32, exact */
    CV_F32S_BF16, /* f32 times a per-column scale (in f32) -> bf16, nearest even */
    CV_F32S_BF16R /* the same, kept as f32 */
} conv;

/* Does this tier have our AVX2 or AVX-512 kernels (fp32 FMAs on f32, fp16,
 * int8 and bf16 weights), and the vdpbf16ps ones (bf16 weights, int8
 * through bf16)? Below AVX2 the narrow weights take the plain C kernels. */
static inline int gemm_have_avx2(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX2); }
static inline int gemm_have_avx512(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512); }
static inline int gemm_have_bf16(void) { return WHALE_X86 && whale_isa_at_least(WHALE_ISA_AVX512_BF16); }

static inline int own_path(whale_gemm_path p) {
    return p == WHALE_GEMM_OWN || p == WHALE_GEMM_OWN_PORTABLE;
}

/* gemm.c: room for n elements of `size` bytes in a scratch buffer (the
 * only allocations of the products, made once per new maximum size); an
 * f32 product, validated (M, N, K > 0), on the path given; the oneDNN path
 * of a bf16 product under WHALE_GEMM_AUTO. */
whale_code gemm_scratch_reserve(scratch *sc, size_t n, size_t size, const gemm_call *c, whale_err *err);
whale_code gemm_f32(whale_gemm *g, const gemm_call *c, whale_gemm_path path, whale_err *err);
whale_gemm_path gemm_bf16_auto(int kind, int M);
/* Does oneDNN compute the bf16 products here (whale_gemm_bf16_native, and
 * oneDNN not capped below avx512_core)? Else f32 ones on widened blocks. */
int gemm_dnnl_has_bf16(void);

/* gemm_rows.c: does our kernel compute an nt product of this kind with M
 * rows, and which one (k, portable)? The products c[0..n) (validated, one
 * K) with that kernel. nn / tn with our kernels. */
int gemm_sk_choose(const whale_gemm *g, int kind, int M, sk_kind *k, int *portable);
whale_code gemm_own_nt(whale_gemm *g, const gemm_call *c, int n, sk_kind k, int portable, whale_err *err);
void gemm_own_nn_tn(const gemm_call *c);

/* gemm_dnnl.c: the product on a cached oneDNN primitive (runtime: the
 * one-for-all-shapes entry of its kind, else an exact-shape one); an
 * entry's primitive and memories released; the error of a failed call. */
whale_code gemm_dnnl_run(whale_gemm *g, const gemm_call *c, int runtime, whale_err *err);
/* The cached primitive gemm_dnnl_run would use for c; c on a runtime
 * entry's primitive with memory objects of its own: safe to call from
 * several threads at once, each with its own stream (inside a parallel
 * region oneDNN runs on the calling thread alone). */
whale_code gemm_dnnl_entry(whale_gemm *g, const gemm_call *c, int runtime, gemm_entry **e, whale_err *err);
dnnl_status_t gemm_dnnl_exec_runtime(const gemm_entry *e, dnnl_engine_t engine, dnnl_stream_t stream,
                                     const gemm_call *c, const char **what);
void gemm_entry_clear(gemm_entry *e);
whale_code gemm_dnnl_fail(whale_err *err, const gemm_call *c, const char *what, dnnl_status_t st);

/* gemm_blocks.c: the product c computed as inner-kind products (f32 or
 * bf16 operands) of blocks of A converted by ca and of B by cb (its
 * opening comment has the details). */
whale_code gemm_converted(whale_gemm *g, const gemm_call *c, int inner, whale_gemm_path path, conv ca, conv cb,
                          const char *tag, whale_err *err);
/* nt_q8 on oneDNN bf16 products of chunks of W, each thread converting and
 * multiplying its own chunks (its opening comment has the details); *done
 * 0 when K does not fit the scratch bound whole (gemm_converted then). */
whale_code gemm_nt_q8_chunks(whale_gemm *g, const gemm_call *c, int *done, whale_err *err);

/* gemm_a8.c: the W8A8 product c (validated, M, N, K > 0; B the packed
 * weights, output n in lane row0 + n of its panels); n such products of
 * one K in one parallel region. */
whale_code gemm_nt_a8(whale_gemm *g, const gemm_call *c, int row0, whale_err *err);
whale_code gemm_nt_a8_parts(whale_gemm *g, const gemm_call *c, const int *row0, int n, whale_err *err);

#endif
