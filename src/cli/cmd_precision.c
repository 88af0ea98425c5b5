/* whale precision-report: the same model and tokens in fp32, bf16, fp16 and
 * int8, compared with fp32 (loss, largest logit change, KL divergence, top-1
 * agreement, expert routing), with the speed, weight memory and peak RSS of
 * each format; optionally short training runs of every training format from
 * the same init, their losses side by side and overlaid in an SVG.
 *
 * Each format runs in a child process of its own (fork) that loads the model
 * with whale_model_load_as, so its peak RSS is that format's alone: the
 * parent loads no weights before the last child has exited. Children hand
 * their logits and expert choices back through files in a temporary folder. */
#include "cli.h"

#include "whale_util.h"
#include "whale_plot.h"
#include "whale_data.h"
#include "whale_diag.h"
#include "whale_train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char help_text[] =
    "usage: whale precision-report -m DIR (--ids FILE | --data DIR [--batch B] [--seq-len T])\n"
    "                              [--steps N [--out DIR] [--svg FILE] [--lr LR] [--seed S]]\n"
    "                              [--json OUT.json] [--reps R] [--threads N]\n"
    "  runs the same tokens in fp32, bf16, fp16 and int8 (inference), each in a process of its own,\n"
    "  and prints a Markdown table: loss, perplexity, against fp32 the largest |Δlogit|, mean\n"
    "  KL(fp32 ‖ dtype) per position, top-1 agreement and the share of tokens routed to other\n"
    "  experts, then forward tokens/s, weight memory of the format and the run's peak RSS, and the\n"
    "  smallest routing margin; a second table per MoE layer.\n"
    "  --ids FILE      JSON array of equal-length arrays of token ids\n"
    "  --data DIR      a prepared dataset (whale data prepare): B evenly spaced windows of T tokens\n"
    "                  from its val split (train if val is missing or too short)\n"
    "  --batch B       windows from --data, and the training batch (default 4)\n"
    "  --seq-len T     window length (default 256, or the model's max_position_embeddings if smaller)\n"
    "  --steps N       with --data: also train N steps from -m DIR in fp32, bf16, fp16 (loss scaling),\n"
    "                  pure bf16 (nearest) and pure bf16 (stochastic rounding), same data and seed, into\n"
    "                  OUT/{fp32,bf16,fp16,bf16-pure-nearest,bf16-pure-stochastic}; prints their final\n"
    "                  and validation loss, tokens/s and skipped fp16 steps, and overlays the curves\n"
    "  --out DIR       the training runs (default precision-report-runs, next to --json if given)\n"
    "  --svg FILE      the loss curves (default OUT/loss.svg)\n"
    "  --lr LR         training learning rate (default 3e-4, cosine, 3% warmup); --seed S (default 42)\n"
    "  --json OUT.json everything as JSON; --reps R timed forward passes per format (default 2)\n"
    "  --threads N     (default: all cores)";

enum { N_FORMATS = 4, N_TRAIN = 5, MAX_K = 64 };
static const whale_dtype formats[N_FORMATS] = {WHALE_F32, WHALE_BF16, WHALE_F16, WHALE_I8};

typedef struct {
    const char *dir, *ids_path, *data, *json, *out, *svg;
    int batch, seq_len, batch_given, seq_given, reps, steps, threads;
    double lr;
    uint64_t seed;
} opts_t;

/* What the report needs of the model, read from config.json alone: the
 * parent must not load weights before it forks. */
typedef struct {
    int vocab, max_pos, layers, topk;
} model_info;

/* The tokens: ids [B*S] and labels [B*S] in Hugging Face's convention
 * (labels[s] is what position s−1 predicts, −100 = not scored). */
typedef struct {
    int32_t *ids, *labels;
    int B, S;
    const char *split; /* "val" / "train" for --data, NULL for --ids */
} batch_t;

/* ---------------------------------------------------------------- child */

#define RESULT_MAGIC "WHPREC01"
typedef struct {
    char magic[8];
    int32_t code; /* whale_code of the run; msg when not 0 */
    char msg[WHALE_ERR_MSG_MAX];
    double tokens_per_s;
    double weight_bytes; /* the format's weights as loaded (whale_memory_of_model) */
} result_head;
/* followed by float logits [B*S*V], int32 topk [L][B*S*K] (−1 where a layer
 * traced none), double min_margin [L] (INFINITY: none) */

typedef struct {
    whale_diag *d; /* routing margins */
    int32_t *topk;
    int T, K, L;
} child_trace;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Only the router is measured: the gate logits and each layer's choice. */
static void trace_routing(void *user, const char *name, const whale_tensor *t) {
    child_trace *c = user;
    int l;
    if (ends_with(name, ".ffn.gate_logits")) whale_diag_trace(c->d, name, t);
    else if (ends_with(name, ".ffn.topk_idx") && t->dtype == WHALE_I32) {
        whale_diag_trace(c->d, name, t);
        if (sscanf(name, "layers.%d.", &l) == 1 && l >= 0 && l < c->L && t->ndim == 2 && t->shape[0] == c->T &&
            t->shape[1] == c->K)
            memcpy(c->topk + (size_t)l * c->T * c->K, t->data, sizeof(int32_t) * (size_t)c->T * c->K);
    }
}

