/* whale memory: bytes a run needs by category, estimated from a config
 * without allocating anything; with --measure, the run is then made (random
 * weights, one step, in a child process) and its peak resident memory
 * printed next to the estimate. */
#include "cli.h"

#include "whale_util.h"
#include "whale_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

/* One step of the planned run on random weights and tokens. */
static whale_code run_step(const char *config, const whale_memory_plan *p, int is_dir, whale_err *err) {
    whale_model *m = NULL;
    whale_session *s = NULL;
    whale_optimizer *o = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    whale_code c;
    /* full training keeps fp32 masters; inference and a LoRA base hold only
     * the run's precision */
    int full = p->train == WHALE_TRAIN_FULL;
    if (is_dir) c = full ? whale_model_load(config, &m, err) : whale_model_load_as(config, p->dtype, &m, err);
    else c = whale_model_init(config, 1, &m, err);
    if (!c) c = whale_model_set_dtype(m, p->dtype, err);
    if (!c && !p->train) c = whale_model_own_weights(m, err); /* as inference runs hold them */
    if (!c && p->train == WHALE_TRAIN_LORA) {
        whale_lora_config lc = whale_lora_defaults();
        lc.rank = p->lora_rank;
        if (p->lora_targets) lc.target_modules = p->lora_targets;
        c = whale_lora_attach(m, &lc, err);
    }
    if (c) goto done;
    size_t n = (size_t)p->batch * p->seq_len;
    int V = whale_model_vocab_size(m);
    ids = malloc(sizeof(int32_t) * n);
    if (!ids) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        goto done;
    }
    whale_rng r;
    whale_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(whale_rng_u64(&r) % (uint64_t)V);
    if (p->train) {
        whale_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
        double loss;
        int64_t cnt;
        if ((c = whale_train_session_new(m, p->batch, p->seq_len, p->recompute, &s, err)) ||
            (c = whale_adamw_new(m, &ac, &o, err)) ||
            (c = whale_session_train_step(s, ids, NULL, NULL, NULL, p->batch, p->seq_len, 1.0, &loss, &cnt, err)))
            goto done;
        whale_adamw_step(o, s, 1e-4);
    } else {
        if (!(logits = whale_alloc(sizeof(float) * (size_t)p->batch * V))) {
            c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((c = whale_session_new(m, p->batch, p->seq_len, &s, err)) ||
            (c = whale_session_forward(s, ids, p->batch, p->seq_len, logits, 0, err)))
            goto done;
    }
done:
    free(ids);
    free(logits);
    whale_optimizer_free(o);
    whale_session_free(s);
    whale_model_free(m);
    return c;
}

/* Writes random weights of the preset into dir (an fp32 checkpoint, as
 * whale train writes them). */
static whale_code save_random(const char *config, const whale_memory_plan *p, const char *dir, whale_err *err) {
    whale_model *m;
    (void)p;
    whale_code c = whale_model_init(config, 1, &m, err);
    if (!c) c = whale_model_save(m, dir, err);
    whale_model_free(m);
    return c;
}

/* Runs fn in a child process (the engine's OpenMP threads do not survive a
 * fork, so the parent never starts them) and returns its error and peak
 * resident memory. */
