/* whale grad: the gradient of the mean loss for every parameter. */
#include "cli/cli.h"

#include "core/core.h"
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_grad(int argc, char **argv) {
    const char *dir = NULL, *ids_path = NULL, *out = NULL;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            puts("usage: whale grad -m DIR --ids FILE --out GRADS.safetensors [--threads N]\n"
                 "  FILE: JSON array of equal-length arrays of token ids (labels = the ids, shifted).\n"
                 "  writes the gradient of the mean loss for every parameter, F32, under its\n"
                 "  Hugging Face name (zeros where no gradient flows: attn_sink, gate.bias);\n"
                 "  prints {\"loss\": …, \"tokens\": …, \"grad_norm\": …}");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return cli_usage("grad", "%s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--ids")) ids_path = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) {
            if (cli_int("grad", a, v, 1, 1024, &threads)) return 2;
        } else return cli_usage("grad", "unknown option \"%s\"", a);
    }
    if (!dir || !ids_path || !out) return cli_usage("grad", "-m DIR, --ids FILE and --out FILE are required");
    whale_set_threads((int)threads);
    whale_err err;
    whale_model *m = NULL;
    whale_session *s = NULL;
    int32_t *ids = NULL;
    whale_st_item *items = NULL;
    int B, S, status = 0;
    if (whale_model_load(dir, &m, &err) || cli_read_ids_file(ids_path, whale_model_vocab_size(m), &ids, &B, &S, &err))
        goto fail;
    if (S < 2) {
        whale_errf(&err, WHALE_ERR_ARG, "%s: sequences need at least 2 ids to have a target", ids_path);
        goto fail;
    }
    double loss;
    int64_t count;
    if (whale_train_session_new(m, B, S, &s, &err) ||
        whale_session_train_step(s, ids, NULL, NULL, NULL, B, S, 1.0, &loss, &count, &err))
        goto fail;
    int n = whale_model_num_params(m);
    items = calloc((size_t)n, sizeof *items);
    whale_tensor *shapes = calloc((size_t)n, sizeof *shapes);
    if (!items || !shapes) {
        free(shapes);
        whale_errf(&err, WHALE_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        shapes[i] = whale_model_param(m, i);
        items[i] = (whale_st_item){whale_model_param_name(m, i), WHALE_F32, shapes[i].ndim, shapes[i].shape,
                                   whale_session_grad(s, i)};
    }
    whale_code c = whale_st_write(out, items, n, NULL, &err);
    free(shapes);
    if (c) goto fail;
    printf("{\"loss\": %.9g, \"tokens\": %lld, \"grad_norm\": %.9g}\n", loss, (long long)count, whale_grad_norm(s));
    goto out;
fail:
    status = cli_fail(&err);
out:
    free(items);
    free(ids);
    whale_session_free(s);
    whale_model_free(m);
    return status;
}
