/* Training data: token shards (writer and `whale data prepare`) and the
 * loader that cuts them into training windows. The format and every rule
 * are in include/whale_data.h and docs/data.md. */
#include "whale_data.h"

#include "core/core.h"
#include "whale_tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EOS_NONE 0xFFFFFFFFu

/* ---------------------------------------------------------------- helpers */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* dir + "/" + name, without doubling a trailing slash (messages quote it). */
static char *join_path(const char *dir, const char *name) {
    size_t dl = strlen(dir), n = dl + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", name);
    return p;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

static int only_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return 0;
    return 1;
}

/* splitmix64's finaliser: a good 64-bit mixing function. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The tokenizer.json a tokenizer argument names (a directory or the file). */
static char *tokenizer_json_path(const char *tokenizer) {
    struct stat st;
    if (stat(tokenizer, &st) == 0 && S_ISDIR(st.st_mode)) return join_path(tokenizer, "tokenizer.json");
    return strdup(tokenizer);
}

static whale_code fingerprint_file(const char *path, uint64_t *fp, whale_err *err) {
    FILE *f;
    whale_code oc = whale_fopen_regular(path, &f, NULL, err);
    if (oc) return oc;
    uint64_t h = 0xcbf29ce484222325ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
    int bad = ferror(f);
    fclose(f);
    if (bad) return whale_errf(err, WHALE_ERR_IO, "%s: read failed", path);
    *fp = h;
    return WHALE_OK;
}

whale_code whale_data_fingerprint(const char *tokenizer, uint64_t *fp, whale_err *err) {
    if (!tokenizer || !fp) return whale_errf(err, WHALE_ERR_ARG, "whale_data_fingerprint: NULL argument");
    char *path = tokenizer_json_path(tokenizer);
    if (!path) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", tokenizer);
    whale_code rc = fingerprint_file(path, fp, err);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------- writer */

typedef struct {
    char *path, *tmp; /* final name, and the name it is written under */
    FILE *f;          /* open while documents are added */
    uint64_t tokens, docs;
    uint64_t *offsets; /* docs + 1 entries */
    size_t cap;
    int renamed;
} shard_out;

struct whale_data_writer {
    char *dir;
    whale_data_layout lay;
    int token_bytes;
    int created_dir, finished;
    shard_out *train;
    int n_train, cap_train;
    shard_out val;
    unsigned char *buf; /* ids converted to the file's integers */
    size_t buf_cap;
};

static whale_code shard_open(whale_data_writer *w, shard_out *s, const char *name, whale_err *err) {
    memset(s, 0, sizeof *s);
    s->path = join_path(w->dir, name);
    s->tmp = s->path ? malloc(strlen(s->path) + 5) : NULL;
    s->cap = 1024;
    s->offsets = malloc(s->cap * sizeof *s->offsets);
    if (!s->tmp || !s->offsets) return whale_errf(err, WHALE_ERR_NOMEM, "%s/%s: out of memory", w->dir, name);
    sprintf(s->tmp, "%s.tmp", s->path);
    s->offsets[0] = 0;
    s->f = fopen(s->tmp, "wb");
    if (!s->f) return whale_errf(err, WHALE_ERR_IO, "%s: cannot create: %s", s->path, strerror(errno));
    setvbuf(s->f, NULL, _IOFBF, 1 << 20); /* shards are large and written front to back */
    /* the header is written last, when the counts are known */
    static const unsigned char zeros[WHALE_DATA_HEADER_BYTES];
    if (fwrite(zeros, 1, sizeof zeros, s->f) != sizeof zeros)
        return whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
    return WHALE_OK;
}

static whale_code shard_append(whale_data_writer *w, shard_out *s, const int32_t *ids, size_t n, whale_err *err) {
    size_t need = n * (size_t)w->token_bytes;
    if (need > w->buf_cap) {
        unsigned char *b = realloc(w->buf, need);
        if (!b) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory for a document of %zu tokens", s->path, n);
        w->buf = b;
        w->buf_cap = need;
    }
    if (w->token_bytes == 2)
        for (size_t i = 0; i < n; i++) w->buf[2 * i] = (unsigned char)ids[i], w->buf[2 * i + 1] = (unsigned char)(ids[i] >> 8);
    else
        for (size_t i = 0; i < n; i++) put_u32(w->buf + 4 * i, (uint32_t)ids[i]);
    if (fwrite(w->buf, 1, need, s->f) != need)
        return whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
    if (s->docs + 2 > s->cap) {
        uint64_t *o = realloc(s->offsets, 2 * s->cap * sizeof *o);
        if (!o) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", s->path);
        s->offsets = o;
        s->cap *= 2;
    }
    s->tokens += n;
    s->offsets[++s->docs] = s->tokens;
    return WHALE_OK;
}

/* Document index, then the header at the front; fsync; keep the temp name. */
static whale_code shard_close(whale_data_writer *w, shard_out *s, whale_err *err) {
    unsigned char b[8];
    int ok = 1;
    for (uint64_t i = 0; ok && i <= s->docs; i++) {
        put_u64(b, s->offsets[i]);
        ok = fwrite(b, 1, 8, s->f) == 8;
    }
    unsigned char h[WHALE_DATA_HEADER_BYTES] = {0};
    memcpy(h, WHALE_DATA_MAGIC, 8);
    put_u32(h + 8, WHALE_DATA_VERSION);
    put_u32(h + 12, (uint32_t)w->token_bytes);
    put_u32(h + 16, (uint32_t)w->lay.vocab_size);
    put_u32(h + 20, w->lay.eos_id < 0 ? EOS_NONE : (uint32_t)w->lay.eos_id);
    put_u64(h + 24, s->tokens);
    put_u64(h + 32, s->docs);
    put_u64(h + 40, w->lay.fingerprint);
    ok = ok && fflush(s->f) == 0 && fseek(s->f, 0, SEEK_SET) == 0 && fwrite(h, 1, sizeof h, s->f) == sizeof h &&
         fflush(s->f) == 0 && fsync(fileno(s->f)) == 0;
    int e = ok ? 0 : errno;
    if (fclose(s->f) != 0 && ok) ok = 0, e = errno;
    s->f = NULL;
    if (!ok) return whale_errf(err, WHALE_ERR_IO, "%s: write failed: %s", s->path, strerror(e));
    return WHALE_OK;
}

/* Free s; unless keep, remove its file too (under whichever name it has). */
static void shard_discard(shard_out *s, int keep) {
    if (s->f) fclose(s->f);
    if (!keep && s->tmp && !s->renamed) unlink(s->tmp);
    if (!keep && s->path && s->renamed) unlink(s->path);
    free(s->path);
    free(s->tmp);
    free(s->offsets);
    memset(s, 0, sizeof *s);
}

static whale_code open_train_shard(whale_data_writer *w, whale_err *err) {
    if (w->n_train == w->cap_train) {
        int cap = w->cap_train ? 2 * w->cap_train : 8;
        shard_out *t = realloc(w->train, (size_t)cap * sizeof *t);
        if (!t) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", w->dir);
        w->train = t;
        w->cap_train = cap;
    }
    char name[32];
    snprintf(name, sizeof name, "train-%05d.bin", w->n_train);
    return shard_open(w, &w->train[w->n_train++], name, err);
}

whale_code whale_data_writer_new(const char *dir, const whale_data_layout *lay, whale_data_writer **out,
                                 whale_err *err) {
    *out = NULL;
    if (!dir || !lay) return whale_errf(err, WHALE_ERR_ARG, "whale_data_writer_new: NULL argument");
    if (lay->vocab_size < 1) return whale_errf(err, WHALE_ERR_ARG, "%s: vocabulary size %d must be positive", dir, lay->vocab_size);
    if (lay->eos_id < -1 || lay->eos_id >= lay->vocab_size)
        return whale_errf(err, WHALE_ERR_ARG, "%s: EOS id %d is outside the vocabulary of %d", dir, (int)lay->eos_id,
                          lay->vocab_size);
    if (lay->shard_tokens < 0) return whale_errf(err, WHALE_ERR_ARG, "%s: shard size must be positive", dir);
    whale_data_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", dir);
    }
    w->lay = *lay;
    if (!w->lay.shard_tokens) w->lay.shard_tokens = WHALE_DATA_DEFAULT_SHARD_TOKENS;
    w->token_bytes = lay->vocab_size <= 65536 ? 2 : 4;
    struct stat st;
    w->created_dir = stat(dir, &st) != 0;
    whale_code rc = whale_mkdir(dir, err);
    if (rc) {
        w->created_dir = 0;
        whale_data_writer_free(w);
        return rc;
    }
    char *meta = join_path(dir, "meta.json");
    int exists = meta && stat(meta, &st) == 0;
    if (exists && !lay->overwrite) rc = whale_errf(err, WHALE_ERR_ARG, "%s: a dataset is already there (overwrite to replace it)", meta);
    free(meta);
    /* both files are created now so an unwritable directory fails early */
    if (!rc) rc = open_train_shard(w, err);
    if (!rc) rc = shard_open(w, &w->val, "val.bin", err);
    if (rc) {
        whale_data_writer_free(w);
        return rc;
    }
    *out = w;
    return WHALE_OK;
}

