/* BPE tokenizer training speed (whale tokenizer train), one JSON line.
 *
 *   bench_bpe_train [--mb MB] [--vocab N] [--dump FILE] [FILE...]
 *
 * Trains on FILEs (as `whale tokenizer train` reads them) or, without files,
 * on MB megabytes (default 10) of generated text, with vocabulary N (default
 * 8192), and prints the time of each phase. The generated text is the same
 * for every run: English-like prose drawn from a Zipf distribution over
 * 40,000 words, C-like code, numbers, CJK, Cyrillic and emoji. --dump writes
 * it to FILE (for `whale tokenizer train` or tests/reference/bpe).
 *
 * Build (from the repository root, after building libwhale into build/):
 *   cc -O2 -march=native -D_GNU_SOURCE -Iinclude -Isrc bench/bench_bpe_train.c \
 *      build/libwhale.a -lpcre2-8 -lcjson -ldnnl -fopenmp -lm -o build/bench_bpe_train
 */
#include "core/core.h"
#include "whale_bpe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ text */

typedef struct {
    char *p;
    size_t len, cap;
} text_buf;

static void add(text_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = 2 * (b->len + n + 1);
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            fprintf(stderr, "bench_bpe_train: out of memory\n");
            exit(1);
        }
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
static void adds(text_buf *b, const char *s) { add(b, s, strlen(s)); }

static void add_cp(text_buf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)), u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)), u[2] = (char)(0x80 | (cp >> 6 & 63)),
        u[3] = (char)(0x80 | (cp & 63)), n = 4;
    add(b, u, (size_t)n);
}

#define N_WORDS 40000
#define N_CJK 3000

typedef struct {
    whale_rng rng;
    char *words[N_WORDS];
    double cdf[N_WORDS]; /* Zipf-Mandelbrot, shared by words and CJK ranks */
} gen;

static const char *const common[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "model", "data", "time", "people", "first", "new", "two", "may", "also", "other"};

static void make_words(gen *g) {
    static const char *const on[] = {"", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s",
                                     "t", "v", "w", "st", "th", "ch", "sh", "pr", "tr", "gr", "bl", "cl", "qu"};
    static const char *const nu[] = {"a", "e", "i", "o", "u", "ea", "ou", "ai", "io", "y", "ee", "a"};
    static const char *const co[] = {"", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "x"};
    size_t nc = sizeof common / sizeof common[0];
    whale_rng r;
    whale_rng_seed(&r, 12345);
    for (int k = 0; k < N_WORDS; k++) {
        char w[64] = "";
        if ((size_t)k < nc) {
            snprintf(w, sizeof w, "%s", common[k]);
        } else {
            int syl = 1 + (int)(whale_rng_u64(&r) % (k < 2000 ? 2 : 4));
            for (int s = 0; s < syl; s++) {
                strcat(w, on[whale_rng_u64(&r) % (sizeof on / sizeof on[0])]);
                strcat(w, nu[whale_rng_u64(&r) % (sizeof nu / sizeof nu[0])]);
                strcat(w, co[whale_rng_u64(&r) % (sizeof co / sizeof co[0])]);
            }
        }
        g->words[k] = strdup(w);
    }
    double sum = 0;
    for (int k = 0; k < N_WORDS; k++) g->cdf[k] = sum += 1.0 / pow(k + 2.7, 1.07);
    for (int k = 0; k < N_WORDS; k++) g->cdf[k] /= sum;
}

/* A Zipf rank below n (n <= N_WORDS). */
static int zipf(gen *g, int n) {
    for (;;) {
        double u = (double)(whale_rng_u64(&g->rng) >> 11) * (1.0 / 9007199254740992.0);
        int lo = 0, hi = N_WORDS - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (g->cdf[mid] < u) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n) return lo;
    }
}

static int pick(gen *g, int n) { return (int)(whale_rng_u64(&g->rng) % (uint64_t)n); }

static void number(gen *g, text_buf *b) {
    char s[32];
    switch (pick(g, 4)) {
    case 0: snprintf(s, sizeof s, "%d", pick(g, 100)); break;
    case 1: snprintf(s, sizeof s, "%d", 1900 + pick(g, 130)); break;
    case 2: snprintf(s, sizeof s, "%d.%02d", pick(g, 1000), pick(g, 100)); break;
    default: snprintf(s, sizeof s, "%d", pick(g, 10000000)); break;
    }
    adds(b, s);
}

static void prose(gen *g, text_buf *b) {
    int sentences = 2 + pick(g, 6);
    for (int s = 0; s < sentences; s++) {
        int n = 4 + pick(g, 15);
        for (int i = 0; i < n; i++) {
            if (i) adds(b, " ");
            if (pick(g, 25) == 0) {
                number(g, b);
                continue;
            }
            const char *w = g->words[zipf(g, N_WORDS)];
            if (i == 0 || pick(g, 30) == 0) { /* capitalised */
                char c = (char)(w[0] >= 'a' && w[0] <= 'z' ? w[0] - 32 : w[0]);
                add(b, &c, 1);
                adds(b, w + 1);
            } else {
                adds(b, w);
            }
            if (i + 1 < n && pick(g, 10) == 0) adds(b, pick(g, 4) ? "," : pick(g, 2) ? ";" : " -");
        }
        static const char *const end[] = {".", ".", ".", ".", "?", "!", "...", ":"};
        adds(b, end[pick(g, 8)]);
        adds(b, s + 1 < sentences ? " " : "\n\n");
    }
}