static whale_code write_all(FILE *f, const void *p, size_t n, const char *path, whale_err *err) {
    if (n && fwrite(p, 1, n, f) != n) return whale_errf(err, WHALE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return WHALE_OK;
}

/* The run of one format: load, one traced forward (logits, routing), then
 * reps timed forwards; everything into path. */
static whale_code child_run(const opts_t *o, const model_info *mi, const batch_t *b, whale_dtype dt, const char *path,
                            result_head *h, whale_err *err) {
    whale_model *m = NULL;
    whale_session *s = NULL;
    whale_diag *d = NULL;
    float *logits = NULL;
    FILE *f = NULL;
    child_trace ct = {0};
    int T = b->B * b->S;
    size_t n_logits = (size_t)T * mi->vocab, n_topk = (size_t)mi->layers * T * mi->topk;
    double *margin = malloc(sizeof(double) * mi->layers);
    whale_code c = dt == WHALE_F32 ? whale_model_load(o->dir, &m, err) : whale_model_load_as(o->dir, dt, &m, err);
    if (!c) c = whale_model_own_weights(m, err);
    if (c) goto done;
    if (whale_model_vocab_size(m) != mi->vocab) {
        c = whale_errf(err, WHALE_ERR_FORMAT, "%s: config.json changed while the report ran", o->dir);
        goto done;
    }
    whale_memory mm;
    whale_memory_of_model(m, &mm);
    h->weight_bytes = (double)(mm.weights_f32 + mm.weights_lowp + mm.weights_mapped);
    logits = whale_alloc(n_logits * sizeof(float));
    ct.topk = malloc(sizeof(int32_t) * (n_topk ? n_topk : 1));
    if (!logits || !ct.topk || !margin || !(d = whale_diag_new(0))) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "cannot allocate %.1f MiB of logits for %d × %d tokens",
                       n_logits * 4 / 1048576.0, b->B, b->S);
        goto done;
    }
    for (size_t i = 0; i < n_topk; i++) ct.topk[i] = -1;
    ct.d = d;
    ct.T = T;
    ct.K = mi->topk;
    ct.L = mi->layers;
    if ((c = whale_diag_set_model(d, m, err)) || (c = whale_session_new(m, b->B, b->S, &s, err))) goto done;
    whale_session_set_trace(s, trace_routing, &ct);
    if ((c = whale_session_forward(s, b->ids, b->B, b->S, logits, 1, err))) goto done; /* also the warm-up */
    whale_session_set_trace(s, NULL, NULL);
    double best = INFINITY;
    for (int rep = 0; rep < o->reps; rep++) {
        whale_session_reset(s);
        double t0 = whale_now();
        if ((c = whale_session_forward(s, b->ids, b->B, b->S, logits, 1, err))) goto done;
        double t = whale_now() - t0;
        if (t < best) best = t;
    }
    h->tokens_per_s = (double)T / best;
    for (int l = 0; l < mi->layers; l++) margin[l] = INFINITY;
    for (int i = 0; i < whale_diag_num_routing(d); i++) {
        whale_diag_routing r;
        whale_diag_routing_at(d, i, &r);
        if (r.layer >= 0 && r.layer < mi->layers && r.tokens) margin[r.layer] = r.min_margin;
    }
    if (!(f = fopen(path, "wb"))) {
        c = whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    if ((c = write_all(f, h, sizeof *h, path, err)) ||
        (c = write_all(f, logits, n_logits * sizeof(float), path, err)) ||
        (c = write_all(f, ct.topk, n_topk * sizeof(int32_t), path, err)) ||
        (c = write_all(f, margin, sizeof(double) * mi->layers, path, err)))
        goto done;
done:
    if (f && fclose(f) && !c) c = whale_errf(err, WHALE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    free(margin);
    free(ct.topk);
    free(logits);
    whale_diag_free(d);
    whale_session_free(s);
    whale_model_free(m);
    return c;
}

/* In the child: run, then write the head again with the outcome (an error
 * replaces the file's content by the head alone). Never returns. */
static void child_main(const opts_t *o, const model_info *mi, const batch_t *b, whale_dtype dt, const char *path) {
    whale_set_threads(o->threads);
    result_head h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, RESULT_MAGIC, 8);
    whale_err err;
    whale_code c = child_run(o, mi, b, dt, path, &h, &err);
    if (c) {
        h.code = c;
        snprintf(h.msg, sizeof h.msg, "%s", err.msg);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(&h, sizeof h, 1, f);
            fclose(f);
        }
    }
    _exit(c ? 1 : 0); /* no atexit handlers or stdio buffers of the parent's */
}

/* ---------------------------------------------------------------- parent */

typedef struct {
    whale_dtype dt;
    const char *name;
    double loss, max_dlogit, kl, top1, tokens_per_s, weight_bytes, peak_rss;
    double *disagree;   /* [L] share of tokens whose top-k set differs from fp32; NAN: not measured */
    double *min_margin; /* [L] */
    double route_disagree, route_margin; /* over all layers */
} row_t;