whale_code whale_data_writer_add(whale_data_writer *w, whale_split split, const int32_t *ids, int64_t n,
                                 whale_err *err) {
    if (w->finished) return whale_errf(err, WHALE_ERR_ARG, "%s: the dataset is already finished", w->dir);
    if (split != WHALE_SPLIT_TRAIN && split != WHALE_SPLIT_VAL)
        return whale_errf(err, WHALE_ERR_ARG, "%s: unknown split %d", w->dir, (int)split);
    if (n < 1 || !ids) return whale_errf(err, WHALE_ERR_ARG, "%s: a document needs at least one token", w->dir);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->lay.vocab_size)
            return whale_errf(err, WHALE_ERR_RANGE, "%s: token id %d (position %" PRId64 " of a document) is outside the vocabulary of %d",
                              w->dir, (int)ids[i], i, w->lay.vocab_size);
    shard_out *s = &w->val;
    if (split == WHALE_SPLIT_TRAIN) {
        s = &w->train[w->n_train - 1];
        /* split only between documents; an oversized document gets its own shard */
        if (s->tokens > 0 && s->tokens + (uint64_t)n > (uint64_t)w->lay.shard_tokens) {
            whale_code rc = shard_close(w, s, err);
            if (!rc) rc = open_train_shard(w, err);
            if (rc) return rc;
            s = &w->train[w->n_train - 1];
        }
    }
    return shard_append(w, s, ids, (size_t)n, err);
}

static cJSON *split_json(const shard_out *s, int n) {
    cJSON *o = cJSON_CreateObject(), *list = cJSON_CreateArray();
    double tokens = 0, docs = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        const char *slash = strrchr(s[i].path, '/');
        cJSON_AddStringToObject(e, "file", slash ? slash + 1 : s[i].path);
        cJSON_AddNumberToObject(e, "tokens", (double)s[i].tokens);
        cJSON_AddNumberToObject(e, "documents", (double)s[i].docs);
        cJSON_AddItemToArray(list, e);
        tokens += (double)s[i].tokens;
        docs += (double)s[i].docs;
    }
    cJSON_AddNumberToObject(o, "tokens", tokens);
    cJSON_AddNumberToObject(o, "documents", docs);
    cJSON_AddItemToObject(o, "shards", list);
    return o;
}

/* Shards under their final names first, meta.json last: a directory with a
 * meta.json always has the shards it lists. `prepare` (owned) is added to
 * meta.json as is. */
static whale_code writer_finish(whale_data_writer *w, cJSON *prepare, whale_err *err) {
    whale_code rc = WHALE_OK;
    if (w->finished) rc = whale_errf(err, WHALE_ERR_ARG, "%s: the dataset is already finished", w->dir);
    if (!rc) rc = shard_close(w, &w->train[w->n_train - 1], err);
    if (!rc) rc = shard_close(w, &w->val, err);
    char *meta = join_path(w->dir, "meta.json");
    if (!rc && !meta) rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", w->dir);
    /* an old meta.json must not describe new shards, even after a crash */
    if (!rc && w->lay.overwrite && unlink(meta) != 0 && errno != ENOENT)
        rc = whale_errf(err, WHALE_ERR_IO, "%s: cannot remove: %s", meta, strerror(errno));
    for (int i = 0; !rc && i <= w->n_train; i++) {
        shard_out *s = i < w->n_train ? &w->train[i] : &w->val;
        if (rename(s->tmp, s->path) != 0) rc = whale_errf(err, WHALE_ERR_IO, "%s: rename failed: %s", s->path, strerror(errno));
        else s->renamed = 1;
    }
    if (!rc) {
        cJSON *root = cJSON_CreateObject();
        char fp[24];
        snprintf(fp, sizeof fp, "%016" PRIx64, w->lay.fingerprint);
        cJSON_AddStringToObject(root, "format", "whale-tokens");
        cJSON_AddNumberToObject(root, "version", WHALE_DATA_VERSION);
        cJSON_AddNumberToObject(root, "vocab_size", w->lay.vocab_size);
        cJSON_AddNumberToObject(root, "eos_id", w->lay.eos_id);
        cJSON_AddStringToObject(root, "tokenizer_fingerprint", fp);
        cJSON_AddNumberToObject(root, "token_bytes", w->token_bytes);
        cJSON *splits = cJSON_AddObjectToObject(root, "splits");
        cJSON_AddItemToObject(splits, "train", split_json(w->train, w->n_train));
        cJSON_AddItemToObject(splits, "val", split_json(&w->val, 1));
        if (prepare) cJSON_AddItemToObject(root, "prepare", prepare);
        prepare = NULL;
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        if (!text) rc = whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", meta);
        else rc = whale_write_file_atomic(meta, text, strlen(text), err);
        free(text);
    }
    cJSON_Delete(prepare);
    if (!rc) {
        w->finished = 1;
        /* a previous, larger dataset may have left higher-numbered shards */
        for (int i = w->n_train;; i++) {
            char name[32];
            snprintf(name, sizeof name, "train-%05d.bin", i);
            char *p = join_path(w->dir, name);
            int gone = !p || unlink(p) != 0;
            free(p);
            if (gone) break;
        }
    }
    free(meta);
    return rc;
}