static whale_code in_child(whale_code (*fn)(const char *, const whale_memory_plan *, const char *, whale_err *),
                           const char *config, const whale_memory_plan *p, const char *dir, double *peak,
                           whale_err *err) {
    int fd[2];
    if (pipe(fd) != 0) return whale_errf(err, WHALE_ERR_IO, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { /* child: run, then report "peak code message" */
        close(fd[0]);
        whale_err e2 = {0};
        whale_code rc = fn(config, p, dir, &e2);
        char msg[WHALE_ERR_MSG_MAX + 64];
        int len = snprintf(msg, sizeof msg, "%zu %d %s", whale_peak_rss(), (int)rc, rc ? e2.msg : "");
        if (write(fd[1], msg, (size_t)len) < 0) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    char msg[WHALE_ERR_MSG_MAX + 64] = "";
    size_t got = 0;
    ssize_t k;
    while (pid > 0 && got + 1 < sizeof msg && (k = read(fd[0], msg + got, sizeof msg - 1 - got)) > 0) got += (size_t)k;
    msg[got] = 0;
    close(fd[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    size_t bytes = 0;
    int rc = 0, off = 0;
    if (pid < 0 || sscanf(msg, "%zu %d %n", &bytes, &rc, &off) < 2)
        return whale_errf(err, WHALE_ERR_INTERNAL, "the measuring run died (status %d)", status);
    if (rc) return whale_errf(err, (whale_code)rc, "%s", msg + off);
    if (peak) *peak = (double)bytes;
    return WHALE_OK;
}

static whale_code run_step_child(const char *config, const whale_memory_plan *p, const char *dir, whale_err *err) {
    return dir ? run_step(dir, p, 1, err) : run_step(config, p, access(config, F_OK) == 0 && !strstr(config, ".json"), err);
}

/* Peak resident memory of the planned run, measured in a child process so
 * that nothing else counts. An inference run or a LoRA base of a preset in a low precision
 * loads a checkpoint written for it, as a real run would: creating the fp32
 * weights in the same process first would set the peak. (A checkpoint
 * already in the run's dtype is mapped instead of copied; its pages become
 * resident as they are read, so such a run may stay below the estimate by
 * up to the part of the embedding table it never reads.) */
static whale_code measure(const char *config, const whale_memory_plan *p, double *peak, whale_err *err) {
    int is_dir = access(config, F_OK) == 0 && !strstr(config, ".json");
    char tmp[] = "/tmp/whale-memory-XXXXXX";
    const char *dir = NULL;
    whale_code c = WHALE_OK;
    if (!is_dir && p->train != WHALE_TRAIN_FULL && p->dtype != WHALE_F32) {
        if (!mkdtemp(tmp)) return whale_errf(err, WHALE_ERR_IO, "cannot create a temporary directory: %s", strerror(errno));
        dir = tmp;
        c = in_child(save_random, config, p, dir, NULL, err);
    }
    if (!c) c = in_child(run_step_child, config, p, dir, peak, err);
    if (dir) { /* config.json + model.safetensors */
        char path[64];
        snprintf(path, sizeof path, "%s/config.json", tmp);
        unlink(path);
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        unlink(path);
        rmdir(tmp);
    }
    return c;
}

static const char memory_help[] =
    "usage: whale memory --config PRESET|CONFIG.json|MODEL_DIR [options]\n"
    "  --dtype fp32|bf16|fp16|int8   precision of the products (default fp32)\n"
    "  --train none|full|lora        inference (default), full training, or LoRA on a frozen base\n"
    "  --lora-rank R (8)  --batch B (1)  --seq-len T (512)  --recompute\n"
    "  --grad-accum A (1)  --ranks N (1)  --zero 0|1 (0)   training on N ranks, per rank; --zero 1\n"
    "              shards the AdamW moments over them, and in bf16/fp16 the product weights' fp32\n"
    "              masters (as mpirun -np N whale train --zero 1)\n"
    "  --bucket-mb M (0)   on N ranks: the gradient buckets sent during the backward pass (0: none)\n"
    "  --measure   also run it (random weights, one step) and print the peak resident memory\n"
    "  --json      one JSON object instead of the table";

int cmd_memory(int argc, char **argv) {
    const char *config = NULL, *train = NULL;
    whale_memory_plan p = {.dtype = WHALE_F32, .train = WHALE_TRAIN_NONE, .lora_rank = 8, .batch = 1, .seq_len = 512,
                            .bucket_mb = WHALE_BUCKET_MB};
    int json = 0, do_measure = 0;
    long rank = 8, batch = 1, seq_len = 512, grad_accum = 0, ranks = 0, zero = 0;
    const cli_opt table[] = {
        {"-m|--config|--preset", CLI_STR, &config, 0, 0, NULL},
        {"--dtype", CLI_DTYPE, &p.dtype, 0, 0, NULL},
        {"--train|--train-type", CLI_STR, &train, 0, 0, NULL},
        {"--lora-rank", CLI_LONG, &rank, 1, 1 << 16, NULL},
        {"--batch", CLI_LONG, &batch, 1, 1 << 20, NULL},
        {"--seq-len", CLI_LONG, &seq_len, 2, 1 << 24, NULL},
        {"--grad-accum", CLI_LONG, &grad_accum, 1, 65536, NULL},
        {"--ranks", CLI_LONG, &ranks, 1, 1 << 20, NULL},
        {"--zero", CLI_LONG, &zero, 0, 1, NULL},
        {"--bucket-mb", CLI_DOUBLE, &p.bucket_mb, 0, 4096, NULL},
        {"--recompute", CLI_FLAG, &p.recompute, 0, 0, NULL},
        {"--measure", CLI_FLAG, &do_measure, 0, 0, NULL},
        {"--json", CLI_FLAG, &json, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse("memory", memory_help, argc, argv, table, NULL, NULL);
    if (status) return status < 0 ? 0 : status;
    if (train) {
        if (!strcmp(train, "none")) p.train = WHALE_TRAIN_NONE;
        else if (!strcmp(train, "full")) p.train = WHALE_TRAIN_FULL;
        else if (!strcmp(train, "lora")) p.train = WHALE_TRAIN_LORA;
        else return cli_usage("memory", "--train must be none, full or lora, got \"%s\"", train);
    }
    p.lora_rank = (int)rank, p.batch = (int)batch, p.seq_len = (int)seq_len;
    p.grad_accum = (int)grad_accum, p.ranks = (int)ranks, p.zero = (int)zero;
    if (!config) return cli_usage("memory", "--config is required");
    if (do_measure && (p.ranks > 1 || p.grad_accum > 1))
        return cli_usage("memory", "--measure runs one step of one micro-batch in one process: leave out --ranks and --grad-accum");
    whale_err err;
    whale_memory mm;
    if (whale_memory_estimate(config, &p, &mm, &err)) return cli_fail(&err);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    double ram = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    double peak = 0;
    if (do_measure && measure(config, &p, &peak, &err)) return cli_fail(&err);
    if (json) {
        printf("{\"config\": \"%s\", \"dtype\": \"%s\", \"train\": \"%s\", \"lora_rank\": %d, \"batch\": %d, "
               "\"seq_len\": %d, \"recompute\": %s, \"params\": %lld, \"trainable\": %lld, \"weights_f32\": %zu, "
               "\"weights_lowp\": %zu, \"adapters\": %zu, \"grads\": %zu, \"moments\": %zu, \"activations\": %zu, "
               "\"recompute_saves\": %zu, \"kv_cache\": %zu, \"workspace\": %zu, \"runtime\": %zu, \"total\": %zu, "
               "\"ram\": %.0f, \"fits\": %s, \"ranks\": %d, \"zero\": %d, \"grad_accum\": %d",
               config, cli_dtype_name(p.dtype), p.train == WHALE_TRAIN_NONE ? "none" : p.train == WHALE_TRAIN_FULL ? "full" : "lora",
               p.lora_rank, p.batch, p.seq_len, p.recompute ? "true" : "false", (long long)mm.params,
               (long long)mm.trainable, mm.weights_f32, mm.weights_lowp, mm.adapters, mm.grads, mm.moments,
               mm.activations, mm.recompute_saves, mm.kv_cache, mm.workspace, mm.runtime, mm.total, ram,
               ram == 0 || (double)mm.total <= ram ? "true" : "false", p.ranks > 1 ? p.ranks : 1, p.zero,
               p.grad_accum > 1 ? p.grad_accum : 1);
        if (do_measure) printf(", \"peak_rss\": %.0f, \"estimate_error_pct\": %.2f", peak, 100.0 * ((double)mm.total - peak) / peak);
        printf("}\n");
        return 0;
    }
    whale_memory_print(&mm, stdout);
    if (ram > 0)
        printf("this machine has %.1f GiB of RAM: %s\n", ram / 1073741824.0,
               (double)mm.total <= ram ? "fits" : "does NOT fit");
    if (do_measure)
        printf("measured peak resident memory %.1f MiB: the estimate is %+.1f%% off\n", peak / 1048576.0,
               100.0 * ((double)mm.total - peak) / peak);
    return 0;
}