/* A child's result file, mapped. */
typedef struct {
    void *map;
    size_t len;
    const result_head *h;
    const float *logits;
    const int32_t *topk;
    const double *margin;
} result_t;

static void result_unmap(result_t *r) {
    if (r->map) munmap(r->map, r->len);
    memset(r, 0, sizeof *r);
}

static whale_code result_map(const char *path, const char *name, size_t n_logits, size_t n_topk, int L, result_t *r,
                             whale_err *err) {
    memset(r, 0, sizeof *r);
    int fd;
    uint64_t size;
    whale_err oe;
    if (whale_open_regular(path, &fd, &size, &oe)) return whale_errf(err, WHALE_ERR_INTERNAL, "the %s run ended without a result", name);
    if (size < sizeof(result_head) || size > SIZE_MAX) {
        close(fd);
        return whale_errf(err, WHALE_ERR_INTERNAL, "the %s run ended without a result", name);
    }
    r->len = (size_t)size;
    r->map = mmap(NULL, r->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (r->map == MAP_FAILED) {
        r->map = NULL;
        return whale_errf(err, WHALE_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    }
    r->h = r->map;
    if (memcmp(r->h->magic, RESULT_MAGIC, 8))
        return whale_errf(err, WHALE_ERR_INTERNAL, "the %s run left a damaged result", name);
    if (r->h->code) /* the child's own one-line error, under its exit status */
        return whale_errf(err, (whale_code)r->h->code, "%s run: %s", name, r->h->msg);
    size_t want = sizeof(result_head) + n_logits * sizeof(float) + n_topk * sizeof(int32_t) + sizeof(double) * L;
    if (r->len != want) return whale_errf(err, WHALE_ERR_INTERNAL, "the %s run left a truncated result", name);
    r->logits = (const float *)((const char *)r->map + sizeof(result_head));
    r->topk = (const int32_t *)(r->logits + n_logits);
    r->margin = (const double *)(r->topk + n_topk);
    return WHALE_OK;
}

/* Run one format in a child process and wait for it; its peak RSS comes
 * from the kernel's accounting of that child (wait4). */
static whale_code run_format(const opts_t *o, const model_info *mi, const batch_t *b, whale_dtype dt,
                             const char *path, double *peak_rss, whale_err *err) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return whale_errf(err, WHALE_ERR_INTERNAL, "cannot start the %s run: fork: %s", cli_dtype_name(dt), strerror(errno));
    if (pid == 0) child_main(o, mi, b, dt, path);
    int status;
    struct rusage ru;
    pid_t w;
    do w = wait4(pid, &status, 0, &ru);
    while (w < 0 && errno == EINTR);
    if (w < 0) return whale_errf(err, WHALE_ERR_INTERNAL, "waiting for the %s run: %s", cli_dtype_name(dt), strerror(errno));
    if (WIFSIGNALED(status))
        return whale_errf(err, WHALE_ERR_INTERNAL, "the %s run was killed by signal %d%s", cli_dtype_name(dt),
                          WTERMSIG(status), WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "");
    *peak_rss = (double)ru.ru_maxrss * 1024.0; /* kilobytes on Linux */
    return WHALE_OK;
}

/* log-sum-exp of one row of logits, in double. */
static double row_lse(const float *x, int V) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < V; v++)
        if (x[v] > m) m = x[v];
    for (int v = 0; v < V; v++) s += exp(x[v] - m);
    return log(s) + m;
}

/* Loss over the scored positions, and against the reference logits: mean
 * KL(ref ‖ x) per position, top-1 agreement and the largest |Δlogit|. */
static void compare_logits(const float *ref, const float *x, const batch_t *b, int V, row_t *r) {
    double kl = 0, agree = 0, md = 0, loss = 0;
    int64_t rows = (int64_t)b->B * b->S, scored = 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *a = ref + i * V, *y = x + i * V;
        double la = row_lse(a, V), ly = row_lse(y, V), k = 0;
        int ia = 0, iy = 0;
        for (int v = 0; v < V; v++) {
            if (a[v] > a[ia]) ia = v;
            if (y[v] > y[iy]) iy = v;
            double d = fabs((double)a[v] - y[v]);
            if (d > md || isnan(d)) md = d;
            double lpa = a[v] - la, lpy = y[v] - ly;
            k += exp(lpa) * (lpa - lpy);
        }
        kl += k;
        agree += ia == iy;
        int s = (int)(i % b->S);
        int32_t target = s + 1 < b->S ? b->labels[i + 1] : -100;
        if (target >= 0 && target < V) {
            loss += ly - y[target];
            scored++;
        }
    }
    r->loss = scored ? loss / (double)scored : NAN;
    r->kl = kl / (double)rows;
    r->top1 = agree / (double)rows;
    r->max_dlogit = md;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Per layer: share of tokens whose set of K experts differs from fp32's. */
