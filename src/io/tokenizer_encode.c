/* Encoding: added tokens -> normalizer -> added tokens marked "normalized"
 * -> pre-tokenizer steps -> BPE, in the order Hugging Face's tokenizers
 * applies them. Pieces flow depth-first through the pre-tokenizer steps, so
 * no list of all pieces is ever built and memory stays proportional to the
 * input. */
#include "io/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ BPE */

typedef struct {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;
} bpe_sym;

typedef struct {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
} bpe_cand;

/* Lowest rank first; among equal ranks the leftmost, as Hugging Face does. */
static int cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const bpe_cand *best = &last;
        if (l < m && cand_less(&h[l], best)) s = l, best = &h[l];
        if (r < m && cand_less(&h[r], best)) s = r;
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

static int merge_lookup(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->keys[i]) {
        if (m->keys[i] == key) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
        i = (i + 1) & m->mask;
    }
    return 0;
}

static void push_pair(const whale_tokenizer *t, bpe_sym *sym, int32_t pos, bpe_cand *heap, size_t *nh) {
    int32_t next = sym[pos].next;
    bpe_cand c;
    if (next >= 0 && merge_lookup(&t->merges, sym[pos].id, sym[next].id, &c.rank, &c.merged)) {
        c.pos = pos;
        heap_push(heap, nh, c);
    }
}

static uint64_t piece_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h | 1; /* 0 marks an empty slot */
}

static int append_ids(tok_buf *ids, const int32_t *v, size_t n) {
    return tok_buf_append(ids, v, n * sizeof *v);
}

static void push_sym(bpe_sym *sym, int32_t *ns, int32_t id) {
    sym[*ns].id = id;
    sym[*ns].prev = *ns - 1;
    sym[*ns].next = *ns + 1;
    sym[*ns].alive = 1;
    (*ns)++;
}

