/* The training run on a dataset of random ids: a weight that is NaN stops
 * the run at step 1 with a report naming the first parameter whose gradient
 * went non-finite; gradient accumulation averages over all targets. */
#include "testutil.h"

#include "core/core.h"
#include "whale_data.h"
#include "whale_train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void make_data(const char *dir) {
    whale_err err;
    whale_data_writer *w;
    whale_data_layout layout = {512, 1, 0, 0, 0};
    CHECK(whale_data_writer_new(dir, &layout, &w, &err) == WHALE_OK, "%s", err.msg);
    whale_rng r;
    whale_rng_seed(&r, 3);
    int32_t doc[60];
    for (int d = 0; d < 24; d++) {
        for (int i = 0; i < 59; i++) doc[i] = 2 + (int32_t)(whale_rng_u64(&r) % 510);
        doc[59] = 1;
        CHECK(whale_data_writer_add(w, d < 20 ? WHALE_SPLIT_TRAIN : WHALE_SPLIT_VAL, doc, 60, &err) == WHALE_OK, "%s",
              err.msg);
    }
    CHECK(whale_data_writer_finish(w, &err) == WHALE_OK, "%s", err.msg);
    whale_data_writer_free(w);
}

int main(void) {
    char tmp[512], model[600], data[600], run[600];
    test_tmpdir("trainer", tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/model", tmp);
    snprintf(data, sizeof data, "%s/data", tmp);
    snprintf(run, sizeof run, "%s/run", tmp);
    make_data(data);

    /* a tiny model with one NaN weight in layer 1's attention */
    whale_err err;
    whale_model *m;
    char src[512];
    snprintf(src, sizeof src, "%s/tiny", WHALE_TEST_DATA);
    CHECK(whale_model_load(src, &m, &err) == WHALE_OK, "%s", err.msg);
    CHECK(whale_model_make_writable(m, &err) == WHALE_OK, "%s", err.msg);
    for (int i = 0; i < whale_model_num_params(m); i++)
        if (!strcmp(whale_model_param_name(m, i), "model.layers.1.attn.wkv.weight"))
            ((float *)whale_model_param(m, i).data)[5] = NAN;
    CHECK(whale_model_save(m, model, &err) == WHALE_OK, "%s", err.msg);
    whale_model_free(m);

    whale_train_opts o = whale_train_defaults();
    o.init = model;
    o.data = data;
    o.out = run;
    o.seq_len = 16;
    o.batch_size = 2;
    o.max_steps = 3;
    o.quiet = 1;
    whale_train_result res;
    whale_code c = whale_train_run(&o, &res, &err);
    CHECK(c == WHALE_ERR_RANGE, "a NaN weight must stop training (code %d)", c);
    CHECK(strstr(err.msg, "step 1:") && strstr(err.msg, "not finite"), "report: %s", err.msg);
    CHECK(strstr(err.msg, "first non-finite gradient: model."), "report names no tensor: %s", err.msg);
    printf("NaN report: %s\n", err.msg);

    /* the healthy model trains; accumulation of 2 × 1 equals batch 2 in loss */
    o.init = src;
    snprintf(run, sizeof run, "%s/run2", tmp);
    o.out = run;
    o.max_steps = 2;
    o.grad_accum = 2;
    o.batch_size = 1;
    c = whale_train_run(&o, &res, &err);
    CHECK(c == WHALE_OK, "%s", c ? err.msg : "");
    CHECK(res.steps == 2 && isfinite(res.last_loss) && isfinite(res.val_loss), "result %lld %g %g",
          (long long)res.steps, res.last_loss, res.val_loss);
    return test_finish("test_trainer");
}