static void compare_routing(const result_t *ref, const result_t *x, int L, int T, int K, row_t *r) {
    double sum = 0;
    int n = 0;
    r->route_margin = INFINITY;
    for (int l = 0; l < L; l++) {
        r->min_margin[l] = x->margin[l];
        if (x->margin[l] < r->route_margin) r->route_margin = x->margin[l];
        const int32_t *a = ref->topk + (size_t)l * T * K, *y = x->topk + (size_t)l * T * K;
        if (a[0] < 0 || y[0] < 0) { /* a layer without a router (hash layer) */
            r->disagree[l] = NAN;
            continue;
        }
        int64_t differ = 0;
        for (int t = 0; t < T; t++) {
            int32_t p[MAX_K], q[MAX_K];
            memcpy(p, a + (size_t)t * K, sizeof(int32_t) * K);
            memcpy(q, y + (size_t)t * K, sizeof(int32_t) * K);
            qsort(p, (size_t)K, sizeof *p, cmp_i32);
            qsort(q, (size_t)K, sizeof *q, cmp_i32);
            differ += memcmp(p, q, sizeof(int32_t) * K) != 0;
        }
        r->disagree[l] = (double)differ / T;
        sum += r->disagree[l];
        n++;
    }
    r->route_disagree = n ? sum / n : NAN;
}

/* ---------------------------------------------------------------- inputs */

static whale_code read_model_info(const char *dir, model_info *mi, whale_err *err) {
    char path[4096], *text;
    size_t n;
    snprintf(path, sizeof path, "%s/config.json", dir);
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) return whale_errf(err, WHALE_ERR_FORMAT, "%s: not valid JSON", path);
    const char *keys[4] = {"vocab_size", "max_position_embeddings", "num_hidden_layers", "num_experts_per_tok"};
    int *vals[4] = {&mi->vocab, &mi->max_pos, &mi->layers, &mi->topk};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9) {
            cJSON_Delete(j);
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: \"%s\" is missing or not a positive integer", path, keys[k]);
        }
        *vals[k] = v->valueint;
    }
    cJSON_Delete(j);
    if (mi->topk > MAX_K) return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: more than %d experts per token", path, MAX_K);
    return WHALE_OK;
}

/* B windows of S tokens spread evenly over the val split (or train). */
static whale_code read_windows(const opts_t *o, const model_info *mi, batch_t *b, whale_err *err) {
    whale_dataset *d = NULL;
    whale_err e2;
    whale_code c = whale_dataset_open(o->data, "val", &d, &e2);
    b->split = "val";
    if (c || whale_dataset_num_windows(d, b->S) < 1) {
        whale_dataset_free(d);
        d = NULL;
        b->split = "train";
        if ((c = whale_dataset_open(o->data, "train", &d, err))) return c;
    }
    int64_t nw = whale_dataset_num_windows(d, b->S);
    if ((c = whale_dataset_check(d, mi->vocab, NULL, err))) goto done;
    if (nw < 1) {
        c = whale_errf(err, WHALE_ERR_ARG, "%s: %lld tokens in the %s split make no window of --seq-len %d", o->data,
                       (long long)whale_dataset_tokens(d), b->split, b->S);
        goto done;
    }
    if (nw < b->B) b->B = (int)nw; /* a small split: every window once */
    b->ids = malloc(sizeof(int32_t) * (size_t)b->B * b->S);
    b->labels = malloc(sizeof(int32_t) * (size_t)b->B * b->S);
    if (!b->ids || !b->labels) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < b->B && !c; i++)
        c = whale_dataset_window(d, (int64_t)i * nw / b->B, b->S, b->ids + (size_t)i * b->S,
                                 b->labels + (size_t)i * b->S, NULL, NULL, err);
done:
    whale_dataset_free(d); /* unmapped before the children start */
    return c;
}

/* ---------------------------------------------------------------- training */

typedef struct {
    const char *name;
    whale_dtype dt;
    whale_weight_rounding weights;
    whale_train_result res;
    double steady_tps; /* tokens/s after the first step (which pays for JIT kernels and first touches) */
    int64_t skipped;
    double *loss; /* per logged step */
    int64_t *step;
    int n_loss;
} train_row;

