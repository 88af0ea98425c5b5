/* whale export --format gguf: a dense-family checkpoint (qwen2, llama,
 * qwen3), LoRA merged or not, as one GGUF file in the layout llama.cpp's
 * convert_hf_to_gguf.py writes, streamed tensor by tensor (export.c's
 * exporter). */
#include "whale_chat.h"
#include "whale_tokenizer.h"

#include "core/core.h"
#include "io/gguf.h"
#include "io/tokenizer.h" /* the merges, added tokens and pre-tokenizer of a loaded tokenizer */
#include "models/model.h"
#include "train/export.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    exporter x;
    whale_model *skel; /* the config and its parameter table, no weights */
    whale_dense_hparams hp;
    whale_gguf_type *type; /* [x.n] each tensor's GGUF type */
    float *rope_freqs;     /* Llama 3 RoPE: the factors llama.cpp divides each frequency by, or NULL */
    int extra;             /* 1 when rope_freqs is the file's first tensor */
} gguf_export;

/* ------------------------------------------------------------ tensor names */

/* A Hugging Face dense-decoder tensor name as llama.cpp's: 0 when it has none. */
static int gguf_name(const char *hf, char *out, size_t cap) {
    static const char *const top[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
    };
    static const char *const layer[][2] = {
        {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},    {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
        {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"}, {"mlp.gate_proj", "ffn_gate"},
        {"mlp.up_proj", "ffn_up"},        {"mlp.down_proj", "ffn_down"},
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(hf, top[i][0])) return snprintf(out, cap, "%s", top[i][1]) < (int)cap;
    int bid, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &bid, &used) != 1 || !used || bid < 0) return 0;
    const char *rest = hf + used, *dot = strrchr(rest, '.');
    if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return 0;
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        if (strlen(layer[i][0]) == (size_t)(dot - rest) && !strncmp(rest, layer[i][0], (size_t)(dot - rest)))
            return snprintf(out, cap, "blk.%d.%s%s", bid, layer[i][1], dot) < (int)cap;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The converter's choice: norms, biases and 1-D tensors F32; the rest the
 * requested type, F16 for a Q8_0 weight whose rows are no whole blocks. */
static whale_gguf_type tensor_type(const whale_st_entry *e, const char *gname, whale_gguf_dtype want) {
    if (e->ndim <= 1 || ends_with(gname, "_norm.weight") || !ends_with(gname, ".weight")) return GGUF_TYPE_F32;
    if (want == WHALE_GGUF_Q8_0 && e->shape[e->ndim - 1] % WHALE_Q8_0_BLOCK) return GGUF_TYPE_F16;
    return (whale_gguf_type)want;
}

/* ------------------------------------------------------------ checks */

/* Every checkpoint tensor must be a parameter of the config's model with
 * its shape, and every parameter present: the strict binding of a load. */
static whale_code check_tensors(const gguf_export *g, whale_err *err) {
    const whale_model *m = g->skel;
    const char *base = g->x.o->base;
    for (int i = 0; i < g->x.n; i++) {
        const whale_st_entry *e = g->x.t[i].e;
        const whale_param *p = NULL;
        for (int k = 0; k < m->n_params && !p; k++)
            if (!strcmp(m->params[k].name, e->name)) p = &m->params[k];
        if (!p)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor %s is not a parameter of its config.json's model", base,
                              e->name);
        if (p->ndim != e->ndim || memcmp(p->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim))
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: tensor %s has another shape than its config.json gives it",
                              base, e->name);
        if (e->dtype != WHALE_F32 && e->dtype != WHALE_BF16 && e->dtype != WHALE_F16)
            return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: tensor %s is %s: GGUF export reads F32, BF16 or F16",
                              base, e->name, whale_dtype_name(e->dtype));
    }
    if (g->x.n != m->n_params)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: the checkpoint has %d tensors, its config.json's model %d", base,
                          g->x.n, m->n_params);
    return WHALE_OK;
}

/* ------------------------------------------------------------ tensors */

/* Llama 3 RoPE as llama.cpp runs it: inv_freq_j / f_j, with f_j the
 * factor transformers' llama3 rule applies to frequency j. */