/* BPE of one pre-token. */
static whale_code bpe_piece(whale_tokenizer *t, const char *s, size_t n, tok_buf *ids, whale_err *err) {
    if (!n) return WHALE_OK;
    uint64_t h = 0;
    tok_cache_slot *slot = NULL;
    if (n <= TOK_CACHE_MAX_BYTES) {
        if (!t->cache) t->cache = calloc(TOK_CACHE_SLOTS, sizeof *t->cache);
        if (t->cache) {
            h = piece_hash(s, n);
            slot = &t->cache[h & (TOK_CACHE_SLOTS - 1)];
            if (slot->hash == h && slot->klen == n && !memcmp(slot->key, s, n))
                return append_ids(ids, slot->ids, slot->nids) ? WHALE_OK
                                                               : whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        }
    }
    /* whole pieces that are tokens skip the merges when ignore_merges is set */
    if (t->ignore_merges) {
        const char *key = s;
        size_t klen = n;
        if (t->byte_level) {
            t->mapped.len = 0;
            for (size_t i = 0; i < n; i++) {
                int32_t u = t->unit_id[(unsigned char)s[i]];
                const char *tok = u >= 0 ? t->tok[u] : "";
                if (!tok_buf_append(&t->mapped, tok, u >= 0 ? t->tok_len[u] : 0))
                    return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
            }
            key = t->mapped.data;
            klen = t->mapped.len;
        }
        int32_t id = tok_strmap_get(&t->vocab, key, klen);
        if (id >= 0) return append_ids(ids, &id, 1) ? WHALE_OK : whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
    }
    /* scratch: n symbols, heap of at most 3n candidates (n initial pairs
     * plus two new pairs per merge) */
    if (n > t->bpe_cap) {
        size_t cap = n < 256 ? 256 : n;
        if (cap > SIZE_MAX / (sizeof(bpe_sym) + 3 * sizeof(bpe_cand)))
            return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: piece of %zu bytes is too long", n);
        void *p = realloc(t->bpe_scratch, cap * (sizeof(bpe_sym) + 3 * sizeof(bpe_cand)));
        if (!p) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
        t->bpe_scratch = p;
        t->bpe_cap = cap;
    }
    bpe_cand *heap = t->bpe_scratch;
    bpe_sym *sym = (bpe_sym *)(heap + 3 * t->bpe_cap);
    int32_t ns = 0;
    const unsigned char *u = (const unsigned char *)s;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        int32_t id;
        size_t start = i;
        if (t->byte_level) {
            id = t->unit_id[u[i++]];
        } else {
            int k = tok_utf8_valid_len(u + i, n - i);
            if (k <= 0) k = 1;
            id = tok_strmap_get(&t->vocab, s + i, (size_t)k);
            i += (size_t)k;
        }
        if (id >= 0) {
            push_sym(sym, &ns, id);
            last_unk = 0;
            continue;
        }
        if (t->byte_fallback && !t->byte_level) {
            /* each byte of the character as <0xNN>, if the vocabulary has them all */
            int ok = 1;
            for (size_t j = start; j < i; j++) ok &= t->byte_id[u[j]] >= 0;
            for (size_t j = start; ok && j < i; j++) push_sym(sym, &ns, t->byte_id[u[j]]);
            if (ok) {
                last_unk = 0;
                continue;
            }
        }
        /* unk_token (one for a run with fuse_unk); without it the character
         * is dropped, as in Hugging Face */
        if (t->unk_id < 0 || (t->fuse_unk && last_unk)) continue;
        push_sym(sym, &ns, t->unk_id);
        last_unk = 1;
    }
    if (!ns) return WHALE_OK;
    sym[ns - 1].next = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(t, sym, i, heap, &nh);
    while (nh) {
        bpe_cand c = heap_pop(heap, &nh);
        bpe_sym *a = &sym[c.pos];
        if (!a->alive || a->next < 0) continue;
        bpe_sym *b = &sym[a->next];
        uint32_t rank;
        int32_t merged;
        /* stale entry: the pair changed since it was queued */
        if (!merge_lookup(&t->merges, a->id, b->id, &rank, &merged) || merged != c.merged) continue;
        a->id = merged;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0) sym[b->next].prev = c.pos;
        if (a->prev >= 0) push_pair(t, sym, a->prev, heap, &nh);
        push_pair(t, sym, c.pos, heap, &nh);
    }
    size_t start = ids->len / sizeof(int32_t), count = 0;
    for (int32_t i = 0; i >= 0; i = sym[i].next, count++)
        if (!append_ids(ids, &sym[i].id, 1)) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
    if (slot && count <= TOK_CACHE_MAX_IDS) {
        slot->hash = h;
        slot->klen = (uint8_t)n;
        slot->nids = (uint8_t)count;
        memcpy(slot->key, s, n);
        memcpy(slot->ids, (int32_t *)ids->data + start, count * sizeof(int32_t));
    }
    return WHALE_OK;
}

/* ------------------------------------------------------------ pre-tokenizer */

static whale_code pretok(whale_tokenizer *t, int k, const char *s, size_t n, tok_buf *ids, whale_err *err);

/* Folds the stream of (span, is_match) of one Split into pieces, following
 * the behaviours of Hugging Face's SplitDelimiterBehavior. */
typedef struct {
    whale_tokenizer *t;
    int k; /* the step doing the split; pieces go to step k + 1 */
    int behavior;
    const char *s;
    size_t ps, pe;  /* pending piece */
    int have, pend_match, prev_match;
    tok_buf *ids;
    whale_err *err;
} folder;

static whale_code emit(folder *f, size_t a, size_t b) {
    if (a == b) return WHALE_OK; /* empty pieces are dropped */
    return pretok(f->t, f->k + 1, f->s + a, b - a, f->ids, f->err);
}

static whale_code flush_pending(folder *f) {
    whale_code rc = WHALE_OK;
    if (f->have) rc = emit(f, f->ps, f->pe);
    f->have = 0;
    return rc;
}