/* The losses and the last fp16 skip count a run logged. */
static whale_code read_metrics(const char *run_dir, train_row *t, whale_err *err) {
    char path[4300], *text;
    size_t n;
    snprintf(path, sizeof path, "%.4200s/metrics.jsonl", run_dir);
    whale_code c = whale_read_file(path, &text, &n, err);
    if (c) return c;
    int cap = 0;
    double first_t = NAN, first_tok = 0, last_t = NAN, last_tok = 0;
    for (char *line = text; line < text + n;) {
        char *nl = memchr(line, '\n', (size_t)(text + n - line));
        size_t len = nl ? (size_t)(nl - line) : (size_t)(text + n - line);
        cJSON *j = cJSON_ParseWithLength(line, len);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step"), *l = cJSON_GetObjectItemCaseSensitive(j, "loss"),
                    *sk = cJSON_GetObjectItemCaseSensitive(j, "skipped_steps");
        if (cJSON_IsNumber(sk)) t->skipped = (int64_t)sk->valuedouble;
        if (cJSON_IsNumber(st) && l) {
            if (t->n_loss == cap) {
                cap = cap ? 2 * cap : 64;
                double *lg = realloc(t->loss, sizeof(double) * cap);
                if (lg) t->loss = lg;
                int64_t *sg = lg ? realloc(t->step, sizeof(int64_t) * cap) : NULL;
                if (sg) t->step = sg;
                if (!lg || !sg) {
                    cJSON_Delete(j);
                    free(text);
                    return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
                }
            }
            /* the logged rate is cumulative: seconds so far = tokens / rate */
            const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens"),
                        *tps = cJSON_GetObjectItemCaseSensitive(j, "tokens_per_s");
            if (cJSON_IsNumber(tok) && cJSON_IsNumber(tps) && tps->valuedouble > 0) {
                last_tok = tok->valuedouble;
                last_t = last_tok / tps->valuedouble;
                if (isnan(first_t)) first_t = last_t, first_tok = last_tok;
            }
            t->step[t->n_loss] = (int64_t)st->valuedouble;
            t->loss[t->n_loss++] = cJSON_IsNumber(l) ? l->valuedouble : NAN; /* null: a non-finite loss */
        }
        cJSON_Delete(j);
        line += len + 1;
    }
    free(text);
    t->steady_tps = last_t > first_t ? (last_tok - first_tok) / (last_t - first_t) : t->res.tokens_per_s;
    return WHALE_OK;
}

