/* Memory accounting: what a run holds, by category, from the live objects
 * (printed at the start of runs) or estimated from a config alone (whale
 * memory), and the peak resident set size measured at the end.
 *
 * The estimate sizes the same buffers the engine allocates: the parameter
 * table of the config, the compute copies of the chosen precision, and the
 * session buffers counted by the family's allocation code run in
 * count-only mode, so the two cannot drift apart. */
#include "models/model.h"

#include "core/cpu.h"
#include "dist/dist.h"
#include "kernels/gemm.h"

#include <string.h>
#include <sys/resource.h>

/* Resident memory of the process without a model: the code and libraries
 * it touches, OpenMP and oneDNN thread state. Measured here as the peak RSS
 * of `whale memory --config tiny --measure` (12.6-13.8 MiB). */
#define RUNTIME_BYTES ((size_t)13 << 20)

/* fp32 bytes of the blocks of a product [M, K] x [K, N] (gemm_blocks.c). */
static size_t block_pair(int64_t M, int64_t N, int64_t K) {
    const int64_t cap = WHALE_CONV_BLOCK_MN;
    size_t b = (size_t)((M < cap ? M : cap) + (N < cap ? N : cap)) * (size_t)K * sizeof(float);
    return b < WHALE_CONV_SCRATCH_BYTES ? b : WHALE_CONV_SCRATCH_BYTES;
}

/* The largest pair of widened blocks over the products of every weight
 * [N, K] on `rows` rows: the forward one, and in training the input
 * gradient's ([rows, N] x [N, K]) and the weight gradient's (depth rows). */
static size_t wide_blocks(const whale_model *m, int64_t rows, int train) {
    size_t most = 0;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        if (!whale_param_is_product_weight(p)) continue;
        const int64_t N = p->shape[0], K = p->shape[1];
        size_t b = block_pair(rows, N, K);
        if (train) {
            const size_t dx = block_pair(rows, K, N), dw = block_pair(N, K, rows);
            b = b > dx ? b : dx;
            b = b > dw ? b : dw;
        }
        most = b > most ? b : most;
    }
    return most;
}

/* What the low-precision products keep besides the operands: oneDNN's bf16
 * kernels (JIT code, ~4 MiB) plus scratch that grows with the largest
 * weight (packed weights, the conversion blocks of the fp16/int8 paths,
 * bounded at 16 MiB in kernels/gemm.c). Measured over the fp32 runs of the
 * same shapes: ~6 MiB for the `small` preset, 14-17 MiB for nanowhale-100m.
 * Where the bf16 products run as fp32 products (below AVX-512, and where
 * vdpbf16ps is slow: whale_gemm_bf16_native), both operands are widened
 * to fp32 in blocks (kernels/gemm_blocks.c: up to 2048 rows of each, as
 * deep as its 16 MiB budget allows): the largest pair of blocks of the
 * step's products counts once more (wide_blocks). (Measured on `small`,
 * training at batch 4 x 128: bf16 takes 17.5 MB more than fp32 at the avx2
 * tier, 10.3 MB at the AMX tier; the rest of that gap is oneDNN's own
 * fp32 kernels and is not modelled.) */
static size_t lowp_gemm_bytes(const whale_model *m, int64_t rows, int train) {
    size_t largest = 0;
    for (int i = 0; i < m->n_params; i++)
        if (whale_param_is_product_weight(&m->params[i])) {
            size_t b = (size_t)whale_shape_numel(2, m->params[i].shape) * 2;
            if (b > largest) largest = b;
        }
    size_t grow = 2 * largest < ((size_t)12 << 20) ? 2 * largest : ((size_t)12 << 20);
    if (m->compute_dtype == WHALE_BF16 && !whale_gemm_bf16_native()) grow += wide_blocks(m, rows, train);
    return ((size_t)4 << 20) + grow;
}

static size_t pad_f32(int64_t n) { return (((size_t)n + 15) & ~(size_t)15) * sizeof(float); }

static void total(whale_memory *mm) {
    mm->total = mm->runtime + mm->weights_f32 + mm->weights_lowp + mm->weights_mapped + mm->adapters + mm->grads +
                mm->moments + mm->activations + mm->kv_cache + mm->workspace;
}

void whale_memory_of_model(const whale_model *m, whale_memory *mm) {
    memset(mm, 0, sizeof *mm);
    mm->dtype = m->compute_dtype;
    mm->runtime = RUNTIME_BYTES;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        int64_t n = whale_shape_numel(p->ndim, p->shape);
        if (i >= m->n_base_params && m->n_lora) { /* an adapter (fp32, trainable) */
            mm->adapters += (size_t)n * sizeof(float);
            mm->trainable += n;
            continue;
        }
        mm->params += n;
        if (whale_param_has_f32(m, p)) mm->weights_f32 += pad_f32(n);
    }
    if (!m->n_lora) mm->trainable = whale_model_has_master(m) ? mm->params : 0;
    for (int k = 0; k < m->n_adapters; k++) mm->adapters += m->adapters[k]->bytes; /* beside the model: frozen */
    mm->weights_lowp = m->copy_bytes;
    mm->weights_mapped = m->mapped_copy_bytes;
    total(mm);
}