static whale_code llama3_factors(gguf_export *g, whale_err *err) {
    const whale_rope *r = &g->hp.rope;
    int half = r->dim / 2;
    if (!(g->rope_freqs = malloc((size_t)half * sizeof(float))))
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", g->x.o->base);
    double old = r->original_max, low = old / r->low_freq_factor, high = old / r->high_freq_factor;
    for (int j = 0; j < half; j++) {
        double wavelen = 2 * M_PI * pow(r->theta, 2.0 * j / r->dim);
        double s = (old / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        g->rope_freqs[j] = (float)(wavelen < high ? 1 : wavelen > low ? r->factor : 1 / ((1 - s) / r->factor + s));
    }
    return WHALE_OK;
}

/* Each tensor's GGUF type, size and row order. */
static void plan_tensors(gguf_export *g) {
    const whale_export_opts *o = g->x.o;
    int llama = !strcmp(g->hp.model_type, "llama");
    for (int i = 0; i < g->x.n; i++) {
        ex_tensor *t = &g->x.t[i];
        char name[256];
        gguf_name(t->e->name, name, sizeof name);
        whale_gguf_type ty = g->type[i] = tensor_type(t->e, name, o->gguf_dtype);
        t->q8 = ty == GGUF_TYPE_Q8_0;
        t->out = ty == GGUF_TYPE_F16 ? WHALE_F16 : ty == GGUF_TYPE_BF16 ? WHALE_BF16 : WHALE_F32;
        if (llama && (strstr(t->e->name, ".self_attn.q_proj.") || strstr(t->e->name, ".self_attn.k_proj.")))
            t->perm_heads = strstr(t->e->name, ".q_proj.") ? g->hp.H : g->hp.Hkv;
        int64_t ne[WHALE_MAX_DIMS];
        for (int d = 0; d < t->e->ndim; d++) ne[d] = t->e->shape[t->e->ndim - 1 - d];
        t->out_bytes = whale_gguf_nbytes(ty, t->e->ndim, ne);
        t->buffered = t->a || t->q8 || t->perm_heads || t->out != t->e->dtype;
    }
}

static void add_tensor_infos(gguf_export *g, whale_gguf *w) {
    if (g->extra) whale_gguf_tensor(w, "rope_freqs.weight", GGUF_TYPE_F32, 1, (int64_t[]){g->hp.rope.dim / 2});
    for (int i = 0; i < g->x.n; i++) {
        const whale_st_entry *e = g->x.t[i].e;
        char name[256];
        int64_t ne[4] = {1, 1, 1, 1};
        gguf_name(e->name, name, sizeof name);
        for (int d = 0; d < e->ndim; d++) ne[d] = e->shape[e->ndim - 1 - d];
        whale_gguf_tensor(w, name, g->type[i], e->ndim ? e->ndim : 1, ne);
    }
}

/* whale_gguf_write's producer: tensor i of the file. */
static const void *produce(void *user, int i, whale_err *err) {
    gguf_export *g = user;
    exporter *x = &g->x;
    if (g->extra && i == 0) return g->rope_freqs;
    const ex_tensor *t = &x->t[i - g->extra];
    free(x->buf);
    x->buf = NULL;
    whale_st_release_pages(x->base);
    whale_st_release_pages(x->ad);
    if (x->o->progress) x->o->progress(x->o->user, i - g->extra, x->n);
    x->values += (int64_t)(t->e->nbytes / whale_dtype_size(t->e->dtype));
    if (!t->buffered) return t->e->data;
    if (!(x->buf = malloc(t->out_bytes))) {
        whale_errf(err, WHALE_ERR_NOMEM, "%s: cannot allocate %zu bytes for %s", x->o->out, t->out_bytes, t->e->name);
        return NULL;
    }
    return export_fill(x, t, x->buf, err) ? NULL : x->buf;
}

/* ------------------------------------------------------------ metadata */

static void arch_u32(whale_gguf *w, const char *arch, const char *key, uint32_t v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    whale_gguf_u32(w, k, v);
}

static void arch_f32(whale_gguf *w, const char *arch, const char *key, double v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    whale_gguf_f32(w, k, (float)v);
}

/* RoPE scaling as the converter records it: linear and yarn as keys,
 * llama3 as the rope_freqs tensor, dynamic not at all (llama.cpp has no
 * dynamic NTK scaling: it runs the unscaled frequencies, which are
 * transformers' within the original window). */
static void rope_scaling(whale_gguf *w, const char *arch, const whale_rope *r) {
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    if (r->type == WHALE_ROPE_LINEAR) {
        whale_gguf_str(w, k, "linear");
        arch_f32(w, arch, "rope.scaling.factor", r->factor);
    } else if (r->type == WHALE_ROPE_YARN) {
        whale_gguf_str(w, k, "yarn");
        arch_f32(w, arch, "rope.scaling.factor", r->factor);
        arch_u32(w, arch, "rope.scaling.original_context_length", (uint32_t)r->original_max);
        if (r->attention_factor > 0) arch_f32(w, arch, "rope.scaling.yarn_attn_factor", r->attention_factor);
        if (r->beta_fast > 0) arch_f32(w, arch, "rope.scaling.yarn_beta_fast", r->beta_fast);
        if (r->beta_slow > 0) arch_f32(w, arch, "rope.scaling.yarn_beta_slow", r->beta_slow);
    }
}

/* llama_ftype of the file: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16. */
static uint32_t file_type(whale_gguf_dtype d) {
    return d == WHALE_GGUF_F32 ? 0 : d == WHALE_GGUF_F16 ? 1 : d == WHALE_GGUF_Q8_0 ? 7 : 32;
}

static void model_metadata(const gguf_export *g, whale_gguf *w) {
    const whale_dense_hparams *hp = &g->hp;
    const char *arch = hp->model_type, *base = g->x.o->base;
    size_t n = strlen(base);
    while (n > 1 && base[n - 1] == '/') n--;
    const char *slash = memrchr(base, '/', n);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(slash ? n - (size_t)(slash + 1 - base) : n), slash ? slash + 1 : base);
    whale_gguf_str(w, "general.architecture", arch);
    whale_gguf_str(w, "general.type", "model");
    whale_gguf_str(w, "general.name", name);
    whale_gguf_u32(w, "general.alignment", WHALE_GGUF_ALIGNMENT);
    whale_gguf_u32(w, "general.file_type", file_type(g->x.o->gguf_dtype));
    whale_gguf_u32(w, "general.quantization_version", 2);
    arch_u32(w, arch, "block_count", (uint32_t)hp->L);
    arch_u32(w, arch, "context_length", (uint32_t)hp->max_pos);
    arch_u32(w, arch, "embedding_length", (uint32_t)hp->D);
    arch_u32(w, arch, "feed_forward_length", (uint32_t)hp->F);
    arch_u32(w, arch, "attention.head_count", (uint32_t)hp->H);
    arch_u32(w, arch, "attention.head_count_kv", (uint32_t)hp->Hkv);
    arch_f32(w, arch, "rope.freq_base", hp->rope.theta);
    arch_f32(w, arch, "attention.layer_norm_rms_epsilon", hp->norm_eps);
    arch_u32(w, arch, "attention.key_length", (uint32_t)hp->Dh);
    arch_u32(w, arch, "attention.value_length", (uint32_t)hp->Dh);
    if (!strcmp(arch, "llama")) {
        arch_u32(w, arch, "vocab_size", (uint32_t)hp->vocab);
        arch_u32(w, arch, "rope.dimension_count", (uint32_t)hp->Dh);
    }
    rope_scaling(w, arch, &hp->rope);
}

