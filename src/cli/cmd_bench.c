/* whale bench: tokens/s and GFLOP/s of forward, prefill and decode, printed
 * next to the ceiling this machine reaches (oneDNN f32 GEMM rate measured on
 * the spot; for decode the weight bytes per token over the read bandwidth). */
#include "cli.h"

#include "whale_bench.h"
#include "whale_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opens a result line with the processor and the instruction tier the
 * kernels ran at: figures are only comparable between lines that agree. */
static void print_machine(void) {
    char model[80];
    snprintf(model, sizeof model, "%s", whale_cpu_model());
    for (char *c = model; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = ' ';
    printf("{\"cpu\": \"%s\", \"isa\": \"%s\", ", model, whale_isa_name(whale_isa_active()));
}

/* The best GEMM rate of the dtype's products at the model's typical shapes. */
static double gemm_ceiling(whale_dtype dt, whale_err *err) {
    double a = whale_measure_gemm_gflops(dt, 1024, 1280, 320, 5, err);
    double b = a ? whale_measure_gemm_gflops(dt, 1024, 320, 1280, 5, err) : 0;
    return a > b ? a : b;
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
    "  --reps R                repetitions, best reported (default 3); decode also\n"
    "                          reports the median run's share of the memory read\n"
    "                          rate measured around it (pct_of_bound)\n"
    "  --threads N             (default: all cores)\n"
    "  --recompute             train: recompute activations in the backward pass\n"
    "  --profile               time per op group (one more run), as a table on stderr and JSON\n"
    "prints one JSON line per measurement";

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *preset = NULL, *what = "forward";
    long batch = -1, seq = -1, context = 128, threads = 0, reps = 3, tokens = 32;
    int profile = 0, recompute = 0;
    whale_dtype dtype = WHALE_F32;
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &dir, 0, 0, NULL},
        {"--preset", CLI_STR, &preset, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &dtype, 0, 0, NULL},
        {"--what", CLI_STR, &what, 0, 0, NULL},
        {"--batch", CLI_LONG, &batch, 1, 4096, NULL},
        {"--seq-len", CLI_LONG, &seq, 1, 1 << 20, NULL},
        {"--context", CLI_LONG, &context, 1, 1 << 20, NULL},
        {"--tokens", CLI_LONG, &tokens, 1, 1 << 20, NULL},
        {"--reps", CLI_LONG, &reps, 1, 1000, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--profile", CLI_FLAG, &profile, 0, 0, NULL},
        {"--recompute", CLI_FLAG, &recompute, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int st = cli_parse("bench", bench_help, argc, argv, table, NULL, NULL);
    if (st) return st < 0 ? 0 : st;
    if (!dir == !preset) return cli_usage("bench", "give exactly one of -m DIR or --preset NAME");
    int mode = !strcmp(what, "forward") ? 0 : !strcmp(what, "prefill") ? 1 : !strcmp(what, "decode") ? 2
             : !strcmp(what, "train") ? 3 : -1;
    if (mode < 0) return cli_usage("bench", "--what must be forward, prefill, decode or train, got \"%s\"", what);
    if (batch < 0) batch = mode == 0 || mode == 3 ? 4 : 1;
    if (seq < 0) seq = mode == 0 || mode == 3 ? 256 : 512;
    if (mode == 1 && batch != 1) return cli_usage("bench", "--batch applies to --what forward, decode and train only");
    whale_set_threads((int)threads);

    whale_err err;
    whale_model *m;
    /* inference runs hold only the dtype's weights (a checkpoint already in
     * that dtype is used in place); training keeps fp32 masters */
    if (dir ? (mode == 3 ? whale_model_load(dir, &m, &err) : whale_model_load_as(dir, dtype, &m, &err))
            : whale_model_init(preset, 0, &m, &err))
        return cli_fail(&err);
    if (whale_model_set_dtype(m, dtype, &err) || (mode != 3 && whale_model_drop_master(m, &err))) {
        whale_model_free(m);
        return cli_fail(&err);
    }
    const char *dtname = cli_dtype_name(dtype);
    int V = whale_model_vocab_size(m);
    int ctx_total = mode == 2 ? (int)(context + tokens) : (int)seq;
    whale_session *s = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int status = 0;
    size_t rows = mode == 0 ? (size_t)batch * seq : mode == 3 ? 1 : (size_t)batch;
    ids = malloc(sizeof(int32_t) * (size_t)batch * (mode == 2 ? ctx_total : seq));
    logits = whale_alloc(sizeof(float) * rows * V);
    if (!ids || !logits) {
        whale_errf(&err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits", rows * V * 4 / 1048576.0);
        status = cli_fail(&err);
        goto out;
    }
    if (mode == 3 ? whale_train_session_new(m, (int)batch, (int)seq, recompute, &s, &err)
                  : whale_session_new(m, (int)batch, ctx_total, &s, &err)) {
        status = cli_fail(&err);
        goto out;
    }
    whale_rng rng;
    whale_rng_seed(&rng, 1);
    random_ids(ids, (size_t)batch * (mode == 2 ? ctx_total : seq), V, &rng);

    whale_memory mm;
    whale_memory_of_model(m, &mm);
    whale_memory_add_session(&mm, s);
    whale_memory_print(&mm, stderr);
    double ceiling = gemm_ceiling(dtype, &err);
    const char *label = dir ? dir : preset;
    double best = 1e30;
    /* decode's bound: the memory read rate around each timed run (this
     * machine's rate drifts by 2x within minutes and comes in bursts): one
     * pass over 512 MB right before the run and one right after, averaged,
     * so each run is compared with the rate of its own moment (a best of
     * several passes would compare a 0.1 s run with the peak of a burst);
     * the median run is reported */
    double bw_of[1001] = {0}, dt_of[1001] = {0}, bw_before = 0;
    const size_t probe_bytes = (size_t)512 << 20;
    for (int r = 0; r < reps + 1 + profile; r++) { /* first run warms caches and oneDNN primitives */
        if (profile && r == reps + 1) whale_session_set_profile(s, 1); /* an extra run, not in the timings */
        whale_session_reset(s);
        if (mode == 2 && r > 0 && r <= reps) bw_before = whale_measure_read_bandwidth(probe_bytes, 1);
        double t0 = whale_now(), dt;
        if (mode == 3) {
            double loss;
            int64_t count;
            whale_session_zero_grad(s);
            if (whale_session_train_step(s, ids, NULL, NULL, NULL, (int)batch, (int)seq, 1.0, &loss, &count, &err))
                goto fail;
        } else if (mode == 2) {
            /* batch streams at the same context, one token each per step */
            if (whale_session_forward(s, ids, (int)batch, (int)context, logits, 0, &err)) goto fail;
            t0 = whale_now();
            for (int k = 0; k < tokens; k++)
                if (whale_session_forward(s, ids + batch * (context + k), (int)batch, 1, logits, 0, &err)) goto fail;
        } else if (whale_session_forward(s, ids, (int)batch, (int)seq, logits, mode == 0, &err))
            goto fail;
        dt = whale_now() - t0;
        if (r > 0 && r <= reps && dt < best) best = dt;
        if (mode == 2 && r > 0 && r <= reps)
            dt_of[r] = dt, bw_of[r] = (bw_before + whale_measure_read_bandwidth(probe_bytes, 1)) / 2;
    }
    if (profile) {
        const char *names[32];
        double secs[32], sum = 0;
        int n = whale_session_profile(s, names, secs, 32);
        for (int i = 0; i < n; i++) sum += secs[i];
        fprintf(stderr, "%-28s %10s %7s\n", "op group", "ms", "share");
        print_machine();
        printf("\"profile\": \"%s\", \"ms\": {", what);
        for (int i = 0, first = 1; i < n; i++) {
            if (secs[i] == 0) continue;
            fprintf(stderr, "%-28s %10.2f %6.1f%%\n", names[i], secs[i] * 1e3, 100 * secs[i] / sum);
            printf("%s\"%s\": %.3f", first ? "" : ", ", names[i], secs[i] * 1e3);
            first = 0;
        }
        printf("}}\n");
        fprintf(stderr, "%-28s %10.2f\n", "total (timed groups)", sum * 1e3);
    }
    if (mode == 2) {
        double flops = 0;
        for (int k = 0; k < tokens; k++)
            flops += whale_model_forward_flops(m, (int)batch, 1, (int)context + k, (int)batch);
        /* bytes of the product weights in the dtype; the fp32 islands (HC, gate) are under 1 % */
        double bytes = whale_model_decode_weight_bytes(m) * (double)whale_dtype_size(dtype) / 4.0;
        double share[1001];
        int med = 1; /* reps >= 1 */
        for (int r = 1; r <= reps; r++) share[r] = bytes * tokens / dt_of[r] / (bw_of[r] * 1e9);
        for (int r = 1; r <= reps; r++) { /* the run of median share */
            int below = 0;
            for (int o = 1; o <= reps; o++) below += share[o] < share[r] || (share[o] == share[r] && o < r);
            if (below == (reps - 1) / 2) med = r;
        }
        /* a step reads the weights once for all its streams */
        double tps = (double)batch * tokens / best, bw = bw_of[med], bound = batch * bw * 1e9 / bytes;
        print_machine();
        printf("\"what\": \"decode\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"streams\": %ld, "
               "\"context\": %ld, "
               "\"tokens\": %ld, \"tokens_per_s\": %.2f, \"gflops\": %.2f, \"weight_mb_per_token\": %.1f, "
               "\"weights_gb_s\": %.1f, \"read_gb_s\": %.1f, \"bound_tokens_per_s\": %.1f, \"pct_of_bound\": %.1f}\n",
               label, dtname, whale_get_threads(), batch, context, tokens, tps, flops / best / 1e9, bytes / 1e6,
               bytes * tps / batch / 1e9, bw, bound, 100 * share[med]);
    } else if (mode == 3) {
        /* forward + backward ≈ 3 × the forward's FLOPs (6 × active parameters per token + attention) */
        double flops = 3.0 * whale_model_forward_flops(m, (int)batch, (int)seq, 0, (int)(batch * seq));
        double gf = flops / best / 1e9;
        size_t saves, acts = whale_session_activation_bytes(s, &saves);
        print_machine();
        printf("\"what\": \"train\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"batch\": %ld, "
               "\"seq_len\": %ld, \"recompute\": %s, \"tokens_per_s\": %.1f, \"seconds_per_step\": %.4f, "
               "\"gflops\": %.1f, \"ceiling_gflops\": %.1f, \"mfu_pct\": %.1f, \"activation_mib\": %.1f, "
               "\"recompute_saves_mib\": %.1f}\n",
               label, dtname, whale_get_threads(), batch, seq, recompute ? "true" : "false", batch * seq / best, best, gf,
               ceiling, 100 * gf / ceiling, acts / 1048576.0, saves / 1048576.0);
    } else {
        double flops = whale_model_forward_flops(m, (int)batch, (int)seq, 0, mode == 0 ? (int)(batch * seq) : (int)batch);
        double gf = flops / best / 1e9;
        print_machine();
        printf("\"what\": \"%s\", \"model\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"batch\": %ld, "
               "\"seq_len\": %ld, \"tokens_per_s\": %.1f, \"seconds\": %.4f, \"gflops\": %.1f, "
               "\"ceiling_gflops\": %.1f, \"pct_of_ceiling\": %.1f}\n",
               what, label, dtname, whale_get_threads(), batch, seq, batch * seq / best, best, gf, ceiling,
               100 * gf / ceiling);
    }
    fprintf(stderr, "peak resident memory %.1f MiB\n", whale_peak_rss() / 1048576.0);
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(ids);
    free(logits);
    whale_session_free(s);
    whale_model_free(m);
    return status;
}
