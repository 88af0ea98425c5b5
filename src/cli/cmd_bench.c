/* whale bench: tokens/s and GFLOP/s of forward, prefill and decode, printed
 * next to the ceiling this machine reaches (the best rate of the dtype's
 * products at the model's shapes, measured on the spot; for decode the
 * weight bytes per token over the read rate). */
#include "cli.h"

#include "whale_bench.h"
#include "whale_lora.h"
#include "whale_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Opens a result line with the processor, the instruction tier the
 * kernels ran at and what a parallel region costs (the size from which
 * they split work over the threads): figures are only comparable between
 * lines that agree on the first two. */
static void print_machine(void) {
    char model[80];
    snprintf(model, sizeof model, "%s", whale_cpu_model());
    for (char *c = model; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = ' ';
    printf("{\"cpu\": \"%s\", \"isa\": \"%s\", \"region_us\": %.2f, \"move_64k_us\": %.2f, ", model,
           whale_isa_name(whale_isa_active()), whale_par_sync_us(), whale_par_move_us(65536));
}

static void random_ids(int32_t *ids, size_t n, int vocab, whale_rng *r) {
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(whale_rng_u64(r) % (uint64_t)vocab);
}

static const char bench_help[] =
    "usage: whale bench (-m DIR | --preset NAME) --what forward|prefill|decode|train [options]\n"
    "  --batch B --seq-len T   forward/train shape (default 4 × 256; prefill: 1 × 512);\n"
    "                          decode: B streams decoded together (default 1)\n"
    "  --context C             decode: tokens already in the KV cache (default 128)\n"
    "  --tokens N              decode: tokens to generate (default 32)\n"
    "  --reps R                repetitions, best reported (default 3), and the least\n"
    "                          processor seconds of a run (cpu_seconds; with\n"
    "                          OMP_WAIT_POLICY=passive the work done, load aside);\n"
    "                          decode also\n"
    "                          reports the median run's share of the memory read\n"
    "                          rate measured around it (pct_of_bound)\n"
    "  --threads N             (default: all cores)\n"
    "  --recompute             train: recompute activations in the backward pass\n"
    "  --profile               time per op group (one more run; decode: its steps), as a table on stderr and JSON\n"
    "  --adapters DIR ...      decode: LoRA adapters (PEFT folders) beside the model; stream i runs the\n"
    "                          (i mod (n+1))-th of the base and the n adapters, as a server's requests would\n"
    "prints one JSON line per measurement";

enum { BENCH_FORWARD, BENCH_PREFILL, BENCH_DECODE, BENCH_TRAIN };

/* A benchmark: its options, its model and session, and the timings. */
typedef struct {
    const char *dir, *preset, *what, *label;
    long batch, seq, context, threads, reps, tokens;
    int profile, recompute, mode;
    cli_list adapters; /* decode: adapter folders, bound round robin after the base */
    int profiling; /* this run is the profiled one */
    whale_dtype dtype;
    whale_model *m;
    whale_session *s;
    int32_t *ids;
    float *logits;
    double best;                         /* the best run's seconds */
    double best_cpu;                     /* the least processor seconds of a run, all threads */
    double bw_of[1001], dt_of[1001];     /* decode: each run's read rate (GB/s) and seconds */
} bench_t;

/* The ceiling of a forward, prefill or training run: the best rate of the
 * product kind the dtype's layers run, on operands already in its format
 * (whale_measure_gemm_ceiling), over the model's distinct weight shapes
 * [N, K] at the run's rows. Weights above CEILING_MAX_VALUES values (a
 * large vocabulary's embedding and head: prefill multiplies one row by
 * them) are left out, and so are matrices under 16 × 16. */
#define CEILING_MAX_VALUES ((int64_t)16 << 20)
#define CEILING_SHAPES 16

static double gemm_ceiling(const bench_t *b, whale_err *err) {
    const long rows = b->mode == BENCH_PREFILL ? b->seq : b->batch * b->seq;
    const int M = rows < 4096 ? (int)rows : 4096;
    int64_t shape[CEILING_SHAPES][2];
    int n = 0;
    for (int i = 0; i < whale_model_num_params(b->m) && n < CEILING_SHAPES; i++) {
        const whale_tensor t = whale_model_param(b->m, i);
        if (t.ndim < 2) continue;
        const int64_t N = t.shape[t.ndim - 2], K = t.shape[t.ndim - 1];
        int seen = N < 16 || K < 16 || N * K > CEILING_MAX_VALUES;
        for (int j = 0; j < n && !seen; j++) seen = shape[j][0] == N && shape[j][1] == K;
        if (!seen) shape[n][0] = N, shape[n][1] = K, n++;
    }
    double best = 0;
    for (int j = 0; j < n; j++) {
        const double r = whale_measure_gemm_ceiling(b->dtype, M, (int)shape[j][0], (int)shape[j][1], 5, err);
        if (!r) return 0;
        if (r > best) best = r;
    }
    if (!n) whale_errf(err, WHALE_ERR_ARG, "%s: no weight matrix to measure a ceiling on", b->label);
    return best;
}

/* 0, -1 after --help, or the usage status. */
static int bench_parse(int argc, char **argv, bench_t *b) {
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &b->dir, 0, 0, NULL},
        {"--preset", CLI_STR, &b->preset, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &b->dtype, 0, 0, NULL},
        {"--what", CLI_STR, &b->what, 0, 0, NULL},
        {"--batch", CLI_LONG, &b->batch, 1, 4096, NULL},
        {"--seq-len", CLI_LONG, &b->seq, 1, 1 << 20, NULL},
        {"--context", CLI_LONG, &b->context, 1, 1 << 20, NULL},
        {"--tokens", CLI_LONG, &b->tokens, 1, 1 << 20, NULL},
        {"--reps", CLI_LONG, &b->reps, 1, 1000, NULL},
        {"--threads", CLI_LONG, &b->threads, 1, 1024, NULL},
        {"--profile", CLI_FLAG, &b->profile, 0, 0, NULL},
        {"--recompute", CLI_FLAG, &b->recompute, 0, 0, NULL},
        {"--adapters", CLI_LIST, &b->adapters, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int st = cli_parse("bench", bench_help, argc, argv, table, NULL, NULL);
    if (st) return st;
    if (!b->dir == !b->preset) return cli_usage("bench", "give exactly one of -m DIR or --preset NAME");
    const char *what = b->what;
    b->mode = !strcmp(what, "forward")   ? BENCH_FORWARD
              : !strcmp(what, "prefill") ? BENCH_PREFILL
              : !strcmp(what, "decode")  ? BENCH_DECODE
              : !strcmp(what, "train")   ? BENCH_TRAIN
                                         : -1;
    if (b->mode < 0) return cli_usage("bench", "--what must be forward, prefill, decode or train, got \"%s\"", what);
    int wide = b->mode == BENCH_FORWARD || b->mode == BENCH_TRAIN;
    if (b->batch < 0) b->batch = wide ? 4 : 1;
    if (b->seq < 0) b->seq = wide ? 256 : 512;
    if (b->mode == BENCH_PREFILL && b->batch != 1)
        return cli_usage("bench", "--batch applies to --what forward, decode and train only");
    if (b->adapters.n && b->mode != BENCH_DECODE) return cli_usage("bench", "--adapters applies to --what decode only");
    return 0;
}

/* The model (inference runs hold only the dtype's weights, in owned memory
 * as whale run and serve hold them; training keeps fp32 masters), its
 * session and random token ids. */
static whale_code bench_load(bench_t *b, whale_err *err) {
    int train = b->mode == BENCH_TRAIN, decode = b->mode == BENCH_DECODE;
    whale_code c = b->dir ? (train ? whale_model_load(b->dir, &b->m, err) : whale_model_load_as(b->dir, b->dtype, &b->m, err))
                          : whale_model_init(b->preset, 0, &b->m, err);
    if (c || (c = whale_model_set_dtype(b->m, b->dtype, err)) || (!train && (c = whale_model_drop_master(b->m, err))) ||
        (!train && (c = whale_model_own_weights(b->m, err))))
        return c;
    int V = whale_model_vocab_size(b->m);
    int ctx_total = decode ? (int)(b->context + b->tokens) : (int)b->seq;
    size_t rows = b->mode == BENCH_FORWARD ? (size_t)b->batch * b->seq : train ? 1 : (size_t)b->batch;
    size_t n_ids = (size_t)b->batch * (decode ? ctx_total : b->seq);
    b->ids = malloc(sizeof(int32_t) * n_ids);
    b->logits = whale_alloc(sizeof(float) * rows * V);
    if (!b->ids || !b->logits)
        return whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits", rows * V * 4 / 1048576.0);
    whale_adapter *ad[CLI_LIST_MAX];
    for (int i = 0; i < b->adapters.n; i++)
        if ((c = whale_adapter_load(b->m, b->adapters.v[i], &ad[i], err))) return c;
    if ((c = train ? whale_train_session_new(b->m, (int)b->batch, (int)b->seq, b->recompute, &b->s, err)
                   : whale_session_new(b->m, (int)b->batch, ctx_total, &b->s, err)))
        return c;
    for (int i = 0; i < b->batch && b->adapters.n; i++) { /* stream i: the base, then each adapter, round robin */
        int k = i % (b->adapters.n + 1);
        if (k && (c = whale_kv_seq_set_adapter(b->s, i, ad[k - 1], err))) return c;
    }
    whale_rng rng;
    whale_rng_seed(&rng, 1);
    random_ids(b->ids, n_ids, V, &rng);
    whale_memory mm;
    whale_memory_of_model(b->m, &mm);
    whale_memory_add_session(&mm, b->s);
    whale_memory_print(&mm, stderr);
    return WHALE_OK;
}

/* Processor seconds of this process so far, all threads. */
static double cpu_seconds(void) {
    struct timespec t;
    return clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) ? 0 : (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One run of what is measured; *dt its seconds. */
static whale_code bench_run(bench_t *b, double *dt, whale_err *err) {
    whale_session *s = b->s;
    int B = (int)b->batch, S = (int)b->seq;
    double t0 = whale_now();
    whale_code c = WHALE_OK;
    if (b->mode == BENCH_TRAIN) {
        double loss;
        int64_t count;
        whale_session_zero_grad(s);
        c = whale_session_train_step(s, b->ids, NULL, NULL, NULL, B, S, 1.0, &loss, &count, err);
    } else if (b->mode == BENCH_DECODE) { /* batch streams at the same context, one token each per step */
        c = whale_session_forward(s, b->ids, B, (int)b->context, b->logits, 0, err);
        if (b->profiling) whale_session_set_profile(s, 1); /* the steps only, not the context's prefill */
        t0 = whale_now();
        for (int k = 0; k < b->tokens && !c; k++)
            c = whale_session_forward(s, b->ids + b->batch * (b->context + k), B, 1, b->logits, 0, err);
    } else
        c = whale_session_forward(s, b->ids, B, S, b->logits, b->mode == BENCH_FORWARD, err);
    *dt = whale_now() - t0;
    return c;
}

/* The first run warms caches and oneDNN primitives; reps timed runs;
 * --profile one more, not in the timings. Decode's bound: the memory read
 * rate around each timed run (this machine's rate drifts by 2x within
 * minutes and comes in bursts): one pass over 512 MB right before the run
 * and one right after, averaged, so each run is compared with the rate of
 * its own moment (a best of several passes would compare a 0.1 s run with
 * the peak of a burst); the median run is reported. */
static whale_code bench_time(bench_t *b, whale_err *err) {
    /* from memory: 512 MiB, or twice a larger last-level cache */
    const size_t llc2 = 2 * whale_cpu_llc_bytes(), probe_bytes = llc2 > ((size_t)512 << 20) ? llc2 : (size_t)512 << 20;
    int decode = b->mode == BENCH_DECODE;
    b->best = b->best_cpu = 1e30;
    for (int r = 0; r < b->reps + 1 + b->profile; r++) {
        int timed = r > 0 && r <= b->reps;
        b->profiling = b->profile && r == b->reps + 1;
        if (b->profiling) whale_session_set_profile(b->s, 1);
        whale_session_reset(b->s);
        double bw_before = decode && timed ? whale_measure_read_bandwidth(probe_bytes, 1) : 0, dt;
        const double cpu0 = cpu_seconds();
        whale_code c = bench_run(b, &dt, err);
        if (c) return c;
        const double cpu = cpu_seconds() - cpu0;
        if (timed && dt < b->best) b->best = dt;
        if (timed && cpu < b->best_cpu) b->best_cpu = cpu;
        if (decode && timed) b->dt_of[r] = dt, b->bw_of[r] = (bw_before + whale_measure_read_bandwidth(probe_bytes, 1)) / 2;
    }
    return WHALE_OK;
}

static void print_profile(const bench_t *b) {
    const char *names[32];
    double secs[32], sum = 0;
    int n = whale_session_profile(b->s, names, secs, 32);
    for (int i = 0; i < n; i++) sum += secs[i];
    fprintf(stderr, "%-28s %10s %7s\n", "op group", "ms", "share");
    print_machine();
    printf("\"profile\": \"%s\", \"ms\": {", b->what);
    for (int i = 0, first = 1; i < n; i++) {
        if (secs[i] == 0) continue;
        fprintf(stderr, "%-28s %10.2f %6.1f%%\n", names[i], secs[i] * 1e3, 100 * secs[i] / sum);
        printf("%s\"%s\": %.3f", first ? "" : ", ", names[i], secs[i] * 1e3);
        first = 0;
    }
    printf("}}\n");
    fprintf(stderr, "%-28s %10.2f\n", "total (timed groups)", sum * 1e3);
}

static void print_decode(const bench_t *b) {
    long batch = b->batch, tokens = b->tokens, reps = b->reps;
    double flops = 0;
    for (int k = 0; k < tokens; k++)
        flops += whale_model_forward_flops(b->m, (int)batch, 1, (int)b->context + k, (int)batch);
    /* bytes of the product weights in the dtype; the fp32 islands (HC, gate) are under 1 % */
    double bytes = whale_model_decode_weight_bytes(b->m) * (double)whale_dtype_size(b->dtype) / 4.0;
    double share[1001];
    int med = 1; /* reps >= 1 */
    for (int r = 1; r <= reps; r++) share[r] = bytes * tokens / b->dt_of[r] / (b->bw_of[r] * 1e9);
    for (int r = 1; r <= reps; r++) { /* the run of median share */
        int below = 0;
        for (int o = 1; o <= reps; o++) below += share[o] < share[r] || (share[o] == share[r] && o < r);
        if (below == (reps - 1) / 2) med = r;
    }
    /* a step reads the weights once for all its streams; the share in
     * significant digits, since a tiny model's run on a loaded machine can
     * use less than 0.05 % of the read rate */
    double tps = (double)batch * tokens / b->best, bw = b->bw_of[med], bound = batch * bw * 1e9 / bytes;
    print_machine();
    printf("\"what\": \"decode\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"streams\": %ld, "
           "\"adapters\": %d, \"context\": %ld, "
           "\"tokens\": %ld, \"tokens_per_s\": %.2f, \"gflops\": %.2f, \"weight_mb_per_token\": %.1f, "
           "\"weights_gb_s\": %.1f, \"read_gb_s\": %.1f, \"bound_tokens_per_s\": %.1f, \"pct_of_bound\": %.3g, "
           "\"llc_mb\": %.0f}\n",
           b->label, cli_dtype_name(b->dtype), whale_get_threads(), batch, b->adapters.n, b->context, tokens, tps,
           flops / b->best / 1e9, bytes / 1e6, bytes * tps / batch / 1e9, bw, bound, 100 * share[med],
           (double)whale_cpu_llc_bytes() / (1 << 20));
}

static void print_rate(const bench_t *b, double ceiling) {
    long batch = b->batch, seq = b->seq;
    double best = b->best;
    const char *label = b->label, *dtname = cli_dtype_name(b->dtype);
    if (b->mode == BENCH_TRAIN) {
        /* forward + backward ≈ 3 × the forward's FLOPs (6 × active parameters per token + attention) */
        double flops = 3.0 * whale_model_forward_flops(b->m, (int)batch, (int)seq, 0, (int)(batch * seq));
        double gf = flops / best / 1e9;
        size_t saves, acts = whale_session_activation_bytes(b->s, &saves);
        print_machine();
        printf("\"what\": \"train\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"batch\": %ld, "
               "\"seq_len\": %ld, \"recompute\": %s, \"tokens_per_s\": %.1f, \"seconds_per_step\": %.4f, "
               "\"gflops\": %.1f, \"ceiling_gflops\": %.1f, \"mfu_pct\": %.1f, \"activation_mib\": %.1f, "
               "\"recompute_saves_mib\": %.1f}\n",
               label, dtname, whale_get_threads(), batch, seq, b->recompute ? "true" : "false", batch * seq / best,
               best, gf, ceiling, 100 * gf / ceiling, acts / 1048576.0, saves / 1048576.0);
        return;
    }
    int rows = b->mode == BENCH_FORWARD ? (int)(batch * seq) : (int)batch;
    double gf = whale_model_forward_flops(b->m, (int)batch, (int)seq, 0, rows) / best / 1e9;
    print_machine();
    printf("\"what\": \"%s\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"batch\": %ld, "
           "\"seq_len\": %ld, \"tokens_per_s\": %.1f, \"seconds\": %.4f, \"gflops\": %.1f, "
           "\"ceiling_gflops\": %.1f, \"pct_of_ceiling\": %.1f, \"cpu_seconds\": %.4f}\n",
           b->what, label, dtname, whale_get_threads(), batch, seq, batch * seq / best, best, gf, ceiling,
           100 * gf / ceiling, b->best_cpu);
}

int cmd_bench(int argc, char **argv) {
    bench_t *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "whale: out of memory\n");
        return 7;
    }
    *b = (bench_t){.what = "forward", .batch = -1, .seq = -1, .context = 128, .reps = 3, .tokens = 32,
                   .dtype = WHALE_F32};
    int status = bench_parse(argc, argv, b);
    if (status) {
        free(b);
        return status < 0 ? 0 : status;
    }
    whale_set_threads((int)b->threads);
    b->label = b->dir ? b->dir : b->preset;
    whale_err err;
    if (bench_load(b, &err)) goto fail;
    double ceiling = b->mode == BENCH_DECODE ? 0 : gemm_ceiling(b, &err);
    if ((b->mode != BENCH_DECODE && !ceiling) || bench_time(b, &err)) goto fail;
    if (b->profile) print_profile(b);
    if (b->mode == BENCH_DECODE) print_decode(b);
    else print_rate(b, ceiling);
    fprintf(stderr, "peak resident memory %.1f MiB\n", whale_peak_rss() / 1048576.0);
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(b->ids);
    free(b->logits);
    whale_session_free(b->s);
    whale_model_free(b->m);
    free(b);
    return status;
}