/* The converter's rule for added tokens: control when special or when they
 * look like one (<|...|>, <｜...｜>, <pad>, <mask>, <unused...>, ...). */
static int looks_special(const char *s) {
    size_t n = strlen(s);
    static const char *const exact[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(s, exact[i])) return 1;
    return (n >= 4 && !strncmp(s, "<|", 2) && ends_with(s, "|>")) ||
           (n >= 8 && !strncmp(s, "<\xEF\xBD\x9C", 4) && ends_with(s, "\xEF\xBD\x9C>")) ||
           (!strncmp(s, "<unused", 7) && ends_with(s, ">"));
}

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_UNUSED = 5 };

/* tokenizer.ggml.tokens and token_type: one per model id, holes "[PADi]". */
static whale_code token_lists(const whale_tokenizer *tok, int vocab, whale_gguf *w, whale_err *err) {
    int32_t *types = malloc((size_t)vocab * sizeof *types);
    if (!types) return whale_errf(err, WHALE_ERR_NOMEM, "GGUF tokenizer: out of memory");
    whale_gguf_array(w, "tokenizer.ggml.tokens", GGUF_V_STRING, (uint64_t)vocab);
    for (int32_t id = 0; id < vocab; id++) {
        const char *s = whale_tokenizer_id_to_token(tok, id);
        const tok_added *a = s ? tok_added_of(tok, id) : NULL;
        char hole[32], *user = NULL;
        if (!s) snprintf(hole, sizeof hole, "[PAD%d]", id), s = hole;
        types[id] = s == hole ? TOKEN_UNUSED : !a ? TOKEN_NORMAL : a->special || looks_special(s) ? TOKEN_CONTROL
                                                                                                : TOKEN_USER_DEFINED;
        if (types[id] == TOKEN_USER_DEFINED && strstr(s, "\xE2\x96\x81") && (user = strdup(s))) {
            /* pre-normalised spaces: "▁" is " " in a user-defined token */
            char *p, *q = user;
            for (p = user; *p;) {
                if (!strncmp(p, "\xE2\x96\x81", 3)) *q++ = ' ', p += 3;
                else *q++ = *p++;
            }
            *q = 0;
            s = user;
        }
        whale_gguf_elem_str(w, s, strlen(s));
        free(user);
    }
    whale_gguf_array(w, "tokenizer.ggml.token_type", GGUF_V_INT32, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) whale_gguf_elem_i32(w, types[i]);
    free(types);
    return WHALE_OK;
}