whale_code whale_data_writer_finish(whale_data_writer *w, whale_err *err) { return writer_finish(w, NULL, err); }

void whale_data_writer_free(whale_data_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_train; i++) shard_discard(&w->train[i], w->finished);
    shard_discard(&w->val, w->finished);
    if (!w->finished && w->created_dir) rmdir(w->dir);
    free(w->train);
    free(w->buf);
    free(w->dir);
    free(w);
}

/* ---------------------------------------------------------------- prepare */

/* Everything one prepare run shares. */
typedef struct {
    const whale_data_prepare_opts *o; /* defaults filled in */
    whale_data_prepare_stats *st;
    int counting;        /* pass 1 counts dropped and skipped documents; pass 2 meets them again */
    int64_t *per_input;  /* documents in each input (pass 1) */
    int64_t total, total_bytes, n_val;
    int32_t *tmpl;       /* what add_special puts around an empty text */
    int n_tmpl;
    int32_t eos;
    int append_eos;
    whale_tokenizer **toks; /* one per thread: encode keeps scratch state */
    int threads;
    whale_data_writer *w;
    double t0, last_report;
} prep;

/* One input file, mapped, handing out its documents in order. */
typedef struct {
    const char *path;
    int jsonl;
    const char *data;
    size_t size, pos, line;
    int whole_done;
    cJSON *rec; /* the JSONL record whose text was handed out last */
} reader;

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static whale_code reader_open(reader *r, const char *path, whale_err *err) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->jsonl = has_suffix(path, ".jsonl");
    int fd;
    uint64_t size;
    whale_code rc = whale_open_regular(path, &fd, &size, err);
    if (rc) return rc;
    if (size > SIZE_MAX) rc = whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: file too large to map", path);
    else if (size > 0) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = whale_errf(err, WHALE_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        } else {
            madvise(m, (size_t)size, MADV_SEQUENTIAL);
            r->data = m;
            r->size = (size_t)size;
        }
    }
    close(fd);
    return rc;
}

static void reader_close(reader *r) {
    if (r->data) munmap((void *)r->data, r->size);
    cJSON_Delete(r->rec);
    r->data = NULL;
    r->rec = NULL;
}

/* Next line: [*s, *s + *n) without its \n; returns 0 at the end. */
static int next_line(reader *r, const char **s, size_t *n) {
    if (r->pos >= r->size) return 0;
    const char *p = r->data + r->pos;
    const char *nl = memchr(p, '\n', r->size - r->pos);
    *s = p;
    *n = nl ? (size_t)(nl - p) : r->size - r->pos;
    r->pos += *n + (nl != NULL);
    r->line++;
    return 1;
}

/* A JSONL line that is not a usable record: an error, or counted and
 * passed over with skip_bad_records. */
static whale_code bad_record(prep *p, reader *r, const char *msg, whale_err *err) {
    if (!p->o->skip_bad_records) return whale_errf(err, WHALE_ERR_FORMAT, "%s:%zu: %s", r->path, r->line, msg);
    if (p->counting && p->st->bad_records++ == 0)
        snprintf(p->st->first_bad, sizeof p->st->first_bad, "%s:%zu: %s", r->path, r->line, msg);
    return WHALE_OK;
}

/* The text of the next JSONL record (*text = NULL for a line to pass over). */
static whale_code jsonl_record(prep *p, reader *r, const char *s, size_t n, const char **text, whale_err *err) {
    *text = NULL;
    if (only_space(s, n)) return WHALE_OK; /* blank lines are not records */
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    char msg[400];
    if (!j) {
        snprintf(msg, sizeof msg, "invalid JSON (column %zu)", end && end >= s ? (size_t)(end - s) + 1 : (size_t)1);
        return bad_record(p, r, msg, err);
    }
    while (end && end < s + n && is_space(*end)) end++;
    const char *field = p->o->text_field;
    const cJSON *f = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, field) : NULL;
    if (end != s + n) snprintf(msg, sizeof msg, "text after the JSON value");
    else if (!cJSON_IsObject(j)) snprintf(msg, sizeof msg, "expected a JSON object");
    else if (!f) snprintf(msg, sizeof msg, "no field \"%.300s\"", field);
    else if (!cJSON_IsString(f)) snprintf(msg, sizeof msg, "field \"%.300s\" is not a string", field);
    else {
        r->rec = j; /* keeps the text alive until the next record */
        *text = f->valuestring;
        return WHALE_OK;
    }
    cJSON_Delete(j);
    return bad_record(p, r, msg, err);
}

/* The next document of r (*text = NULL at the end). Empty documents and
 * skipped records are passed over here. */
static whale_code reader_next(prep *p, reader *r, const char **text, size_t *len, whale_err *err) {
    *text = NULL;
    for (;;) {
        const char *s, *l;
        size_t n, ln;
        if (r->jsonl) {
            cJSON_Delete(r->rec);
            r->rec = NULL;
            if (!next_line(r, &l, &ln)) return WHALE_OK;
            whale_code rc = jsonl_record(p, r, l, ln, &s, err);
            if (rc) return rc;
            if (!s) continue;
            n = strlen(s); /* cJSON strings end at the first NUL */
        } else if (p->o->doc_split == WHALE_DOC_LINE) {
            if (!next_line(r, &s, &n)) return WHALE_OK;
            if (n && s[n - 1] == '\r') n--;
        } else if (p->o->doc_split == WHALE_DOC_BLANK) {
            do { /* blank lines before the paragraph */
                if (!next_line(r, &l, &ln)) return WHALE_OK;
            } while (only_space(l, ln));
            s = l;
            do { /* up to the end of its last non-blank line */
                if (ln && l[ln - 1] == '\r') ln--;
                n = (size_t)(l + ln - s);
            } while (next_line(r, &l, &ln) && !only_space(l, ln));
        } else { /* the whole file */
            if (r->whole_done) return WHALE_OK;
            r->whole_done = 1;
            s = r->size ? r->data : "";
            n = r->size;
        }
        if (!only_space(s, n)) {
            *text = s;
            *len = n;
            return WHALE_OK;
        }
        if (p->counting) p->st->empty_documents++;
    }
}

