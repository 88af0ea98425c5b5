/* whale precision-report: the same model and tokens in each available
 * compute precision, compared with fp32: loss, largest logit change, KL
 * divergence, top-1 agreement and speed. */
#include "cli/cli.h"

#include "core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    whale_dtype dt;
    double loss, max_dlogit, kl, top1, tokens_per_s;
} prec_row;

/* KL(p‖q) per row from logits, and whether the argmaxes agree. */
static void compare_rows(const float *ref, const float *x, long rows, int V, double *kl_mean, double *top1,
                         double *max_d) {
    double kl = 0, agree = 0, md = 0;
    for (long r = 0; r < rows; r++) {
        const float *a = ref + r * V, *b = x + r * V;
        double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0;
        int ia = 0, ib = 0;
        for (int v = 0; v < V; v++) {
            if (a[v] > ma) ma = a[v], ia = v;
            if (b[v] > mb) mb = b[v], ib = v;
            md = fmax(md, fabs((double)a[v] - b[v]));
        }
        for (int v = 0; v < V; v++) sa += exp(a[v] - ma), sb += exp(b[v] - mb);
        double la = log(sa) + ma, lb = log(sb) + mb, k = 0;
        for (int v = 0; v < V; v++) {
            double lpa = a[v] - la, lpb = b[v] - lb;
            k += exp(lpa) * (lpa - lpb);
        }
        kl += k;
        agree += ia == ib;
    }
    *kl_mean = kl / (double)rows;
    *top1 = agree / (double)rows;
    *max_d = md;
}

int cmd_precision_report(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *json = NULL;
    long threads = 0, reps = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale precision-report -m DIR --ids FILE [--json OUT.json] [--reps R] [--threads N]\n"
                 "  runs the same batch in every available compute precision (fp32, bf16) and reports, against\n"
                 "  fp32: loss, max |Δlogit|, mean KL(fp32 ‖ dtype) per position, top-1 agreement, forward\n"
                 "  tokens/s and weight memory; a Markdown table on stdout. fp16 and int8 are not available yet.");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("precision-report", "%s needs a value", a);
        int bad = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--reps")) bad = cli_int("precision-report", a, v, 1, 100, &reps);
        else if (!strcmp(a, "--threads")) bad = cli_int("precision-report", a, v, 1, 1024, &threads);
        else return cli_usage("precision-report", "unknown option \"%s\"", a);
        if (bad) return bad;
    }
    if (!dir || !ids_path) return cli_usage("precision-report", "-m DIR and --ids FILE are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m = NULL;
    whale_session *s = NULL;
    int32_t *ids = NULL;
    float *ref = NULL, *cur = NULL;
    int B, S, status = 0;
    prec_row rows[] = {{"fp32", WHALE_F32, 0, 0, 0, 0, 0}, {"bf16", WHALE_BF16, 0, 0, 0, 0, 0}};
    int n_rows = (int)(sizeof rows / sizeof rows[0]);
    if (whale_model_load(dir, &m, &err) || cli_read_ids_file(ids_path, whale_model_vocab_size(m), &ids, &B, &S, &err) ||
        whale_session_new(m, B, S, &s, &err))
        goto fail;
    int V = whale_model_vocab_size(m);
    size_t n = (size_t)B * S * V;
    ref = whale_alloc(n * sizeof(float));
    cur = whale_alloc(n * sizeof(float));
    if (!ref || !cur) {
        whale_errf(&err, WHALE_ERR_NOMEM, "cannot allocate 2 × %.1f MiB of logits", n * 4 / 1048576.0);
        goto fail;
    }
    for (int k = 0; k < n_rows; k++) {
        prec_row *r = &rows[k];
        if (whale_model_set_dtype(m, r->dt, &err)) goto fail;
        float *out = k == 0 ? ref : cur;
        double best = 1e30;
        for (int rep = 0; rep <= reps; rep++) { /* the first run warms up */
            whale_session_reset(s);
            double t0 = whale_now();
            if (whale_session_forward(s, ids, B, S, out, 1, &err)) goto fail;
            double dt = whale_now() - t0;
            if (rep > 0 && dt < best) best = dt;
        }
        int64_t cnt;
        r->loss = whale_cross_entropy(out, ids, B, S, V, &cnt);
        r->tokens_per_s = (double)B * S / best;
        if (k == 0) r->top1 = 1;
        else compare_rows(ref, cur, (long)B * S, V, &r->kl, &r->top1, &r->max_dlogit);
    }
    printf("| dtype | loss | ppl | max \\|Δlogit\\| vs fp32 | mean KL(fp32 ‖ dtype) | top-1 agreement | forward tokens/s |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < n_rows; k++)
        printf("| %s | %.6f | %.3f | %.4g | %.3g | %.2f %% | %.0f |\n", rows[k].name, rows[k].loss, exp(rows[k].loss),
               rows[k].max_dlogit, rows[k].kl, 100 * rows[k].top1, rows[k].tokens_per_s);
    if (json) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) {
            whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
            goto fail;
        }
        fprintf(f, "{\"model\": \"%s\", \"batch\": %d, \"seq_len\": %d, \"rows\": [", dir, B, S);
        for (int k = 0; k < n_rows; k++)
            fprintf(f, "%s{\"dtype\": \"%s\", \"loss\": %.9g, \"max_abs_dlogit\": %.9g, \"kl\": %.9g, \"top1\": %.6f, "
                       "\"tokens_per_s\": %.1f}",
                    k ? ", " : "", rows[k].name, rows[k].loss, rows[k].max_dlogit, rows[k].kl, rows[k].top1,
                    rows[k].tokens_per_s);
        fprintf(f, "]}\n");
        fclose(f);
        whale_code c = whale_write_file_atomic(json, buf, len, &err);
        free(buf);
        if (c) goto fail;
    }
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(ref);
    free(cur);
    free(ids);
    whale_session_free(s);
    whale_model_free(m);
    return status;
}