static whale_code merge_list(const whale_tokenizer *tok, whale_gguf *w, whale_err *err) {
    int32_t *pairs;
    int n;
    whale_code c = tok_merge_pairs(tok, &pairs, &n, err);
    if (c) return c;
    char *line = NULL;
    size_t cap = 0;
    whale_gguf_array(w, "tokenizer.ggml.merges", GGUF_V_STRING, (uint64_t)n);
    for (int i = 0; i < n && !c; i++) {
        const char *l = whale_tokenizer_id_to_token(tok, pairs[2 * i]), *r = whale_tokenizer_id_to_token(tok, pairs[2 * i + 1]);
        size_t need = strlen(l) + strlen(r) + 2;
        if (need > cap) {
            char *nl = realloc(line, cap = 2 * need);
            if (!nl) c = whale_errf(err, WHALE_ERR_NOMEM, "GGUF tokenizer: out of memory");
            else line = nl;
        }
        if (!c) whale_gguf_elem_str(w, line, (size_t)snprintf(line, cap, "%s %s", l, r));
    }
    free(line);
    free(pairs);
    return c;
}

/* bos/eos/padding ids: tokenizer_config.json's tokens, else config.json's
 * *_token_id (gguf-py's SpecialVocab order). */
static void special_ids(const whale_tokenizer *tok, const char *base, int vocab, whale_gguf *w) {
    static const char *const keys[3] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.padding_token_id"};
    static const char *const cfg_keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
    char path[4200];
    cJSON *cfg = NULL;
    whale_err ignored;
    snprintf(path, sizeof path, "%s/config.json", base);
    if (whale_read_json_object(path, &cfg, &ignored)) cfg = NULL;
    for (int r = 0; r < 3; r++) {
        int32_t id = whale_tokenizer_role_id(tok, (whale_token_role)r);
        const cJSON *v = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, cfg_keys[r]) : NULL;
        if (id < 0 && cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < vocab) id = (int32_t)v->valuedouble;
        if (id >= 0) whale_gguf_u32(w, keys[r], (uint32_t)id);
    }
    cJSON_Delete(cfg);
}