/* Pass 1: find, check and count the documents, so that the validation
 * documents can be picked while streaming in pass 2. */
static whale_code scan_inputs(prep *p, whale_err *err) {
    const whale_data_prepare_opts *o = p->o;
    p->counting = 1;
    whale_code rc = WHALE_OK;
    for (int i = 0; !rc && i < o->n_inputs; i++) {
        reader r;
        rc = reader_open(&r, o->inputs[i], err);
        const char *text;
        size_t len;
        while (!rc && !(rc = reader_next(p, &r, &text, &len, err)) && text) {
            p->per_input[i]++;
            p->total_bytes += (int64_t)len;
        }
        p->total += p->per_input[i];
        reader_close(&r);
    }
    p->counting = 0;
    if (rc || p->total > 0) return rc;
    char why[128];
    snprintf(why, sizeof why, "%" PRId64 " empty documents, %" PRId64 " bad records skipped", p->st->empty_documents,
             p->st->bad_records);
    if (o->n_inputs == 1) return whale_errf(err, WHALE_ERR_FORMAT, "%s: no documents (%s)", o->inputs[0], why);
    return whale_errf(err, WHALE_ERR_FORMAT, "no documents in the %d inputs (%s)", o->n_inputs, why);
}

/* At least one validation document when there are two or more (unless a
 * fraction of 0 or val_docs 0 asks for none); train keeps at least one. */
static whale_code count_val(prep *p, whale_err *err) {
    const whale_data_prepare_opts *o = p->o;
    if (o->val_docs >= 0) {
        if (o->val_docs > 0 && o->val_docs > p->total - 1)
            return whale_errf(err, WHALE_ERR_ARG,
                              "%" PRId64 " validation documents asked for, but the corpus has %" PRId64
                              " (train needs at least one)",
                              o->val_docs, p->total);
        p->n_val = o->val_docs;
        return WHALE_OK;
    }
    int64_t n = o->val_fraction > 0 ? (int64_t)(o->val_fraction * (double)p->total + 0.5) : 0;
    if (o->val_fraction > 0 && n < 1) n = 1;
    if (n > p->total - 1) n = p->total - 1;
    p->n_val = n;
    return WHALE_OK;
}

/* Documents waiting to be tokenized together (their text copied, so the
 * input they came from can be unmapped). */
typedef struct {
    char *text;
    size_t len, cap;
    size_t *off, *dlen;
    unsigned char *val;
    int32_t **ids;
    int *n;
    int count;
} doc_batch;

enum { BATCH_DOCS = 4096, BATCH_BYTES = 8 << 20 };

static int batch_init(doc_batch *b) {
    memset(b, 0, sizeof *b);
    b->cap = BATCH_BYTES;
    b->text = malloc(b->cap);
    b->off = malloc(BATCH_DOCS * sizeof *b->off);
    b->dlen = malloc(BATCH_DOCS * sizeof *b->dlen);
    b->val = malloc(BATCH_DOCS);
    b->ids = calloc(BATCH_DOCS, sizeof *b->ids);
    b->n = malloc(BATCH_DOCS * sizeof *b->n);
    return b->text && b->off && b->dlen && b->val && b->ids && b->n;
}

static void batch_clear(doc_batch *b) {
    for (int i = 0; i < b->count; i++) {
        free(b->ids[i]);
        b->ids[i] = NULL;
    }
    b->count = 0;
    b->len = 0;
}

static void batch_free(doc_batch *b) {
    if (b->ids) batch_clear(b);
    free(b->text);
    free(b->off);
    free(b->dlen);
    free(b->val);
    free(b->ids);
    free(b->n);
}

/* Tokenize the batch in parallel, then write its documents in order. */
static whale_code batch_flush(prep *p, doc_batch *b, whale_err *err) {
    if (b->count == 0) return WHALE_OK;
    int fail_at = INT_MAX;
    whale_err first = {WHALE_OK, ""};
    int nt = p->threads < b->count ? p->threads : b->count;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 8) if (nt > 1)
    for (int i = 0; i < b->count; i++) {
        whale_err e;
        if (whale_tokenizer_encode(p->toks[omp_get_thread_num()], b->text + b->off[i], b->dlen[i], 1, &b->ids[i], &b->n[i],
                                   &e) != WHALE_OK) {
            b->ids[i] = NULL;
#pragma omp critical(whale_data_encode_fail)
            if (i < fail_at) {
                fail_at = i;
                first = e;
            }
        }
    }
    whale_code rc = WHALE_OK;
    if (fail_at != INT_MAX) rc = whale_errf(err, first.code, "%s", first.msg);
    whale_data_prepare_stats *st = p->st;
    for (int i = 0; !rc && i < b->count; i++) {
        int n = b->n[i];
        if (p->append_eos) {
            int32_t *grown = realloc(b->ids[i], ((size_t)n + 1) * sizeof *grown);
            if (!grown) {
                rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a document of %d tokens", n);
                break;
            }
            b->ids[i] = grown;
            grown[n++] = p->eos;
        }
        whale_split sp = b->val[i] ? WHALE_SPLIT_VAL : WHALE_SPLIT_TRAIN;
        rc = whale_data_writer_add(p->w, sp, b->ids[i], n, err);
        st->documents[sp]++;
        st->tokens[sp] += n;
        st->bytes += (int64_t)b->dlen[i];
    }
    batch_clear(b);
    double now = whale_now();
    if (!rc && p->o->progress && now - p->last_report >= 1.0) {
        p->last_report = now;
        whale_data_progress pr = {st->documents[0] + st->documents[1], st->tokens[0] + st->tokens[1], st->bytes,
                                  now - p->t0};
        p->o->progress(p->o->progress_user, &pr);
    }
    return rc;
}

static whale_code batch_add(prep *p, doc_batch *b, const char *text, size_t len, int val, whale_err *err) {
    if (b->count && (b->count == BATCH_DOCS || b->len + len > BATCH_BYTES)) {
        whale_code rc = batch_flush(p, b, err);
        if (rc) return rc;
    }
    if (b->len + len > b->cap) { /* one document larger than a batch */
        char *t = realloc(b->text, b->len + len);
        if (!t) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a document of %zu bytes", len);
        b->text = t;
        b->cap = b->len + len;
    }
    memcpy(b->text + b->len, text, len);
    b->off[b->count] = b->len;
    b->dlen[b->count] = len;
    b->val[b->count] = (unsigned char)val;
    b->count++;
    b->len += len;
    return WHALE_OK;
}

/* One tokenizer per thread. By default a thread per 4 MB of text at most:
 * loading a real tokenizer costs about as much as encoding that. */