void whale_memory_add_session(whale_memory *mm, const whale_session *s) {
    mm->activations += s->activation_bytes;
    mm->recompute_saves += s->recompute_saves;
    mm->kv_cache += s->kv_bytes;
    mm->workspace += s->work_bytes + (s->model->compute_dtype != WHALE_F32
                                          ? lowp_gemm_bytes(s->model, s->n_batch, s->n_grad_bytes > 0)
                                          : 0);
    mm->grads += s->n_grad_bytes;
    total(mm);
}

void whale_memory_add_optimizer(whale_memory *mm, size_t moment_bytes) {
    mm->moments += moment_bytes;
    total(mm);
}

whale_code whale_memory_estimate(const char *config, const whale_memory_plan *plan, whale_memory *mm,
                                 whale_err *err) {
    memset(mm, 0, sizeof *mm);
    whale_dtype dt = plan->dtype;
    const whale_format *f = whale_format_of(dt);
    if (!f) return whale_errf(err, WHALE_ERR_ARG, "no memory estimate for dtype %s", whale_dtype_name(dt));
    if (plan->train && !f->trainable && plan->train != WHALE_TRAIN_LORA)
        return whale_errf(err, WHALE_ERR_ARG, "int8 is an inference format: full training runs in fp32, bf16 or fp16");
    if (plan->train == WHALE_TRAIN_LORA && plan->lora_rank < 1)
        return whale_errf(err, WHALE_ERR_ARG, "--lora-rank must be >= 1");
    whale_model *m;
    whale_code c = whale_model_skeleton(config, &m, err);
    if (c) return c;
    if (plan->batch < 1 || plan->seq_len < 1 || plan->seq_len > m->max_positions) {
        c = whale_errf(err, WHALE_ERR_RANGE, "%s: batch %d × sequence %d is outside the model's 1..%d positions",
                       config, plan->batch, plan->seq_len, m->max_positions);
        whale_model_free(m);
        return c;
    }
    mm->dtype = dt;
    mm->runtime = RUNTIME_BYTES;
    int full = plan->train == WHALE_TRAIN_FULL;
    /* --zero 1 in mixed precision: each rank keeps the masters of its shard
     * of the product weights only (the pages wholly outside it given back) */
    size_t shards = full && plan->zero && plan->ranks > 1 && dt != WHALE_F32 ? (size_t)plan->ranks : 1;
    for (int i = 0; i < m->n_params; i++) {
        const whale_param *p = &m->params[i];
        int64_t n = whale_shape_numel(p->ndim, p->shape);
        mm->params += n;
        int product = whale_param_is_product_weight(p);
        /* fp32 values: every parameter of an fp32 run or of full training
         * (master weights); otherwise only those without a copy */
        if (dt == WHALE_F32 || full || !product) mm->weights_f32 += product ? pad_f32(n) / shards : pad_f32(n);
        if (dt != WHALE_F32 && product) mm->weights_lowp += whale_copy_bytes(dt, p->shape[0], p->shape[1]);
        if (plan->train == WHALE_TRAIN_LORA && whale_lora_is_target(p, plan->lora_targets ? plan->lora_targets : "all-linear"))
            mm->trainable += (int64_t)plan->lora_rank * (p->shape[0] + p->shape[1]);
    }
    if (full) mm->trainable = mm->params;
    if (plan->train == WHALE_TRAIN_LORA) mm->adapters = (size_t)mm->trainable * sizeof(float);
    whale_session_sizes ss = {0};
    m->compute_dtype = dt; /* sessions size some buffers by the run's precision */
    if ((c = whale_session_sizes_for(m, plan->batch, plan->seq_len, plan->train != WHALE_TRAIN_NONE, plan->recompute,
                                   &ss, err))) {
        whale_model_free(m);
        return c;
    }
    mm->activations = ss.activations;
    mm->recompute_saves = ss.recompute_saves;
    mm->kv_cache = ss.kv_cache;
    mm->workspace = ss.work + (dt != WHALE_F32 ? lowp_gemm_bytes(m, (int64_t)plan->batch * plan->seq_len,
                                                                 plan->train != WHALE_TRAIN_NONE)
                                               : 0);
    if (plan->train) {
        /* on N ranks: the gradient sum's shard and exchange buffers (also
         * for grad-accum > 1 in one process), the moments' shard with zero */
        int N = plan->ranks > 1 ? plan->ranks : 1, zero = plan->zero && N > 1;
        size_t T = (size_t)mm->trainable;
        mm->grads = full ? ss.grads : T * sizeof(float);
        size_t bucket = N > 1 && plan->bucket_mb > 0 ? whale_bucket_floats(plan->bucket_mb) : 0;
        if (N > 1 || plan->grad_accum > 1) mm->grads += whale_grad_sum_bytes_for(T, N, zero, bucket);
        mm->moments = 2 * ((T + (size_t)(zero ? N : 1) - 1) / (size_t)(zero ? N : 1)) * sizeof(float);
        mm->ranks = N, mm->zero = zero;
    }
    total(mm);
    whale_model_free(m);
    return WHALE_OK;
}