static whale_code tokenizer_metadata(const char *base, int vocab, whale_gguf *w, whale_err *err) {
    whale_tokenizer *tok = NULL;
    whale_chat_template *ct = NULL;
    whale_code c = whale_tokenizer_load(base, &tok, err);
    if (c) return c;
    const char *pre = tok_llama_pre(tok);
    if (!pre)
        c = whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s/tokenizer.json: its pre-tokenizer is none of those llama.cpp "
                       "names (qwen2, llama-bpe, deepseek-v3, gpt-2)", base);
    else if (!tok->byte_level || whale_tokenizer_vocab_size(tok) > vocab)
        c = whale_errf(err, WHALE_ERR_FORMAT, "%s/tokenizer.json: %s", base, !tok->byte_level ? "not a byte-level BPE"
                       : "it has more ids than the model's vocab_size");
    if (c) goto done;
    whale_gguf_str(w, "tokenizer.ggml.model", "gpt2");
    whale_gguf_str(w, "tokenizer.ggml.pre", pre);
    if ((c = token_lists(tok, vocab, w, err)) || (c = merge_list(tok, w, err))) goto done;
    special_ids(tok, base, vocab, w);
    whale_gguf_bool(w, "tokenizer.ggml.add_bos_token", tok->n_prefix > 0);
    whale_gguf_bool(w, "tokenizer.ggml.add_eos_token", tok->n_suffix > 0);
    if ((c = whale_chat_template_load(base, NULL, &ct, err))) goto done;
    if (whale_chat_template_source(ct)) whale_gguf_str(w, "tokenizer.chat_template", whale_chat_template_source(ct));
done:
    whale_chat_template_free(ct);
    whale_tokenizer_free(tok);
    return c;
}

/* ------------------------------------------------------------ export */

static void gguf_close(gguf_export *g) {
    export_close(&g->x);
    whale_model_free(g->skel);
    free(g->type);
    free(g->rope_freqs);
}

static whale_code gguf_open(const whale_export_opts *o, gguf_export *g, whale_err *err) {
    memset(g, 0, sizeof *g);
    whale_code c = whale_model_skeleton(o->base, &g->skel, err);
    if (c) return c;
    if (!strcmp(whale_model_family(g->skel), "nanowhale"))
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: GGUF export writes llama.cpp's qwen2, llama and qwen3 "
                          "architectures; model_type deepseek_v4 (nanowhale) has no mapping to one", o->base);
    if ((c = whale_dense_hparams_of(g->skel, &g->hp, err)) || (c = export_open(o, &g->x, err)) ||
        (c = check_tensors(g, err)))
        return c;
    if (!(g->type = calloc((size_t)(g->x.n ? g->x.n : 1), sizeof *g->type)))
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", o->base);
    for (int i = 0; i < g->x.n; i++) {
        char name[256];
        if (!gguf_name(g->x.t[i].e->name, name, sizeof name))
            return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: tensor %s has no llama.cpp name", o->base,
                              g->x.t[i].e->name);
    }
    g->extra = g->hp.rope.type == WHALE_ROPE_LLAMA3;
    if (g->extra && (c = llama3_factors(g, err))) return c;
    plan_tensors(g);
    return WHALE_OK;
}

whale_code whale_export_gguf_plan(const whale_export_opts *o, whale_export_stats *st, whale_err *err) {
    gguf_export g;
    whale_code c = gguf_open(o, &g, err);
    if (!c) export_plan(&g.x, st);
    gguf_close(&g);
    return c;
}

whale_code whale_export_gguf(const whale_export_opts *o, whale_export_stats *st, whale_err *err) {
    gguf_export g;
    whale_gguf *w = NULL;
    whale_code c = gguf_open(o, &g, err);
    if (c) goto done;
    export_plan(&g.x, st);
    double limit = export_memory_limit(o);
    if (limit > 0 && (double)st->planned > limit) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: exporting needs an estimated %.2f GiB but %s is %.2f GiB", o->base,
                       st->planned / 1073741824.0, o->memory_limit > 0 ? "the memory limit" : "the machine's memory",
                       limit / 1073741824.0);
        goto done;
    }
    if (!(w = whale_gguf_new())) {
        c = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", o->out);
        goto done;
    }
    model_metadata(&g, w);
    if ((c = tokenizer_metadata(o->base, g.hp.vocab, w, err))) goto done;
    add_tensor_infos(&g, w);
    if ((c = whale_gguf_write(w, o->out, produce, &g, err))) goto done;
    if (o->progress) o->progress(o->user, g.x.n, g.x.n);
    st->values = g.x.values;
    st->overflow = g.x.overflow;
    st->tensors = whale_gguf_tensor_count(w);
done:
    whale_gguf_free(w);
    gguf_close(&g);
    return c;
}