static whale_code fold(folder *f, size_t a, size_t b, int m) {
    whale_code rc = WHALE_OK;
    switch (f->behavior) {
    case SPLIT_ISOLATED: return emit(f, a, b);
    case SPLIT_REMOVED: return m ? WHALE_OK : emit(f, a, b);
    case SPLIT_MERGED_PREV: /* a match joins the gap before it */
        if (m && !f->prev_match && f->have) {
            f->pe = b;
        } else {
            rc = flush_pending(f);
            f->ps = a, f->pe = b, f->have = 1;
        }
        break;
    case SPLIT_MERGED_NEXT: /* a match joins the gap after it */
        if (f->have && f->pend_match && !m) {
            f->pe = b;
            rc = flush_pending(f);
        } else {
            rc = flush_pending(f);
            f->ps = a, f->pe = b, f->have = 1, f->pend_match = m;
        }
        break;
    case SPLIT_CONTIGUOUS: /* runs of matches (or of gaps) become one piece */
        if (f->have && m == f->prev_match) {
            f->pe = b;
        } else {
            rc = flush_pending(f);
            f->ps = a, f->pe = b, f->have = 1;
        }
        break;
    }
    f->prev_match = m;
    return rc;
}

static whale_code regex_failed(const whale_tokenizer *t, whale_err *err, int rc) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    const char *path = t->path ? t->path : "tokenizer";
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
        rc == PCRE2_ERROR_JIT_STACKLIMIT)
        /* the pattern, not the machine: it backtracks without bound on this text */
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: a pre-tokenizer regex is too costly to match on this text (%s; see docs/security.md)",
                          path, (const char *)msg);
    return whale_errf(err, rc == PCRE2_ERROR_NOMEMORY ? WHALE_ERR_NOMEM : WHALE_ERR_INTERNAL,
                      "%s: pre-tokenizer regex failed: %s", path, (const char *)msg);
}

/* What one encode's regex searches may look at, in bytes of text (the
 * sum over searches of the text each was given): linear in the length, so
 * a pattern that looks far ahead and consumes little stops here, on every
 * machine at the same point (docs/security.md). */
static size_t work_budget(size_t len) { return WHALE_ENCODE_WORK_BASE + WHALE_ENCODE_WORK_PER_BYTE * len; }

static whale_code over_budget(const whale_tokenizer *t, whale_err *err) {
    return whale_errf(err, WHALE_ERR_FORMAT,
                      "%s: a pre-tokenizer regex costs more than linear time on this text (over the encode's "
                      "work budget of %zu bytes searched; see docs/security.md)",
                      t->path ? t->path : "tokenizer", t->work_budget);
}

/* The first window a search is given, in bytes. */
#define SEARCH_WINDOW 32

/* The next match of st->re in s[0..n) at or after from (*found 0: none),
 * looking at as little of the text as the result depends on: the search
 * first gets the next SEARCH_WINDOW bytes, with hard partial matching,
 * which fails rather than decide anything that the bytes beyond the window
 * could change; then twice as many, up to the whole piece, searched as
 * usual. A complete match inside a window is the match the whole piece
 * gives. Every window counts against the encode's work budget before it is
 * searched. */
static whale_code search(whale_tokenizer *t, const tok_step *st, const char *s, size_t n, size_t from, int *found,
                         whale_err *err) {
    for (size_t w = SEARCH_WINDOW;; w *= 2) {
        size_t end = n - from > w ? from + w : n;
        while (end < n && ((unsigned char)s[end] & 0xC0) == 0x80) end++; /* never inside a character */
        t->work += end - from;
        if (t->work > t->work_budget) return over_budget(t, err);
        uint32_t opts = end < n ? PCRE2_PARTIAL_HARD : 0;
        int r = st->jit ? pcre2_jit_match(st->re, (PCRE2_SPTR)s, end, from, opts, t->md, t->mctx)
                        : pcre2_match(st->re, (PCRE2_SPTR)s, end, from, opts | PCRE2_NO_UTF_CHECK, t->md, t->mctx);
        if (end < n && (r == PCRE2_ERROR_PARTIAL || r == PCRE2_ERROR_NOMATCH)) continue; /* a match may start later */
        if (r < 0 && r != PCRE2_ERROR_NOMATCH) return regex_failed(t, err, r);
        *found = r >= 0;
        return WHALE_OK;
    }
}

/* Where the search resumes after an empty match at i: one whole character
 * on, and never inside one. */
static size_t next_char(const char *s, size_t n, size_t i) {
    int k = tok_utf8_valid_len((const unsigned char *)s + i, n - i);
    i += k > 0 ? (size_t)k : 1;
    while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    return i;
}