size_t whale_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* kilobytes on Linux */
}

static void line(FILE *f, const char *what, size_t bytes, const char *note) {
    if (!bytes && !note) return;
    fprintf(f, "  %-22s %10.1f MiB%s%s\n", what, bytes / 1048576.0, note ? "  " : "", note ? note : "");
}

void whale_memory_print(const whale_memory *mm, FILE *f) {
    char buf[128];
    const char *dn = mm->dtype == WHALE_F32 ? "fp32" : mm->dtype == WHALE_BF16 ? "bf16" : mm->dtype == WHALE_F16 ? "fp16" : "int8";
    if (mm->adapters) /* LoRA: the adapters are trained, the base is frozen */
        snprintf(buf, sizeof buf, "%lld frozen base parameters, %lld trainable adapter parameters (%.2f%%)",
                 (long long)mm->params, (long long)mm->trainable, 100.0 * (double)mm->trainable / (double)mm->params);
    else
        snprintf(buf, sizeof buf, "%lld parameters, %lld trainable", (long long)mm->params, (long long)mm->trainable);
    fprintf(f, "memory (%s products; %s)%s:\n", dn, buf, mm->ranks > 1 ? ", per rank" : "");
    int sharded = mm->zero && mm->ranks > 1 && mm->weights_lowp && mm->trainable && !mm->adapters;
    snprintf(buf, sizeof buf, "master weights: of the product weights 1/%d, this rank's shard (--zero 1)", mm->ranks);
    line(f, "weights fp32", mm->weights_f32,
         mm->weights_lowp || mm->weights_mapped
             ? (sharded ? buf : mm->trainable && !mm->adapters ? "master weights" : "norms, biases and other small tensors")
             : NULL);
    if (mm->weights_lowp) {
        snprintf(buf, sizeof buf, "%s copies of the product weights", dn);
        line(f, "weights low precision", mm->weights_lowp, buf);
    }
    line(f, "weights mapped", mm->weights_mapped, mm->weights_mapped ? "used in place from the checkpoint file" : NULL);
    line(f, "LoRA adapters", mm->adapters, NULL);
    snprintf(buf, sizeof buf, "1/%d of them, this rank's shard (--zero 1)", mm->ranks);
    line(f, "gradients", mm->grads, mm->ranks > 1 ? "with the rank's shard of the sum and the exchange buffers" : NULL);
    line(f, "AdamW moments", mm->moments, mm->zero && mm->ranks > 1 ? buf : NULL);
    if (mm->grads) {
        snprintf(buf, sizeof buf, "recompute saves / would save %.1f MiB", mm->recompute_saves / 1048576.0);
        line(f, "activations", mm->activations, buf);
    } else
        line(f, "activations", mm->activations, NULL);
    line(f, "KV cache", mm->kv_cache, NULL);
    line(f, "workspace", mm->workspace, NULL);
    line(f, "runtime", mm->runtime, "code, libraries, thread pools");
    fprintf(f, "  %-22s %10.1f MiB  (%.2f GiB)\n", "total", mm->total / 1048576.0, mm->total / 1073741824.0);
}

void whale_memory_print_line(const whale_memory *mm, FILE *f) {
    const char *dn = mm->dtype == WHALE_BF16 ? "bf16" : mm->dtype == WHALE_F16 ? "fp16" : "int8";
    if (mm->dtype == WHALE_F32)
        fprintf(f, "memory: weights %.1f MiB fp32", mm->weights_f32 / 1048576.0);
    else
        fprintf(f, "memory: weights %.1f MiB (%s %.1f%s, fp32 %.1f)",
                (mm->weights_f32 + mm->weights_lowp + mm->weights_mapped) / 1048576.0, dn,
                (mm->weights_lowp + mm->weights_mapped) / 1048576.0, mm->weights_mapped ? " mapped in place" : "",
                mm->weights_f32 / 1048576.0);
    fprintf(f, ", KV cache %.1f MiB, activations %.1f MiB, workspace %.1f MiB; about %.1f MiB with the runtime\n",
            mm->kv_cache / 1048576.0, mm->activations / 1048576.0, mm->workspace / 1048576.0, mm->total / 1048576.0);
}
