/* oneDNN matmul primitives: a small cache of exact-shape and runtime-shape
 * primitives per kind, and the call that runs a product on one. */
#include "kernels/gemm_impl.h"

/* ------------------------------------------------------------ errors */

whale_code gemm_dnnl_fail(whale_err *err, const gemm_call *c, const char *what, dnnl_status_t st) {
    const gemm_key *s = &c->s;
    return whale_errf(err, WHALE_ERR_INTERNAL,
                      "gemm %s M=%d N=%d K=%d lda=%d ldb=%d ldc=%d accumulate=%d: "
                      "oneDNN %s failed: %s (status %d)",
                      gemm_kind_names[s->kind], s->M, s->N, s->K, s->lda, s->ldb, s->ldc, s->acc,
                      what, dnnl_status2str(st), (int)st);
}

/* ------------------------------------------------------------ oneDNN primitives */

/* Memory descriptors of A, B (oneDNN's "weights" [K, N]) and C for a key;
 * -1 fields become runtime values. */
static dnnl_status_t make_mds(const gemm_key *k, dnnl_memory_desc_t md[3]) {
#define DIM(x) ((x) < 0 ? DNNL_RUNTIME_DIM_VAL : (dnnl_dim_t)(x))
    const dnnl_dim_t M = DIM(k->M), N = DIM(k->N), K = DIM(k->K);
    const dnnl_dim_t lda = DIM(k->lda), ldb = DIM(k->ldb), ldc = DIM(k->ldc);
#undef DIM
    dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N};
    dnnl_dims_t a_str = {lda, 1}, b_str = {ldb, 1}, c_str = {ldc, 1};
    /* KIND_NT_Q8 here: W already converted to bf16, the scales applied by oneDNN */
    const dnnl_data_type_t in_type = is_bf16_kind(k->kind) || k->kind == KIND_NT_Q8 ? dnnl_bf16 : dnnl_f32;
    if (layout(k->kind) == KIND_TN) { /* A is stored [K, M] */
        a_str[0] = 1;
        a_str[1] = lda;
    }
    if (layout(k->kind) == KIND_NT) { /* W is stored [N, K] */
        b_str[0] = 1;
        b_str[1] = ldb;
    }
    dnnl_status_t st = dnnl_memory_desc_init_by_strides(&md[0], 2, a_dims, in_type, a_str);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&md[1], 2, b_dims, in_type, b_str);
    if (st == dnnl_success)
        st = dnnl_memory_desc_init_by_strides(&md[2], 2, c_dims, dnnl_f32, c_str);
    return st;
}

void gemm_entry_clear(gemm_entry *e) {
    for (int i = 0; i < 3; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    memset(e, 0, sizeof *e);
}

static whale_code entry_create(whale_gemm *g, const gemm_key *key, const gemm_call *c,
                               gemm_entry *e, whale_err *err) {
    memset(e, 0, sizeof *e);
    dnnl_memory_desc_t md[3];
    dnnl_matmul_desc_t op;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const char *what = "memory_desc_init";
    dnnl_status_t st = make_mds(key, md);
    if (st == dnnl_success) {
        what = "matmul_desc_init";
        st = dnnl_matmul_desc_init(&op, &md[0], &md[1], NULL, &md[2]);
    }
    if (st == dnnl_success) {
        what = "primitive_attr_create";
        st = dnnl_primitive_attr_create(&attr);
    }
    if (st == dnnl_success && key->acc) { /* C += product: a sum post-op */
        what = "post_ops";
        st = dnnl_post_ops_create(&ops);
        if (st == dnnl_success) st = dnnl_post_ops_append_sum(ops, 1.0f);
        if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, ops);
    }
    if (st == dnnl_success && key->kind == KIND_NT_Q8) { /* per-column scales, given per call */
        what = "output_scales";
        st = dnnl_primitive_attr_set_output_scales(attr, 1, 1 << 1, &DNNL_RUNTIME_F32_VAL);
    }
    if (st == dnnl_success) {
        what = "primitive_desc_create";
        st = dnnl_primitive_desc_create(&pd, &op, attr, g->engine, NULL);
    }
    if (st == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            snprintf(e->impl, sizeof e->impl, "%s", impl);
        else
            snprintf(e->impl, sizeof e->impl, "onednn:?");
        what = "primitive_create";
        st = dnnl_primitive_create(&e->prim, pd);
    }
    for (int i = 0; i < 3 && st == dnnl_success && key->M >= 0; i++) {
        what = "memory_create";
        st = dnnl_memory_create(&e->mem[i], &md[i], g->engine, DNNL_MEMORY_NONE);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) {
        gemm_entry_clear(e);
        return gemm_dnnl_fail(err, c, what, st);
    }
    e->key = *key;
    e->used = 1;
    g->stats.created++;
    return WHALE_OK;
}