static whale_code load_tokenizers(prep *p, whale_tokenizer *first, whale_err *err) {
    const whale_data_prepare_opts *o = p->o;
    int nt = o->threads;
    if (nt <= 0) {
        nt = whale_get_threads() < 16 ? whale_get_threads() : 16;
        if (nt > 1 + p->total_bytes / (4 << 20)) nt = (int)(1 + p->total_bytes / (4 << 20));
    }
    if (nt > p->total) nt = (int)p->total;
    if (nt < 1) nt = 1;
    p->toks = calloc((size_t)nt, sizeof *p->toks);
    if (!p->toks) {
        whale_tokenizer_free(first);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    p->threads = nt;
    p->toks[0] = first;
    int failed = 0;
#pragma omp parallel for num_threads(nt) if (nt > 2) reduction(+ : failed)
    for (int t = 1; t < nt; t++) {
        whale_err e;
        failed += whale_tokenizer_load(o->tokenizer, &p->toks[t], &e) != WHALE_OK;
    }
    if (failed) /* it loaded once already: only memory can run out now */
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory loading the tokenizer for %d threads", o->tokenizer, nt);
    return WHALE_OK;
}

/* Pass 2: the same documents, tokenized and written. The validation
 * documents are picked by selection sampling: exactly n_val of the total,
 * every subset equally likely, decided in one streaming pass. */
static whale_code write_inputs(prep *p, whale_err *err) {
    const whale_data_prepare_opts *o = p->o;
    doc_batch b;
    if (!batch_init(&b)) {
        batch_free(&b);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    }
    whale_rng rng;
    whale_rng_seed(&rng, o->seed);
    int64_t seen = 0, val_left = p->n_val;
    whale_code rc = WHALE_OK;
    for (int i = 0; !rc && i < o->n_inputs; i++) {
        reader r;
        rc = reader_open(&r, o->inputs[i], err);
        int64_t here = 0;
        const char *text;
        size_t len;
        while (!rc && !(rc = reader_next(p, &r, &text, &len, err)) && text) {
            if (++here > p->per_input[i]) break; /* the file grew */
            int val = (int64_t)(whale_rng_u64(&rng) % (uint64_t)(p->total - seen)) < val_left;
            val_left -= val;
            seen++;
            rc = batch_add(p, &b, text, len, val, err);
        }
        reader_close(&r);
        if (!rc && here != p->per_input[i])
            rc = whale_errf(err, WHALE_ERR_IO, "%s: the file changed while it was being prepared", o->inputs[i]);
    }
    if (!rc) rc = batch_flush(p, &b, err);
    batch_free(&b);
    return rc;
}

static const char *split_name(whale_doc_split s) {
    return s == WHALE_DOC_LINE ? "line" : s == WHALE_DOC_BLANK ? "blank" : "file";
}

/* How the data was made, for meta.json's "prepare". */
static cJSON *prepare_meta(const prep *p) {
    const whale_data_prepare_opts *o = p->o;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "tokenizer", o->tokenizer);
    cJSON *tj = cJSON_AddArrayToObject(m, "special_tokens_added");
    for (int i = 0; i < p->n_tmpl; i++) cJSON_AddItemToArray(tj, cJSON_CreateNumber(p->tmpl[i]));
    cJSON_AddBoolToObject(m, "eos_appended", p->append_eos);
    cJSON *in = cJSON_AddArrayToObject(m, "inputs");
    for (int i = 0; i < o->n_inputs; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "path", o->inputs[i]);
        cJSON_AddStringToObject(e, "format", has_suffix(o->inputs[i], ".jsonl") ? "jsonl" : "text");
        cJSON_AddNumberToObject(e, "documents", (double)p->per_input[i]);
        cJSON_AddItemToArray(in, e);
    }
    cJSON_AddStringToObject(m, "doc_split", split_name(o->doc_split));
    cJSON_AddStringToObject(m, "text_field", o->text_field);
    cJSON_AddNumberToObject(m, "val_fraction", o->val_fraction);
    cJSON_AddNumberToObject(m, "val_documents", (double)p->n_val);
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed); /* a u64 may not fit a JSON number exactly */
    cJSON_AddStringToObject(m, "seed", seed);
    cJSON_AddNumberToObject(m, "shard_tokens", (double)o->shard_tokens);
    cJSON_AddNumberToObject(m, "empty_documents", (double)p->st->empty_documents);
    cJSON_AddNumberToObject(m, "skipped_records", (double)p->st->bad_records);
    return m;
}

whale_data_prepare_opts whale_data_prepare_defaults(void) {
    whale_data_prepare_opts o;
    memset(&o, 0, sizeof o);
    o.val_fraction = 0.01;
    o.val_docs = -1;
    o.shard_tokens = WHALE_DATA_DEFAULT_SHARD_TOKENS;
    o.text_field = "text";
    o.doc_split = WHALE_DOC_FILE;
    return o;
}

/* The tokenizer's facts: vocabulary, EOS, fingerprint, what add_special adds. */
static whale_code tokenizer_facts(prep *p, whale_tokenizer *t, whale_err *err) {
    const char *dir = p->o->tokenizer;
    p->st->vocab_size = whale_tokenizer_vocab_size(t);
    p->eos = p->st->eos_id = whale_tokenizer_role_id(t, WHALE_TOKEN_EOS);
    if (p->eos < 0)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: the tokenizer has no EOS token (eos_token in tokenizer_config.json) to end documents with", dir);
    whale_code rc = whale_data_fingerprint(dir, &p->st->fingerprint, err);
    /* a template that ends with EOS already gets no second one */
    if (!rc) rc = whale_tokenizer_encode(t, "", 0, 1, &p->tmpl, &p->n_tmpl, err);
    if (!rc) p->append_eos = !(p->n_tmpl > 0 && p->tmpl[p->n_tmpl - 1] == p->eos);
    return rc;
}