/* One Split (or the ByteLevel regex) over the piece s[0..n). */
static whale_code split_piece(whale_tokenizer *t, int k, const tok_step *st, const char *s, size_t n,
                              tok_buf *ids, whale_err *err) {
    folder f = {t, k, st->behavior, s, 0, 0, 0, 0, 0, ids, err};
    whale_code rc = WHALE_OK;
    size_t prev = 0, from = 0, last_end = (size_t)-1;
    const int inv = st->invert;
    while (st->re && from <= n) {
        int found = 0;
        if ((rc = search(t, st, s, n, from, &found, err))) return rc;
        if (!found) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me) {
            /* an empty match: the search moves on one character; one right
             * after the previous match is skipped (Oniguruma's iterator) */
            if (me >= n) from = n + 1;
            else from = next_char(s, n, me);
            if (ms == last_end) continue;
        } else {
            from = me;
        }
        last_end = me;
        if (prev != ms && (rc = fold(&f, prev, ms, inv))) return rc;
        if ((rc = fold(&f, ms, me, !inv))) return rc;
        prev = me;
    }
    if (prev != n || n == 0) {
        if ((rc = fold(&f, prev, n, inv))) return rc;
    }
    return flush_pending(&f);
}

static whale_code pretok(whale_tokenizer *t, int k, const char *s, size_t n, tok_buf *ids, whale_err *err) {
    if (k == t->n_steps) return bpe_piece(t, s, n, ids, err);
    const tok_step *st = &t->steps[k];
    if (st->kind == STEP_BYTELEVEL) {
        if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
            /* the last step, so nothing else is using this buffer */
            t->prefixed.len = 0;
            if (!tok_buf_append(&t->prefixed, " ", 1) || !tok_buf_append(&t->prefixed, s, n))
                return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
            s = t->prefixed.data;
            n = t->prefixed.len;
        }
        if (!st->re) return pretok(t, k + 1, s, n, ids, err);
    }
    return split_piece(t, k, st, s, n, ids, err);
}

/* ------------------------------------------------------------ added tokens */

static int is_word_at(const whale_tokenizer *t, const char *s, size_t n, size_t pos, int before) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a, len;
    if (before) {
        if (pos == 0) return 0;
        a = pos - 1;
        while (a > 0 && (u[a] & 0xC0) == 0x80) a--;
        len = pos - a;
    } else {
        if (pos >= n) return 0;
        a = pos;
        len = (size_t)tok_utf8_valid_len(u + pos, n - pos);
    }
    int r = pcre2_match(t->word_re, (PCRE2_SPTR)(s + a), len, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK,
                        t->md, t->mctx);
    return r >= 0;
}

/* Longest added token starting at s[i], or NULL. The set is sorted, so the
 * tokens sharing the first d bytes with the text form a range, and within
 * it the one of length exactly d comes first. */
static const tok_added *added_at(const tok_added_set *set, const char *s, size_t n, size_t i) {
    size_t lo = 0, hi = (size_t)set->n;
    const tok_added *best = NULL;
    for (size_t d = 0;; d++) {
        while (lo < hi && set->tok[lo]->len == d) best = set->tok[lo++];
        if (lo >= hi || i + d >= n) break;
        unsigned char c = (unsigned char)s[i + d];
        size_t a = lo, b = hi;
        while (a < b) { /* first with byte d >= c */
            size_t mid = (a + b) / 2;
            if ((unsigned char)set->tok[mid]->content[d] < c) a = mid + 1;
            else b = mid;
        }
        lo = a;
        b = hi;
        while (a < b) { /* first with byte d > c */
            size_t mid = (a + b) / 2;
            if ((unsigned char)set->tok[mid]->content[d] <= c) a = mid + 1;
            else b = mid;
        }
        hi = a;
    }
    return best;
}

static size_t skip_ws_back(const char *s, size_t pos) {
    while (pos > 0) {
        size_t a = pos - 1;
        while (a > 0 && ((unsigned char)s[a] & 0xC0) == 0x80) a--;
        uint32_t cp;
        tok_utf8_decode((const unsigned char *)s + a, &cp);
        if (!tok_is_white_space(cp)) break;
        pos = a;
    }
    return pos;
}