/* Find or create the primitive for key; evicts the least recently used one
 * when the cache is full. */
static whale_code cache_get(whale_gemm *g, const gemm_key *key, const gemm_call *c,
                            gemm_entry **out, whale_err *err) {
    gemm_entry *free_slot = NULL, *oldest = NULL;
    for (int i = 0; i < WHALE_GEMM_CACHE_CAP; i++) {
        gemm_entry *e = &g->cache[i];
        if (!e->used) {
            if (!free_slot) free_slot = e;
            continue;
        }
        if (!memcmp(&e->key, key, sizeof *key)) {
            g->stats.hits++;
            e->last_use = ++g->tick;
            *out = e;
            return WHALE_OK;
        }
        if (!oldest || e->last_use < oldest->last_use) oldest = e;
    }
    gemm_entry *slot = free_slot;
    if (!slot) {
        gemm_entry_clear(oldest);
        g->stats.evicted++;
        slot = oldest;
    }
    whale_code rc = entry_create(g, key, c, slot, err);
    if (rc) return rc;
    slot->last_use = ++g->tick;
    *out = slot;
    return WHALE_OK;
}

whale_code gemm_dnnl_entry(whale_gemm *g, const gemm_call *c, int runtime, gemm_entry **e, whale_err *err) {
    gemm_key key = c->s;
    if (runtime) key.M = key.N = key.K = key.lda = key.ldb = key.ldc = -1;
    return cache_get(g, &key, c, e, err);
}

dnnl_status_t gemm_dnnl_exec_runtime(const gemm_entry *e, dnnl_engine_t engine, dnnl_stream_t stream,
                                     const gemm_call *c, const char **what) {
    void *ptr[4] = {(void *)c->A, (void *)c->B, c->C, (void *)c->scale};
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    dnnl_memory_desc_t md[4];
    const int n = c->s.kind == KIND_NT_Q8 ? 4 : 3;
    *what = "memory_desc_init";
    dnnl_status_t st = make_mds(&c->s, md);
    if (st == dnnl_success && n == 4) {
        const dnnl_dims_t dims = {c->s.N};
        st = dnnl_memory_desc_init_by_tag(&md[3], 1, dims, dnnl_f32, dnnl_a);
    }
    for (int i = 0; i < n && st == dnnl_success; i++) {
        *what = "memory_create";
        st = dnnl_memory_create(&mem[i], &md[i], engine, ptr[i]);
    }
    if (st == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                                   {DNNL_ARG_WEIGHTS, mem[1]},
                                   {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_ATTR_OUTPUT_SCALES, mem[3]}};
        *what = "primitive_execute";
        st = dnnl_primitive_execute(e->prim, stream, n, args);
    }
    if (st == dnnl_success) {
        *what = "stream_wait";
        st = dnnl_stream_wait(stream);
    }
    for (int i = 0; i < n; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return st;
}

whale_code gemm_dnnl_run(whale_gemm *g, const gemm_call *c, int runtime, whale_err *err) {
    gemm_entry *e;
    whale_code rc = gemm_dnnl_entry(g, c, runtime, &e, err);
    if (rc) return rc;
    g->stats.calls++;
    const char *what = "memory_set_data_handle";
    dnnl_status_t st = dnnl_success;
    if (runtime) /* the shape is only known now: described per call */
        st = gemm_dnnl_exec_runtime(e, g->engine, g->stream, c, &what);
    else {
        void *ptr[3] = {(void *)c->A, (void *)c->B, c->C};
        for (int i = 0; i < 3 && st == dnnl_success; i++) st = dnnl_memory_set_data_handle(e->mem[i], ptr[i]);
        if (st == dnnl_success) {
            dnnl_exec_arg_t args[3] = {
                {DNNL_ARG_SRC, e->mem[0]}, {DNNL_ARG_WEIGHTS, e->mem[1]}, {DNNL_ARG_DST, e->mem[2]}};
            what = "primitive_execute";
            st = dnnl_primitive_execute(e->prim, g->stream, 3, args);
        }
        if (st == dnnl_success) {
            what = "stream_wait";
            st = dnnl_stream_wait(g->stream);
        }
    }
    if (st != dnnl_success) return gemm_dnnl_fail(err, c, what, st);
    memcpy(g->last_impl, e->impl, sizeof g->last_impl);
    return WHALE_OK;
}