whale_code whale_data_prepare(const whale_data_prepare_opts *opts, whale_data_prepare_stats *stats, whale_err *err) {
    whale_data_prepare_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!opts || !opts->tokenizer || !opts->out_dir || !opts->inputs)
        return whale_errf(err, WHALE_ERR_ARG, "whale_data_prepare: tokenizer, out_dir and inputs are required");
    whale_data_prepare_opts o = *opts;
    if (!o.text_field || !*o.text_field) o.text_field = "text";
    if (o.n_inputs < 1) return whale_errf(err, WHALE_ERR_ARG, "whale_data_prepare: no input files");
    if (!(o.val_fraction >= 0 && o.val_fraction <= 1))
        return whale_errf(err, WHALE_ERR_ARG, "validation fraction %g is not in [0, 1]", o.val_fraction);
    if (o.shard_tokens < 1) return whale_errf(err, WHALE_ERR_ARG, "shard size %" PRId64 " must be positive", o.shard_tokens);
    if (o.doc_split != WHALE_DOC_FILE && o.doc_split != WHALE_DOC_LINE && o.doc_split != WHALE_DOC_BLANK)
        return whale_errf(err, WHALE_ERR_ARG, "unknown document split %d", (int)o.doc_split);

    prep p;
    memset(&p, 0, sizeof p);
    p.o = &o;
    p.st = stats;
    p.t0 = p.last_report = whale_now();
    whale_tokenizer *t;
    whale_code rc = whale_tokenizer_load(o.tokenizer, &t, err); /* the cheapest way to fail first */
    if (rc) return rc;
    rc = tokenizer_facts(&p, t, err);
    p.per_input = calloc((size_t)o.n_inputs, sizeof *p.per_input);
    if (!rc && !p.per_input) rc = whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    if (!rc) rc = scan_inputs(&p, err);
    if (!rc) rc = count_val(&p, err);
    if (!rc) {
        whale_data_layout lay = {stats->vocab_size, p.eos, stats->fingerprint, o.shard_tokens, o.overwrite};
        rc = whale_data_writer_new(o.out_dir, &lay, &p.w, err);
    }
    if (rc) whale_tokenizer_free(t);
    else rc = load_tokenizers(&p, t, err); /* owns t from here */
    if (!rc) rc = write_inputs(&p, err);
    if (!rc) rc = writer_finish(p.w, prepare_meta(&p), err);
    if (!rc) stats->train_shards = p.w->n_train;

    whale_data_writer_free(p.w); /* removes everything unless finished */
    for (int i = 0; i < p.threads; i++) whale_tokenizer_free(p.toks[i]);
    free(p.toks);
    free(p.tmpl);
    free(p.per_input);
    stats->seconds = whale_now() - p.t0;
    return rc;
}

/* ---------------------------------------------------------------- loader */

typedef struct {
    char *path;
    unsigned char *map;
    size_t size;
    const unsigned char *tok, *idx; /* tokens; document index (docs + 1 u64, unaligned) */
    uint64_t tokens, docs;
    uint64_t base; /* position of the shard's first token in the split's stream */
} shard_in;

struct whale_dataset {
    char *dir;
    char split[8];
    shard_in *sh;
    int n;
    int token_bytes, vocab;
    int32_t eos;
    uint64_t fp, tokens, docs;
    int cross_doc;
};

void whale_dataset_free(whale_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        if (d->sh[i].map) munmap(d->sh[i].map, d->sh[i].size);
        free(d->sh[i].path);
    }
    free(d->sh);
    free(d->dir);
    free(d);
}

/* A non-negative integer field of meta.json (exact in a double). */
static whale_code meta_uint(const cJSON *obj, const char *key, const char *where, const char *meta, uint64_t max,
                            uint64_t *out, whale_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > (double)max ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: %s%s is missing or not an integer in [0, %" PRIu64 "]", meta, where,
                          key, max);
    *out = (uint64_t)v->valuedouble;
    return WHALE_OK;
}

static whale_code map_shard(whale_dataset *d, shard_in *s, uint64_t want_tokens, uint64_t want_docs, whale_err *err) {
    const char *path = s->path;
    int fd;
    uint64_t size;
    whale_code oc = whale_open_regular(path, &fd, &size, err);
    if (oc) return oc;
    if (size < WHALE_DATA_HEADER_BYTES || size > SIZE_MAX) {
        close(fd);
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: truncated: %llu bytes, shorter than the %d-byte header", path,
                          (unsigned long long)size, WHALE_DATA_HEADER_BYTES);
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (m == MAP_FAILED) return whale_errf(err, WHALE_ERR_IO, "%s: cannot mmap: %s", path, strerror(map_errno));
    s->map = m;
    s->size = (size_t)size;
    const unsigned char *h = s->map;
    if (memcmp(h, WHALE_DATA_MAGIC, 8))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not a token shard (the file does not start with \"%s\")", path,
                          WHALE_DATA_MAGIC);
    uint32_t version = get_u32(h + 8), tb = get_u32(h + 12), vocab = get_u32(h + 16), eos = get_u32(h + 20);
    if (version != WHALE_DATA_VERSION)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: format version %u; this build reads version %d", path, version,
                          WHALE_DATA_VERSION);
    if (tb != (uint32_t)d->token_bytes || vocab != (uint32_t)d->vocab ||
        eos != (d->eos < 0 ? EOS_NONE : (uint32_t)d->eos) || get_u64(h + 40) != d->fp)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: header (%u-byte tokens, vocab %u, EOS %d, tokenizer %016" PRIx64
                          ") does not match meta.json (%d-byte tokens, vocab %d, EOS %d, tokenizer %016" PRIx64 ")",
                          path, tb, vocab, (int)(int32_t)eos, get_u64(h + 40), d->token_bytes, d->vocab, (int)d->eos, d->fp);
    for (int i = 48; i < WHALE_DATA_HEADER_BYTES; i++)
        if (h[i]) return whale_errf(err, WHALE_ERR_FORMAT, "%s: reserved header byte %d is not zero", path, i);
    s->tokens = get_u64(h + 24);
    s->docs = get_u64(h + 32);
    if (s->tokens != want_tokens || s->docs != want_docs)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: header says %" PRIu64 " tokens in %" PRIu64 " documents, meta.json %" PRIu64 " in %" PRIu64,
                          path, s->tokens, s->docs, want_tokens, want_docs);
    /* the counts come from meta.json, so they fit a double: no overflow */
    uint64_t want = WHALE_DATA_HEADER_BYTES + s->tokens * tb + (s->docs + 1) * 8;
    if ((uint64_t)s->size != want)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: %zu bytes, but %" PRIu64 " tokens and %" PRIu64 " documents need %" PRIu64 " (%s)", path,
                          s->size, s->tokens, s->docs, want, (uint64_t)s->size < want ? "truncated" : "trailing bytes");
    s->tok = h + WHALE_DATA_HEADER_BYTES;
    s->idx = s->tok + s->tokens * tb;
    uint64_t prev = get_u64(s->idx);
    if (prev != 0) return whale_errf(err, WHALE_ERR_FORMAT, "%s: document index starts at %" PRIu64 ", not 0", path, prev);
    for (uint64_t i = 1; i <= s->docs; i++) {
        uint64_t o = get_u64(s->idx + 8 * i);
        if (o <= prev || o > s->tokens)
            return whale_errf(err, WHALE_ERR_FORMAT,
                              "%s: document index entry %" PRIu64 " is %" PRIu64 " after %" PRIu64
                              " (entries must increase up to the %" PRIu64 " tokens)",
                              path, i, o, prev, s->tokens);
        prev = o;
    }
    if (prev != s->tokens)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: document index ends at %" PRIu64 ", not at the %" PRIu64 " tokens",
                          path, prev, s->tokens);
    return WHALE_OK;
}