static void ident(gen *g, text_buf *b) {
    adds(b, g->words[zipf(g, 3000)]);
    if (pick(g, 3) == 0) {
        adds(b, "_");
        adds(b, g->words[zipf(g, 3000)]);
    }
}

static void code(gen *g, text_buf *b) {
    int lines = 3 + pick(g, 10), depth = 0;
    for (int l = 0; l < lines; l++) {
        for (int d = 0; d < depth; d++) adds(b, "    ");
        switch (pick(g, 7)) {
        case 0: adds(b, "int "), ident(g, b), adds(b, " = "), number(g, b), adds(b, ";"); break;
        case 1: adds(b, "if ("), ident(g, b), adds(b, " > "), number(g, b), adds(b, ") {"), depth++; break;
        case 2: adds(b, "return "), ident(g, b), adds(b, "("), ident(g, b), adds(b, ", "), ident(g, b), adds(b, ");"); break;
        case 3: adds(b, "for (int i = 0; i < "), ident(g, b), adds(b, "; i++) {"), depth++; break;
        case 4: adds(b, "// "), adds(b, g->words[zipf(g, N_WORDS)]), adds(b, " "), adds(b, g->words[zipf(g, N_WORDS)]); break;
        case 5: ident(g, b), adds(b, "->"), ident(g, b), adds(b, " += "), ident(g, b), adds(b, "[i];"); break;
        default:
            if (depth) {
                depth--;
                b->len -= 4;
                adds(b, "}");
            } else {
                adds(b, "x = y * 2;");
            }
        }
        adds(b, "\n");
    }
    while (depth--) {
        for (int d = 0; d < depth; d++) adds(b, "    ");
        adds(b, "}\n");
    }
    adds(b, "\n");
}

static void cjk(gen *g, text_buf *b) {
    int n = 20 + pick(g, 60);
    for (int i = 0; i < n; i++) {
        int r = zipf(g, N_CJK);
        if (pick(g, 5) == 0) add_cp(b, 0x3041 + (uint32_t)(r % 83)); /* hiragana */
        else add_cp(b, 0x4E00 + (uint32_t)((r * 7919u) % 20902u));
        if (pick(g, 15) == 0) add_cp(b, pick(g, 2) ? 0xFF0C : 0x3002); /* ，。 */
    }
    adds(b, "\n\n");
}

static void other(gen *g, text_buf *b) {
    int n = 5 + pick(g, 10);
    for (int i = 0; i < n; i++) {
        if (i) adds(b, " ");
        int k = pick(g, 3);
        if (k == 0) {
            add_cp(b, 0x1F600 + (uint32_t)pick(g, 80)); /* emoji */
        } else {
            const char *w = g->words[zipf(g, N_WORDS)];
            for (; *w; w++) /* the word in Cyrillic or Greek letters */
                add_cp(b, (k == 1 ? 0x430 : 0x3B1) + (uint32_t)((*w - 'a') % 24));
        }
    }
    adds(b, ".\n\n");
}

static char *generate(size_t want, size_t *len) {
    gen *g = calloc(1, sizeof *g);
    text_buf b = {0};
    if (!g) exit(1);
    make_words(g);
    whale_rng_seed(&g->rng, 2024);
    while (b.len < want) {
        int k = pick(g, 100);
        if (k < 70) prose(g, &b);
        else if (k < 85) code(g, &b);
        else if (k < 95) cjk(g, &b);
        else other(g, &b);
    }
    for (int k = 0; k < N_WORDS; k++) free(g->words[k]);
    free(g);
    *len = b.len;
    return b.p;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv) {
    double mb = 10;
    int vocab = 8192, n_files = 0;
    const char *dump = NULL;
    const char **files = calloc((size_t)argc, sizeof *files);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else files[n_files++] = argv[i];
    }
    whale_bpe_train_opts opts;
    whale_bpe_train_defaults(&opts);
    opts.vocab_size = vocab;
    char dir[] = "/tmp/bench_bpe_train-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    whale_err err;
    whale_bpe_train_stats st;
    double gen_s = 0, t0;
    whale_code rc;
    if (n_files) {
        t0 = whale_now();
        rc = whale_bpe_train(&opts, files, n_files, dir, &st, &err);
    } else {
        t0 = whale_now();
        size_t len;
        char *text = generate((size_t)(mb * 1e6), &len);
        gen_s = whale_now() - t0;
        if (dump) {
            FILE *f = fopen(dump, "wb");
            if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
                perror(dump);
                return 1;
            }
        }
        t0 = whale_now();
        whale_bpe_trainer *tr;
        rc = whale_bpe_trainer_new(&opts, &tr, &err);
        if (!rc) rc = whale_bpe_trainer_add_text(tr, text, len, &err);
        if (!rc) rc = whale_bpe_trainer_finish(tr, dir, &st, &err);
        whale_bpe_trainer_free(tr);
        free(text);
    }
    double total = whale_now() - t0;
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
    free(files);
    if (rc) {
        fprintf(stderr, "bench_bpe_train: %s\n", err.msg);
        return 1;
    }
    printf("{\"bench\": \"bpe_train\", \"mb\": %.2f, \"vocab\": %d, \"merges\": %d, \"words\": %lld, "
           "\"distinct_words\": %lld, \"count_s\": %.3f, \"merge_s\": %.3f, \"total_s\": %.3f, \"generate_s\": %.3f}\n",
           (double)st.n_bytes / 1e6, st.vocab_size, st.n_merges, (long long)st.n_words,
           (long long)st.n_unique_words, st.seconds_count, st.seconds_merge, total, gen_s);
    return 0;
}