static size_t skip_ws_fwd(const char *s, size_t n, size_t pos) {
    while (pos < n) {
        uint32_t cp;
        int k = tok_utf8_decode((const unsigned char *)s + pos, &cp);
        if (!tok_is_white_space(cp)) break;
        pos += (size_t)k;
    }
    return pos;
}

typedef whale_code (*segment_fn)(whale_tokenizer *t, const char *s, size_t n, tok_buf *ids, whale_err *err);

/* Split s by the tokens of set: text between matches goes to fn, matches
 * become their ids. */
static whale_code split_added(whale_tokenizer *t, const tok_added_set *set, const char *s, size_t n,
                              segment_fn fn, tok_buf *ids, whale_err *err) {
    size_t done = 0; /* text before this offset is handled */
    whale_code rc;
    for (size_t i = 0; set->n && i < n;) {
        if (!set->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        const tok_added *a = added_at(set, s, n, i);
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + a->len;
        i = stop; /* matches never overlap, kept or not */
        if (a->single_word && (is_word_at(t, s, n, start, 1) || is_word_at(t, s, n, stop, 0))) continue;
        if (a->lstrip) start = skip_ws_back(s, start);
        if (a->rstrip) stop = skip_ws_fwd(s, n, stop);
        if (start < done) start = done;
        if (start > done && (rc = fn(t, s + done, start - done, ids, err))) return rc;
        if (!tok_buf_append(ids, &a->id, sizeof a->id)) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        done = stop;
        if (i < stop) i = stop;
    }
    if (done < n) return fn(t, s + done, n - done, ids, err);
    return WHALE_OK;
}

static whale_code pretok_segment(whale_tokenizer *t, const char *s, size_t n, tok_buf *ids, whale_err *err) {
    return pretok(t, 0, s, n, ids, err);
}

/* Text between non-normalized added tokens: normalize, then match the
 * normalized added tokens in it. */
/* The Replace normalizers, one after another, into t->norm. */
static int replace_all(whale_tokenizer *t, const char *s, size_t n) {
    tok_buf cur = {0};
    for (int r = 0; r < t->n_norm_repl; r++) {
        const tok_replace *rp = &t->norm_repl[r];
        tok_buf o = {0};
        if (!tok_buf_reserve(&o, n)) goto oom;
        for (size_t i = 0; i < n;) {
            int hit = i + rp->plen <= n && !memcmp(s + i, rp->pat, rp->plen);
            if (!(hit ? tok_buf_append(&o, rp->with, rp->wlen) : tok_buf_append(&o, s + i, 1))) {
                free(o.data);
                goto oom;
            }
            i += hit ? rp->plen : 1;
        }
        free(cur.data);
        cur = o;
        s = cur.data;
        n = cur.len;
    }
    free(t->norm.data);
    t->norm = cur;
    return 1;
oom:
    free(cur.data);
    return 0;
}

static whale_code normalized_segment(whale_tokenizer *t, const char *s, size_t n, tok_buf *ids, whale_err *err) {
    if (t->n_norm_repl) {
        if (!replace_all(t, s, n)) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        s = t->norm.data ? t->norm.data : "";
        n = t->norm.len;
    }
    if (t->nfc && !tok_nfc_quick(s, n)) {
        t->norm.len = 0;
        if (!tok_nfc(&t->norm, s, n)) return whale_errf(err, WHALE_ERR_NOMEM, "tokenizer: out of memory");
        s = t->norm.data;
        n = t->norm.len;
    }
    return split_added(t, &t->norm_set, s, n, pretok_segment, ids, err);
}

whale_code tok_encode_valid(whale_tokenizer *t, const char *text, size_t len, tok_buf *ids, whale_err *err) {
    t->work = 0;
    t->work_budget = work_budget(len);
    return split_added(t, &t->raw_set, text, len, normalized_segment, ids, err);
}

void tok_encode_scratch_free(whale_tokenizer *t) {
    free(t->norm.data);
    free(t->prefixed.data);
    free(t->mapped.data);
    free(t->bpe_scratch);
    free(t->cache);
}