static whale_code open_split(whale_dataset *d, const cJSON *root, const char *meta, whale_err *err) {
    uint64_t v = 0, vocab = 0, tb = 0;
    whale_code rc;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "whale-tokens"))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: not a token dataset (\"format\" is not \"whale-tokens\")", meta);
    if ((rc = meta_uint(root, "version", "", meta, UINT32_MAX, &v, err))) return rc;
    if (v != WHALE_DATA_VERSION)
        return whale_errf(err, WHALE_ERR_UNSUPPORTED, "%s: format version %" PRIu64 "; this build reads version %d", meta, v,
                          WHALE_DATA_VERSION);
    if ((rc = meta_uint(root, "vocab_size", "", meta, INT32_MAX, &vocab, err))) return rc;
    if ((rc = meta_uint(root, "token_bytes", "", meta, 4, &tb, err))) return rc;
    if (vocab < 1 || tb != (vocab <= 65536 ? 2u : 4u))
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: %" PRIu64 "-byte tokens do not suit a vocabulary of %" PRIu64, meta, tb,
                          vocab);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_id");
    if (!cJSON_IsNumber(eos) || eos->valuedouble < -1 || eos->valuedouble >= (double)vocab ||
        eos->valuedouble != (double)(int64_t)eos->valuedouble)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: eos_id is missing or outside the vocabulary", meta);
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(root, "tokenizer_fingerprint");
    char *end = NULL;
    if (cJSON_IsString(fp)) d->fp = strtoull(fp->valuestring, &end, 16);
    if (!end || end == fp->valuestring || *end || strlen(fp->valuestring) != 16)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: tokenizer_fingerprint is not 16 hex digits", meta);
    d->vocab = (int)vocab;
    d->token_bytes = (int)tb;
    d->eos = (int32_t)eos->valuedouble;

    const cJSON *splits = cJSON_GetObjectItemCaseSensitive(root, "splits");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(splits, d->split);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(sp, "shards");
    char where[64];
    snprintf(where, sizeof where, "splits.%s.", d->split);
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < 1)
        return whale_errf(err, WHALE_ERR_FORMAT, "%s: %sshards is missing or empty", meta, where);
    int n = cJSON_GetArraySize(list);
    d->sh = calloc((size_t)n, sizeof *d->sh);
    if (!d->sh) return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", meta);
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        shard_in *s = &d->sh[d->n];
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        snprintf(where, sizeof where, "splits.%s.shards[%d].", d->split, d->n);
        /* a plain name: meta.json cannot point outside the directory */
        if (!cJSON_IsString(file) || !*file->valuestring || strchr(file->valuestring, '/') ||
            !strcmp(file->valuestring, "..") || !strcmp(file->valuestring, "."))
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: %sfile is not a file name", meta, where);
        uint64_t tokens, docs;
        if ((rc = meta_uint(e, "tokens", where, meta, 1ull << 50, &tokens, err)) ||
            (rc = meta_uint(e, "documents", where, meta, 1ull << 50, &docs, err)))
            return rc;
        if (!(s->path = join_path(d->dir, file->valuestring))) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
        d->n++;
        if ((rc = map_shard(d, s, tokens, docs, err))) return rc;
        s->base = d->tokens;
        d->tokens += s->tokens;
        d->docs += s->docs;
    }
    snprintf(where, sizeof where, "splits.%s.", d->split);
    uint64_t tokens, docs;
    if ((rc = meta_uint(sp, "tokens", where, meta, UINT64_MAX >> 11, &tokens, err)) ||
        (rc = meta_uint(sp, "documents", where, meta, UINT64_MAX >> 11, &docs, err)))
        return rc;
    if (tokens != d->tokens || docs != d->docs)
        return whale_errf(err, WHALE_ERR_FORMAT,
                          "%s: the %s split claims %" PRIu64 " tokens in %" PRIu64 " documents, its shards hold %" PRIu64
                          " in %" PRIu64,
                          meta, d->split, tokens, docs, d->tokens, d->docs);
    return WHALE_OK;
}

whale_code whale_dataset_open(const char *dir, const char *split, whale_dataset **out, whale_err *err) {
    *out = NULL;
    if (!dir || !split || (strcmp(split, "train") && strcmp(split, "val")))
        return whale_errf(err, WHALE_ERR_ARG, "%s: split must be \"train\" or \"val\", not \"%s\"", dir ? dir : "(null)",
                          split ? split : "(null)");
    whale_dataset *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(dir))) {
        free(d);
        return whale_errf(err, WHALE_ERR_NOMEM, "%s: out of memory", dir);
    }
    snprintf(d->split, sizeof d->split, "%s", split);
    char *meta = join_path(dir, "meta.json"), *text = NULL;
    size_t len;
    whale_code rc = meta ? whale_read_file_max(meta, WHALE_MAX_JSON_FILE, &text, &len, err) : whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    cJSON *root = NULL;
    if (!rc) {
        const char *end = NULL;
        root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
        if (!root) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: invalid JSON (byte %td)", meta, end ? end - text : (ptrdiff_t)0);
        else if (!cJSON_IsObject(root)) rc = whale_errf(err, WHALE_ERR_FORMAT, "%s: expected a JSON object", meta);
    }
    if (!rc) rc = open_split(d, root, meta, err);
    cJSON_Delete(root);
    free(text);
    free(meta);
    if (rc) {
        whale_dataset_free(d);
        return rc;
    }
    *out = d;
    return WHALE_OK;
}

int whale_dataset_vocab(const whale_dataset *d) { return d->vocab; }
uint64_t whale_dataset_fingerprint(const whale_dataset *d) { return d->fp; }
int64_t whale_dataset_tokens(const whale_dataset *d) { return (int64_t)d->tokens; }
int64_t whale_dataset_documents(const whale_dataset *d) { return (int64_t)d->docs; }
int32_t whale_dataset_eos(const whale_dataset *d) { return d->eos; }
int whale_dataset_num_shards(const whale_dataset *d) { return d->n; }
const char *whale_dataset_shard_path(const whale_dataset *d, int i) { return i >= 0 && i < d->n ? d->sh[i].path : NULL; }
void whale_dataset_set_cross_doc(whale_dataset *d, int on) { d->cross_doc = on != 0; }

whale_code whale_dataset_check(const whale_dataset *d, int model_vocab, const char *tokenizer, whale_err *err) {
    const char *first = d->sh[0].path;
    if (d->vocab > model_vocab)
        return whale_errf(err, WHALE_ERR_RANGE, "%s: shards were made with a tokenizer of %d ids but the model has %d", first,
                          d->vocab, model_vocab);
    if (!tokenizer) return WHALE_OK;
    char *path = tokenizer_json_path(tokenizer);
    if (!path) return whale_errf(err, WHALE_ERR_NOMEM, "out of memory");
    uint64_t fp;
    whale_code rc = fingerprint_file(path, &fp, err);
    if (!rc && fp != d->fp)
        rc = whale_errf(err, WHALE_ERR_FORMAT,
                        "%s: shards were made with another tokenizer (fingerprint %016" PRIx64 ", %s has %016" PRIx64 ")",
                        first, d->fp, path, fp);
    free(path);
    return rc;
}