static whale_code train_all(const opts_t *o, train_row *rows, char (*dirs)[4200], whale_err *err) {
    whale_code c = whale_mkdir(o->out, err);
    for (int k = 0; k < N_TRAIN && !c; k++) {
        train_row *t = &rows[k];
        whale_train_opts to = whale_train_defaults();
        snprintf(dirs[k], sizeof dirs[k], "%s/%s", o->out, t->name);
        to.init = o->dir;
        to.data = o->data;
        to.out = dirs[k];
        to.max_steps = o->steps;
        to.batch_size = o->batch;
        to.seq_len = o->seq_len;
        to.lr = o->lr;
        to.seed = o->seed;
        to.log_every = 1;
        to.eval_batches = 8; /* the validation loss at the end: up to 8 batches */
        to.quiet = 1;
        to.dtype = t->dt;
        to.weights = t->weights;
        if ((c = whale_train_run(&to, &t->res, err))) {
            char msg[WHALE_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return whale_errf(err, c, "training %s: %s", t->name, msg);
        }
        c = read_metrics(dirs[k], t, err);
    }
    return c;
}

/* ---------------------------------------------------------------- output */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* A number, or null when it is not finite (JSON has no NaN). */
static void json_num(FILE *f, const char *fmt, double v) {
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

static const char *md_num(char *buf, size_t cap, const char *fmt, double v) {
    if (isfinite(v)) snprintf(buf, cap, fmt, v);
    else snprintf(buf, cap, "—");
    return buf;
}

static void print_tables(const batch_t *b, const model_info *mi, const row_t *rows) {
    char s[10][48];
    printf("| dtype | loss | ppl | max \\|Δlogit\\| vs fp32 | mean KL(fp32 ‖ dtype) | top-1 agreement | routing differs "
           "| min routing margin | forward tokens/s | weights MiB | peak RSS MiB |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < N_FORMATS; k++) {
        const row_t *r = &rows[k];
        int ref = k == 0;
        printf("| %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.2f | %.1f |\n", r->name,
               md_num(s[0], 48, "%.6f", r->loss), md_num(s[1], 48, "%.3f", exp(r->loss)),
               ref ? "—" : md_num(s[2], 48, "%.4g", r->max_dlogit), ref ? "—" : md_num(s[3], 48, "%.3g", r->kl),
               ref ? "—" : (snprintf(s[4], 48, "%.2f %%", 100 * r->top1), s[4]),
               ref ? "—" : md_num(s[5], 48, "%.2f %%", 100 * r->route_disagree),
               md_num(s[6], 48, "%.3g", r->route_margin), r->tokens_per_s, r->weight_bytes / 1048576.0,
               r->peak_rss / 1048576.0);
    }
    printf("\nrouting per MoE layer: share of the %d tokens whose top-%d experts differ from fp32 (smallest margin)\n\n",
           b->B * b->S, mi->topk);
    printf("| layer | fp32 | bf16 | fp16 | int8 |\n| --- | --- | --- | --- | --- |\n");
    for (int l = 0; l < mi->layers; l++) {
        printf("| %d |", l);
        for (int k = 0; k < N_FORMATS; k++) {
            char m[48];
            md_num(m, sizeof m, "%.3g", rows[k].min_margin[l]);
            if (k == 0 || isnan(rows[k].disagree[l])) printf(" (%s) |", m);
            else printf(" %.2f %% (%s) |", 100 * rows[k].disagree[l], m);
        }
        printf("\n");
    }
}

static void print_training(const opts_t *o, const train_row *t, const char *svg) {
    char s[4][48];
    printf("\ntraining: %d steps of %d × %d tokens from %s, lr %g, seed %llu (runs in %s, curves in %s)\n\n",
           o->steps, o->batch, o->seq_len, o->dir, o->lr, (unsigned long long)o->seed, o->out, svg);
    printf("| run | final loss | val loss | tokens/s after step 1 | skipped fp16 steps |\n"
           "| --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < N_TRAIN; k++)
        printf("| %s | %s | %s | %s | %s |\n", t[k].name, md_num(s[0], 48, "%.6f", t[k].res.last_loss),
               md_num(s[1], 48, "%.6f", t[k].res.val_loss), md_num(s[2], 48, "%.0f", t[k].steady_tps),
               t[k].dt == WHALE_F16 ? (snprintf(s[3], 48, "%lld", (long long)t[k].skipped), s[3]) : "—");
}

static whale_code write_json(const opts_t *o, const batch_t *b, const model_info *mi, const row_t *rows,
                             const train_row *t, const char *svg, whale_err *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    fprintf(f, "{\"model\": ");
    json_str(f, o->dir);
    if (o->data) {
        fprintf(f, ", \"data\": ");
        json_str(f, o->data);
        fprintf(f, ", \"split\": \"%s\"", b->split);
    } else {
        fprintf(f, ", \"ids\": ");
        json_str(f, o->ids_path);
    }
    fprintf(f, ", \"batch\": %d, \"seq_len\": %d, \"threads\": %d, \"reps\": %d, \"rows\": [", b->B, b->S,
            whale_get_threads(), o->reps);
    for (int k = 0; k < N_FORMATS; k++) {
        const row_t *r = &rows[k];
        fprintf(f, "%s\n  {\"dtype\": \"%s\", \"loss\": ", k ? "," : "", r->name);
        json_num(f, "%.9g", r->loss);
        fprintf(f, ", \"ppl\": ");
        json_num(f, "%.9g", exp(r->loss));
        fprintf(f, ", \"max_abs_dlogit\": ");
        json_num(f, "%.9g", r->max_dlogit);
        fprintf(f, ", \"kl\": ");
        json_num(f, "%.9g", r->kl);
        fprintf(f, ", \"top1\": %.6f, \"tokens_per_s\": %.1f, \"weight_bytes\": %.0f, \"peak_rss_bytes\": %.0f, "
                   "\"routing_disagree_frac\": ",
                r->top1, r->tokens_per_s, r->weight_bytes, r->peak_rss);
        json_num(f, "%.6g", r->route_disagree);
        fprintf(f, ", \"min_margin\": ");
        json_num(f, "%.6g", r->route_margin);
        fprintf(f, ", \"routing\": [");
        for (int l = 0; l < mi->layers; l++) {
            fprintf(f, "%s{\"layer\": %d, \"disagree_frac\": ", l ? ", " : "", l);
            json_num(f, "%.6g", r->disagree[l]);
            fprintf(f, ", \"min_margin\": ");
            json_num(f, "%.6g", r->min_margin[l]);
            fprintf(f, "}");
        }
        fprintf(f, "]}");
    }
    fprintf(f, "\n], \"training\": ");
    if (!t) fprintf(f, "null");
    else {
        fprintf(f, "{\"steps\": %d, \"batch\": %d, \"seq_len\": %d, \"lr\": %g, \"seed\": %llu, \"out\": ", o->steps,
                o->batch, o->seq_len, o->lr, (unsigned long long)o->seed);
        json_str(f, o->out);
        fprintf(f, ", \"svg\": ");
        json_str(f, svg);
        fprintf(f, ", \"runs\": [");
        for (int k = 0; k < N_TRAIN; k++) {
            fprintf(f, "%s\n  {\"name\": \"%s\", \"dtype\": \"%s\", \"weights\": \"%s\", \"final_loss\": ", k ? "," : "",
                    t[k].name, cli_dtype_name(t[k].dt),
                    t[k].weights == WHALE_WEIGHTS_BF16_NEAREST      ? "bf16-nearest"
                    : t[k].weights == WHALE_WEIGHTS_BF16_STOCHASTIC ? "bf16-stochastic"
                                                                    : "fp32");
            json_num(f, "%.9g", t[k].res.last_loss);
            fprintf(f, ", \"val_loss\": ");
            json_num(f, "%.9g", t[k].res.val_loss);
            fprintf(f, ", \"tokens_per_s\": %.1f, \"tokens_per_s_after_step1\": ", t[k].res.tokens_per_s);
            json_num(f, "%.1f", t[k].steady_tps);
            fprintf(f, ", \"seconds\": %.3f, \"skipped_steps\": %lld, \"losses\": [", t[k].res.seconds,
                    (long long)t[k].skipped);
            for (int i = 0; i < t[k].n_loss; i++) {
                fprintf(f, "%s", i ? ", " : "");
                json_num(f, "%.6g", t[k].loss[i]);
            }
            fprintf(f, "]}");
        }
        fprintf(f, "\n]}");
    }
    fprintf(f, "}\n");
    if (fclose(f)) {
        free(buf);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    whale_code c = whale_write_file_atomic(o->json, buf, len, err);
    free(buf);
    return c;
}

/* ---------------------------------------------------------------- command */

/* The options, from one table; 0, -1 after --help, or the usage status. */
static int parse_opts(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.lr = whale_train_defaults().lr, .seed = whale_train_defaults().seed};
    long batch = 0, seq_len = 0, steps = 0, reps = 2, threads = 0, seed = (long)o->seed; /* 0: not given */
    const cli_opt table[] = {
        {"-m|--model", CLI_STR, &o->dir, 0, 0, NULL},
        {"--ids", CLI_STR, &o->ids_path, 0, 0, NULL},
        {"--data", CLI_STR, &o->data, 0, 0, NULL},
        {"--json", CLI_STR, &o->json, 0, 0, NULL},
        {"--out", CLI_STR, &o->out, 0, 0, NULL},
        {"--svg", CLI_STR, &o->svg, 0, 0, NULL},
        {"--batch|--batch-size", CLI_LONG, &batch, 1, 4096, NULL},
        {"--seq-len", CLI_LONG, &seq_len, 2, 1 << 20, NULL},
        {"--steps", CLI_LONG, &steps, 1, 1000000, NULL},
        {"--reps", CLI_LONG, &reps, 1, 100, NULL},
        {"--threads", CLI_LONG, &threads, 1, 1024, NULL},
        {"--seed", CLI_LONG, &seed, 0, 2147483647L, NULL},
        {"--lr", CLI_DOUBLE, &o->lr, 1e-12, 10, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int parsed = cli_parse("precision-report", help_text, argc, argv, table, NULL, NULL);
    if (parsed) return parsed;
    o->batch = batch ? (int)batch : 4, o->batch_given = batch != 0;
    o->seq_len = (int)seq_len, o->seq_given = seq_len != 0;
    o->steps = (int)steps, o->reps = (int)reps, o->threads = (int)threads, o->seed = (uint64_t)seed;
    if (!o->dir || !!o->ids_path + !!o->data != 1)
        return cli_usage("precision-report", "-m DIR and exactly one of --ids FILE or --data DIR are required");
    if (o->ids_path && (o->batch_given || o->seq_given))
        return cli_usage("precision-report", "--batch and --seq-len apply to --data (--ids gives its own shape)");
    if (o->steps && !o->data) return cli_usage("precision-report", "--steps needs --data DIR to train on");
    if (!o->steps && (o->out || o->svg)) return cli_usage("precision-report", "--out and --svg apply to --steps");
    return 0;
}

/* The tokens: --ids as given (labels the ids), or --data's windows. */
static whale_code read_tokens(opts_t *o, const model_info *mi, batch_t *b, whale_err *err) {
    if (!o->ids_path) {
        if (!o->seq_given) o->seq_len = mi->max_pos < 256 ? mi->max_pos : 256;
        if (o->seq_len > mi->max_pos)
            return whale_errf(err, WHALE_ERR_RANGE, "--seq-len %d exceeds the model's max_position_embeddings %d",
                              o->seq_len, mi->max_pos);
        b->B = o->batch;
        b->S = o->seq_len;
        return read_windows(o, mi, b, err);
    }
    whale_code c = whale_read_ids_file(o->ids_path, mi->vocab, &b->ids, &b->B, &b->S, err);
    if (c) return c;
    if (b->S > mi->max_pos)
        return whale_errf(err, WHALE_ERR_RANGE, "%s: %d tokens per row exceed the model's max_position_embeddings %d",
                          o->ids_path, b->S, mi->max_pos);
    if (!(b->labels = malloc(sizeof(int32_t) * (size_t)b->B * b->S))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    memcpy(b->labels, b->ids, sizeof(int32_t) * (size_t)b->B * b->S);
    return WHALE_OK;
}

/* A report's state: the formats' rows, their children's results and the
 * training runs (report_free frees them). */
typedef struct {
    model_info mi;
    batch_t b;
    row_t rows[N_FORMATS];
    result_t res[N_FORMATS];
    train_row train[N_TRAIN];
    char tmp[4096], paths[N_FORMATS][4200], dirs[N_TRAIN][4200];
    char out_default[4096], svg_default[4200];
} report_t;

/* Every format in a process of its own, one after the other, each then
 * compared with fp32 (the first). */
static whale_code run_formats(const opts_t *o, report_t *r, whale_err *err) {
    const char *tmpdir = getenv("TMPDIR");
    snprintf(r->tmp, sizeof r->tmp, "%s/whale-precision-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(r->tmp)) {
        whale_code c = whale_errf(err, WHALE_ERR_IO, "%s: cannot create a temporary folder: %s", r->tmp, strerror(errno));
        r->tmp[0] = 0;
        return c;
    }
    const model_info *mi = &r->mi;
    int T = r->b.B * r->b.S;
    size_t n_logits = (size_t)T * mi->vocab, n_topk = (size_t)mi->layers * T * mi->topk;
    whale_code c;
    for (int k = 0; k < N_FORMATS; k++) {
        r->rows[k].dt = formats[k];
        r->rows[k].name = cli_dtype_name(formats[k]);
        snprintf(r->paths[k], sizeof r->paths[k], "%s/%s.bin", r->tmp, r->rows[k].name);
        if ((c = run_format(o, mi, &r->b, formats[k], r->paths[k], &r->rows[k].peak_rss, err))) return c;
    }
    for (int k = 0; k < N_FORMATS; k++) {
        row_t *w = &r->rows[k];
        if ((c = result_map(r->paths[k], w->name, n_logits, n_topk, mi->layers, &r->res[k], err))) return c;
        w->tokens_per_s = r->res[k].h->tokens_per_s;
        w->weight_bytes = r->res[k].h->weight_bytes;
        w->disagree = calloc((size_t)mi->layers, sizeof(double));
        w->min_margin = calloc((size_t)mi->layers, sizeof(double));
        if (!w->disagree || !w->min_margin) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        compare_logits(r->res[0].logits, r->res[k].logits, &r->b, mi->vocab, w);
        compare_routing(&r->res[0], &r->res[k], mi->layers, T, mi->topk, w);
    }
    return WHALE_OK;
}

/* --steps: the training runs (after the children: the parent may load
 * models now), their curves in *svg. */
static whale_code run_training(opts_t *o, report_t *r, const char **svg, whale_err *err) {
    if (!o->out) {
        char jpath[4000] = "./x"; /* dirname may modify its argument and return static storage */
        if (o->json) snprintf(jpath, sizeof jpath, "%s", o->json);
        snprintf(r->out_default, sizeof r->out_default, "%s/precision-report-runs", dirname(jpath));
        o->out = r->out_default;
    }
    snprintf(r->svg_default, sizeof r->svg_default, "%s/loss.svg", o->out);
    *svg = o->svg ? o->svg : r->svg_default;
    whale_code c = train_all(o, r->train, r->dirs, err);
    if (c) return c;
    const char *inputs[N_TRAIN];
    for (int k = 0; k < N_TRAIN; k++) inputs[k] = r->dirs[k];
    char title[256];
    snprintf(title, sizeof title, "%d steps of %d × %d tokens in each precision", o->steps, o->batch, o->seq_len);
    whale_plot_opts po = {.title = title, .smooth = 1};
    if ((c = whale_plot_svg(inputs, N_TRAIN, &po, *svg, err))) return c;
    print_training(o, r->train, *svg);
    return WHALE_OK;
}

static void report_free(report_t *r) {
    for (int k = 0; k < N_FORMATS; k++) {
        result_unmap(&r->res[k]);
        free(r->rows[k].disagree);
        free(r->rows[k].min_margin);
        if (r->paths[k][0]) unlink(r->paths[k]);
    }
    for (int k = 0; k < N_TRAIN; k++) {
        free(r->train[k].loss);
        free(r->train[k].step);
    }
    if (r->tmp[0]) rmdir(r->tmp);
    free(r->b.ids);
    free(r->b.labels);
    free(r);
}

int cmd_precision_report(int argc, char **argv) {
    opts_t o;
    int status = parse_opts(argc, argv, &o);
    if (status) return status < 0 ? 0 : status;
    whale_set_threads(o.threads);
    whale_err err;
    report_t *r = calloc(1, sizeof *r);
    if (!r) {
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        return cli_fail(&err);
    }
    const train_row train[N_TRAIN] = {
        {.name = "fp32", .dt = WHALE_F32, .weights = WHALE_WEIGHTS_F32},
        {.name = "bf16", .dt = WHALE_BF16, .weights = WHALE_WEIGHTS_F32},
        {.name = "fp16", .dt = WHALE_F16, .weights = WHALE_WEIGHTS_F32},
        {.name = "bf16-pure-nearest", .dt = WHALE_BF16, .weights = WHALE_WEIGHTS_BF16_NEAREST},
        {.name = "bf16-pure-stochastic", .dt = WHALE_BF16, .weights = WHALE_WEIGHTS_BF16_STOCHASTIC}};
    memcpy(r->train, train, sizeof train);
    const char *svg = NULL;
    if (read_model_info(o.dir, &r->mi, &err) || read_tokens(&o, &r->mi, &r->b, &err) || run_formats(&o, r, &err))
        goto fail;
    if (o.data) printf("%s: %d windows of %d tokens from the %s split of %s\n\n", o.dir, r->b.B, r->b.S, r->b.split, o.data);
    else printf("%s: %d × %d tokens from %s\n\n", o.dir, r->b.B, r->b.S, o.ids_path);
    print_tables(&r->b, &r->mi, r->rows);
    fflush(stdout);
    if (o.steps && run_training(&o, r, &svg, &err)) goto fail;
    if (o.json && write_json(&o, &r->b, &r->mi, r->rows, o.steps ? r->train : NULL, svg, &err)) goto fail;
    goto out;
fail:
    status = cli_fail(&err);
out:
    report_free(r);
    return status;
}