int64_t whale_dataset_num_windows(const whale_dataset *d, int S) { return S < 1 ? 0 : (int64_t)(d->tokens / (uint64_t)S); }

static uint32_t token_at(const whale_dataset *d, const shard_in *s, uint64_t i) {
    const unsigned char *p = s->tok + i * (uint64_t)d->token_bytes;
    return d->token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
}

static uint64_t doc_start(const shard_in *s, uint64_t j) { return get_u64(s->idx + 8 * j); }

whale_code whale_dataset_window(const whale_dataset *d, int64_t w, int S, int32_t *ids, int32_t *labels, int32_t *pos,
                                int32_t *seg, whale_err *err) {
    int64_t nw = whale_dataset_num_windows(d, S);
    if (S < 1 || !ids) return whale_errf(err, WHALE_ERR_ARG, "%s: window of %d tokens", d->dir, S);
    if (w < 0 || w >= nw)
        return whale_errf(err, WHALE_ERR_RANGE, "%s: window %" PRId64 " of %d tokens is outside the %s split's %" PRId64,
                          d->dir, w, S, d->split, nw);
    uint64_t g = (uint64_t)w * (uint64_t)S;
    /* the last shard starting at or before g (empty shards share a base
     * with their successor, which is the one found) */
    int lo = 0, hi = d->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->sh[mid].base <= g) lo = mid;
        else hi = mid - 1;
    }
    int k = lo;
    const shard_in *s = &d->sh[k];
    uint64_t local = g - s->base;
    /* the document holding `local`: the last start at or before it */
    uint64_t a = 0, b = s->docs - 1;
    while (a < b) {
        uint64_t mid = (a + b + 1) / 2;
        if (doc_start(s, mid) <= local) a = mid;
        else b = mid - 1;
    }
    uint64_t j = a, next = doc_start(s, j + 1);
    int ds = 0; /* where the current document starts in the window */
    for (int t = 0; t < S; t++, local++) {
        int starts = 0;
        if (local == s->tokens) { /* next non-empty shard: a document boundary */
            do s = &d->sh[++k];
            while (s->tokens == 0);
            local = 0;
            j = 0;
            next = doc_start(s, 1);
            starts = 1;
        } else if (local == next) {
            next = doc_start(s, ++j + 1);
            starts = 1;
        }
        if (starts) ds = t;
        uint32_t id = token_at(d, s, local);
        if (id >= (uint32_t)d->vocab)
            return whale_errf(err, WHALE_ERR_FORMAT, "%s: token %" PRIu64 " is %u, outside the vocabulary of %d", s->path,
                              local, id, d->vocab);
        ids[t] = (int32_t)id;
        if (labels) labels[t] = t == 0 || starts ? -100 : (int32_t)id;
        if (pos) pos[t] = t - ds;
        if (seg) seg[t] = d->cross_doc ? 0 : ds;
    }
    return WHALE_OK;
}

int64_t whale_data_shuffle(uint64_t seed, int64_t epoch, int64_t n, int64_t i) {
    if (n <= 1 || i < 0 || i >= n) return n == 1 && i == 0 ? 0 : -1;
    /* a balanced Feistel network permutes [0, 4^h) ⊇ [0, n); walking the
     * cycle until the value is below n permutes [0, n) */
    int bits = 2;
    while (bits < 64 && (1ull << bits) < (uint64_t)n) bits += 2;
    int half = bits / 2;
    uint64_t mask = half == 64 ? ~0ull : (1ull << half) - 1, keys[6];
    uint64_t key = mix64(mix64(seed ^ 0x6a09e667f3bcc908ull) + (uint64_t)epoch);
    for (int r = 0; r < 6; r++) keys[r] = mix64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(r + 1));
    uint64_t x = (uint64_t)i;
    do {
        uint64_t L = x >> half, R = x & mask;
        for (int r = 0; r < 6; r++) {
            uint64_t t = L ^ (mix64(R ^ keys[r]) & mask);
            L = R;
            R = t;
        }
        x = L << half | R;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

whale_code whale_batch_alloc(int B, int S, whale_batch *b, whale_err *err) {
    memset(b, 0, sizeof *b);
    size_t n;
    if (B < 1 || S < 1 || !whale_mul_size((size_t)B, (size_t)S, &n) || !whale_mul_size(n, sizeof(int32_t), &n))
        return whale_errf(err, WHALE_ERR_ARG, "batch of %d windows of %d tokens", B, S);
    b->ids = malloc(n);
    b->labels = malloc(n);
    b->pos = malloc(n);
    b->seg = malloc(n);
    if (!b->ids || !b->labels || !b->pos || !b->seg) {
        whale_batch_free(b);
        return whale_errf(err, WHALE_ERR_NOMEM, "out of memory for a batch of %d × %d tokens", B, S);
    }
    b->B = B;
    b->S = S;
    return WHALE_OK;
}

void whale_batch_free(whale_batch *b) {
    if (!b) return;
    free(b->ids);
    free(b->labels);
    free(b->pos);
    free(b->seg);
    memset(b, 0, sizeof *b);
}

whale_code whale_dataset_next_batch(const whale_dataset *d, whale_data_cursor *cur, int B, int S, whale_batch *out,
                                    whale_err *err) {
    if (B < 1 || S < 1 || !cur || !out || !out->ids)
        return whale_errf(err, WHALE_ERR_ARG, "%s: batch of %d windows of %d tokens", d->dir, B, S);
    int64_t n = whale_dataset_num_windows(d, S);
    if (n == 0)
        return whale_errf(err, WHALE_ERR_ARG, "%s: the %s split has %" PRIu64 " tokens, fewer than one window of %d", d->dir,
                          d->split, d->tokens, S);
    whale_data_cursor c = *cur;
    if (c.windows == 0) c.windows = n;
    if (c.windows != n || c.index < 0 || c.index > n || c.epoch < 0)
        return whale_errf(err, WHALE_ERR_ARG,
                          "%s: the data cursor (epoch %" PRId64 ", window %" PRId64 " of %" PRId64
                          ") does not fit the %s split's %" PRId64 " windows of %d tokens: resume with the same data and "
                          "sequence length",
                          d->dir, c.epoch, c.index, c.windows, d->split, n, S);
    for (int b = 0; b < B; b++) {
        if (c.index == n) {
            c.epoch++;
            c.index = 0;
        }
        int64_t w = whale_data_shuffle(c.seed, c.epoch, n, c.index++);
        size_t o = (size_t)b * (size_t)S;
        whale_code rc = whale_dataset_window(d, w, S, out->ids + o, out->labels ? out->labels + o : NULL,
                                             out->pos ? out->pos + o : NULL, out->seg ? out->seg + o : NULL, err);
        if (rc) return rc;
    }
    out->B = B;
    out->S = S;
    *cur = c;
    return WHALE_OK;
}
