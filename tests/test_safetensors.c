/* safetensors reader and writer: round trips, sharded directories, and one
 * hand-crafted bad file for every validation rule. */
#include "whale_safetensors.h"
#include "testutil.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[512];

/* Path of a file in the test directory; a few results stay valid at once. */
static const char *in_tmp(const char *name) {
    static char buf[4][1024];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    unsigned char *p = malloc((size_t)sz + 1);
    if (fread(p, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* A file made of: 8-byte LE length hlen, the header bytes, data_len bytes of
 * a counting pattern. */
static void craft(const char *path, uint64_t hlen, const char *header, size_t header_bytes,
                  size_t data_len) {
    size_t n = 8 + header_bytes + data_len;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, header_bytes);
    for (size_t i = 0; i < data_len; i++) b[8 + header_bytes + i] = (unsigned char)i;
    write_bytes(path, b, n);
    free(b);
}

/* Write the header (hlen = its length) and data, open it and expect failure
 * with code, a message naming the file and containing word (and word2 if not
 * NULL). The file name doubles as the case's label. */
static void expect_bad_n(const char *fname, const char *header, size_t hlen, size_t data_len,
                         whale_code code, const char *word, const char *word2) {
    const char *path = in_tmp(fname);
    craft(path, hlen, header, hlen, data_len);
    whale_st *st = (whale_st *)1;
    whale_err err = {0};
    whale_code rc = whale_st_open(path, &st, &err);
    CHECK(rc == code, "%s: got %s (%s), want %s", fname, whale_code_name(rc), err.msg,
          whale_code_name(code));
    CHECK(st == NULL, "%s: out not cleared", fname);
    CHECK(strstr(err.msg, fname), "%s: message does not name the file: %s", fname, err.msg);
    CHECK(strstr(err.msg, word), "%s: message lacks '%s': %s", fname, word, err.msg);
    if (word2) CHECK(strstr(err.msg, word2), "%s: message lacks '%s': %s", fname, word2, err.msg);
    CHECK(!strchr(err.msg, '\n'), "%s: message is not one line", fname);
    if (rc == WHALE_OK) whale_st_close(st);
}

static void expect_bad(const char *fname, const char *header, size_t data_len, whale_code code,
                       const char *word, const char *word2) {
    expect_bad_n(fname, header, strlen(header), data_len, code, word, word2);
}

/* ------------------------------------------------------------ round trip */

static void test_round_trip(void) {
    /* One tensor of every dtype, a 0-dim scalar and a zero-size tensor, with
     * sizes chosen so some tensors start at odd offsets. */
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e30f};
    uint16_t f16[3] = {0x3c00, 0xc000, 0x7bff};
    uint16_t bf16[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
    int8_t i8[5] = {-128, -1, 0, 1, 127};
    uint8_t u8[3] = {0, 128, 255};
    int32_t i32[2] = {INT32_MIN, INT32_MAX};
    int64_t i64[2] = {INT64_MIN, (int64_t)5368709120};
    float scalar = 42.0f;
    int64_t s23[] = {2, 3}, s3[] = {3}, s4[] = {4}, s5[] = {5}, s2[] = {2}, s1x2[] = {1, 2},
            s0x3[] = {0, 3};
    whale_st_item items[] = {
        {"model.embed.weight", WHALE_F32, 2, s23, f32},
        {"f16 \"quoted\" \\ name\twith tab", WHALE_F16, 1, s3, f16},
        {"bf16.\xc3\xbcnicode", WHALE_BF16, 1, s4, bf16},
        {"i8", WHALE_I8, 1, s5, i8},
        {"u8", WHALE_U8, 1, s3, u8},
        {"empty", WHALE_I32, 2, s0x3, NULL},
        {"i32", WHALE_I32, 1, s2, i32},
        {"i64", WHALE_I64, 2, s1x2, i64},
        {"scalar", WHALE_F32, 0, NULL, &scalar},
    };
    int n = (int)(sizeof items / sizeof items[0]);
    const char *meta[] = {"producer", "nanowhale", "note", "line\nbreak \"q\"", NULL};
    const char *path = in_tmp("round.safetensors");
    whale_err err = {0};
    whale_code rc = whale_st_write(path, items, n, meta, &err);
    CHECK(rc == WHALE_OK, "write: %s", err.msg);
    CHECK(!exists(in_tmp("round.safetensors.tmp")), "temporary file left behind");

    /* Raw layout: header padded with spaces to a multiple of 8, tensors back
     * to back after it. */
    size_t fsize = 0;
    unsigned char *raw = read_bytes(path, &fsize);
    CHECK(raw && fsize >= 8, "cannot read back");
    if (raw && fsize >= 8) {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            size_t nb = whale_dtype_size(items[i].dtype);
            for (int d = 0; d < items[i].ndim; d++) nb *= (size_t)items[i].shape[d];
            total += nb;
        }
        CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
        CHECK(8 + hlen + total == fsize, "file size %zu != 8 + %llu + %zu", fsize,
              (unsigned long long)hlen, total);
        CHECK(raw[8] == '{', "header does not start with '{'");
        size_t last = 8 + (size_t)hlen - 1;
        while (last > 8 && raw[last] == ' ') last--;
        CHECK(raw[last] == '}', "header padding is not spaces");
        CHECK(memmem(raw + 8, (size_t)hlen, "\"__metadata__\":{\"format\":\"pt\"", 29) != NULL,
              "metadata format=pt not written first");
    }
    free(raw);

    whale_st *st = NULL;
    rc = whale_st_open(path, &st, &err);
    CHECK(rc == WHALE_OK, "open: %s", err.msg);
    if (rc) return;
    CHECK(whale_st_count(st) == n, "count %d != %d", whale_st_count(st), n);
    CHECK(whale_st_metadata(st, "format") && strcmp(whale_st_metadata(st, "format"), "pt") == 0,
          "format metadata");
    CHECK(whale_st_metadata(st, "producer") && strcmp(whale_st_metadata(st, "producer"), "nanowhale") == 0,
          "producer metadata");
    CHECK(whale_st_metadata(st, "note") && strcmp(whale_st_metadata(st, "note"), meta[3]) == 0,
          "escaped metadata value");
    CHECK(whale_st_metadata(st, "absent") == NULL, "absent metadata key");

    const char *prev_end = NULL;
    for (int i = 0; i < n; i++) {
        const whale_st_entry *e = whale_st_at(st, i);
        const whale_st_item *it = &items[i];
        CHECK(e && strcmp(e->name, it->name) == 0, "entry %d is '%s', want '%s' (file order)", i,
              e ? e->name : "?", it->name);
        if (!e) continue;
        CHECK(whale_st_find(st, it->name) == e, "find '%s'", it->name);
        CHECK(e->dtype == it->dtype, "'%s' dtype", it->name);
        CHECK(e->ndim == it->ndim, "'%s' ndim %d != %d", it->name, e->ndim, it->ndim);
        size_t nb = whale_dtype_size(it->dtype);
        for (int d = 0; d < it->ndim && d < e->ndim; d++) {
            CHECK(e->shape[d] == it->shape[d], "'%s' shape[%d]", it->name, d);
            nb *= (size_t)it->shape[d];
        }
        CHECK(e->nbytes == nb, "'%s' nbytes %zu != %zu", it->name, e->nbytes, nb);
        if (nb) CHECK(memcmp(e->data, it->data, nb) == 0, "'%s' data differs", it->name);
        CHECK(e->file && strcmp(e->file, path) == 0, "'%s' file", it->name);
        if (i == 0) CHECK((uintptr_t)e->data % 8 == 0, "data area is not 8-byte aligned");
        else CHECK(e->data == prev_end, "'%s' does not follow the previous tensor", it->name);
        prev_end = (const char *)e->data + e->nbytes;
    }
    const whale_st_entry *s = whale_st_find(st, "scalar");
    float sv = 0; /* memcpy: the scalar sits at an odd offset, unaligned */
    if (s && s->nbytes == sizeof sv) memcpy(&sv, s->data, sizeof sv);
    CHECK(s && s->ndim == 0 && s->nbytes == 4 && sv == 42.0f, "0-dim scalar");
    const whale_st_entry *z = whale_st_find(st, "empty");
    CHECK(z && z->nbytes == 0 && z->ndim == 2 && z->shape[0] == 0, "zero-size tensor");
    CHECK(whale_st_find(st, "missing") == NULL, "find of an absent name");
    CHECK(whale_st_find(st, "i") == NULL, "find of a prefix");
    CHECK(whale_st_at(st, -1) == NULL && whale_st_at(st, n) == NULL, "at() out of range");
    whale_st_close(st);

    /* Overwriting replaces the file atomically; no metadata is fine too. */
    rc = whale_st_write(path, items, 1, NULL, &err);
    CHECK(rc == WHALE_OK, "rewrite: %s", err.msg);
    rc = whale_st_open(path, &st, &err);
    CHECK(rc == WHALE_OK && whale_st_count(st) == 1, "reopen after rewrite: %s", err.msg);
    if (!rc) {
        CHECK(whale_st_metadata(st, "producer") == NULL, "old metadata survived");
        whale_st_close(st);
    }
}

/* Many tensors: every one is found through the hash table. */
static void test_many(void) {
    enum { N = 1000 };
    static whale_st_item items[N];
    static char names[N][32];
    static int32_t vals[N];
    static int64_t shape1[1] = {1};
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.w", i);
        vals[i] = i * 7;
        items[i] = (whale_st_item){names[i], WHALE_I32, 1, shape1, &vals[i]};
    }
    const char *path = in_tmp("many.safetensors");
    whale_err err = {0};
    CHECK(whale_st_write(path, items, N, NULL, &err) == WHALE_OK, "write many: %s", err.msg);
    whale_st *st = NULL;
    if (whale_st_open(path, &st, &err) != WHALE_OK) {
        CHECK(0, "open many: %s", err.msg);
        return;
    }
    int ok = whale_st_count(st) == N;
    for (int i = 0; i < N; i++) {
        const whale_st_entry *e = whale_st_find(st, names[i]);
        ok &= e && *(const int32_t *)e->data == i * 7 && e == whale_st_at(st, i);
    }
    CHECK(ok, "lookups among %d tensors", N);
    whale_st_close(st);

    /* An empty file (no tensors) round-trips too. */
    path = in_tmp("none.safetensors");
    CHECK(whale_st_write(path, NULL, 0, NULL, &err) == WHALE_OK, "write empty: %s", err.msg);
    if (whale_st_open(path, &st, &err) == WHALE_OK) {
        CHECK(whale_st_count(st) == 0 && whale_st_at(st, 0) == NULL, "empty set");
        CHECK(whale_st_metadata(st, "format") != NULL, "empty file has metadata");
        whale_st_close(st);
    } else {
        CHECK(0, "open empty: %s", err.msg);
    }
}

/* Hand-made files that are valid but unlike our writer's output. */
static void test_accepts(void) {
    whale_err err = {0};
    whale_st *st = NULL;

    /* Leading and trailing whitespace, header not a multiple of 8, tensors
     * listed out of offset order, no metadata, an unknown extra field, a
     * zero-size tensor sharing an offset, and a 0-dim scalar. */
    const char *h = " \n\t{\"b\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[4,8]},"
                    "\"z\":{\"dtype\":\"F16\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"extra\":1}}\r\n ";
    const char *path = in_tmp("loose.safetensors");
    craft(path, strlen(h), h, strlen(h), 8);
    whale_code rc = whale_st_open(path, &st, &err);
    CHECK(rc == WHALE_OK, "loose header: %s", err.msg);
    if (!rc) {
        CHECK(whale_st_count(st) == 3, "count");
        const whale_st_entry *e0 = whale_st_at(st, 0), *e1 = whale_st_at(st, 1), *e2 = whale_st_at(st, 2);
        CHECK(e0 && e1 && e2 && strcmp(e0->name, "a") == 0 && strcmp(e1->name, "z") == 0 &&
                  strcmp(e2->name, "b") == 0,
              "at() is not in offset order");
        const whale_st_entry *b = whale_st_find(st, "b");
        CHECK(b && b->nbytes == 4 && ((const unsigned char *)b->data)[0] == 4, "b data");
        CHECK(whale_st_metadata(st, "format") == NULL, "no metadata expected");
        whale_st_close(st);
    }

    /* The smallest file: "{}" and no data. */
    path = in_tmp("tiny.safetensors");
    craft(path, 2, "{}", 2, 0);
    rc = whale_st_open(path, &st, &err);
    CHECK(rc == WHALE_OK, "tiny: %s", err.msg);
    if (!rc) {
        CHECK(whale_st_count(st) == 0, "tiny count");
        whale_st_close(st);
    }

    /* Offsets beyond 2^32 parse exactly (cJSON's valueint would saturate):
     * a sparse 5 GiB file with one U8 tensor. */
    h = "{\"big\":{\"dtype\":\"U8\",\"shape\":[5368709120],\"data_offsets\":[0,5368709120]}}";
    path = in_tmp("big.safetensors");
    craft(path, strlen(h), h, strlen(h), 0);
    if (truncate(path, (off_t)(8 + strlen(h)) + (off_t)5368709120LL) == 0) {
        rc = whale_st_open(path, &st, &err);
        CHECK(rc == WHALE_OK, "big: %s", err.msg);
        if (!rc) {
            const whale_st_entry *e = whale_st_find(st, "big");
            CHECK(e && e->nbytes == (size_t)5368709120LL && e->shape[0] == 5368709120LL, "big sizes");
            whale_st_close(st);
        }
    }
    unlink(path);
}

/* ------------------------------------------------------------ bad files */

static void test_bad_files(void) {
    const whale_code F = WHALE_ERR_FORMAT, U = WHALE_ERR_UNSUPPORTED;
    whale_err err = {0};
    whale_st *st = NULL;

    /* Cannot open at all. */
    whale_code rc = whale_st_open(in_tmp("nonexistent.safetensors"), &st, &err);
    CHECK(rc == WHALE_ERR_IO && strstr(err.msg, "nonexistent.safetensors"), "missing file: %s", err.msg);
    rc = whale_st_open(tmpdir, &st, &err);
    CHECK(rc == WHALE_ERR_IO && strstr(err.msg, "regular"), "directory as file: %s", err.msg);

    /* File shorter than 8 bytes. */
    write_bytes(in_tmp("short.safetensors"), "\x02\0\0\0\0", 5);
    rc = whale_st_open(in_tmp("short.safetensors"), &st, &err);
    CHECK(rc == F && strstr(err.msg, "short.safetensors") && strstr(err.msg, "too short"), "short: %s",
          err.msg);

    /* Header length larger than the file, or absurd. */
    craft(in_tmp("hlenpast.safetensors"), 100, "{}", 2, 10);
    rc = whale_st_open(in_tmp("hlenpast.safetensors"), &st, &err);
    CHECK(rc == F && strstr(err.msg, "hlenpast.safetensors") && strstr(err.msg, "past the end"),
          "header past end: %s", err.msg);
    craft(in_tmp("hlenabsurd.safetensors"), 200000000, "{}", 2, 0);
    rc = whale_st_open(in_tmp("hlenabsurd.safetensors"), &st, &err);
    CHECK(rc == F && strstr(err.msg, "hlenabsurd.safetensors") && strstr(err.msg, "not a safetensors file") &&
              !strstr(err.msg, "200000000"),
          "absurd header length: %s", err.msg);
    craft(in_tmp("hlenhuge.safetensors"), UINT64_MAX, "{}", 2, 0);
    rc = whale_st_open(in_tmp("hlenhuge.safetensors"), &st, &err);
    CHECK(rc == F && strstr(err.msg, "not a safetensors file"), "2^64-1 header length: %s", err.msg);

    /* Header JSON. */
    expect_bad("badjson.safetensors", "{\"a\": {", 0, F, "not valid JSON", NULL);
    expect_bad("garbage.safetensors", "{} x", 0, F, "not valid JSON", NULL);
    expect_bad("emptyhdr.safetensors", "", 0, F, "not valid JSON", NULL);
    expect_bad("blankhdr.safetensors", "        ", 0, F, "not valid JSON", NULL);
    expect_bad("badutf8.safetensors", "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
               0, F, "not valid JSON", "UTF-8");
    expect_bad("surrogate.safetensors", "{\"\xed\xa0\x80\":1}", 0, F, "UTF-8", NULL);
    expect_bad("overlong.safetensors", "{\"\xc0\xaf\":1}", 0, F, "UTF-8", NULL);
    expect_bad_n("nulbyte.safetensors", "{\"a\0\":1}", 8, 0, F, "not valid JSON", "control character");
    expect_bad("bom.safetensors", "\xef\xbb\xbf{}", 0, F, "JSON object", NULL);
    expect_bad("notobject.safetensors", "[1, 2]", 0, F, "not a JSON object", NULL);
    expect_bad("string.safetensors", "\"x\"", 0, F, "not a JSON object", NULL);

    /* Entries. */
    expect_bad("entryint.safetensors", "{\"tensA\": 5}", 0, F, "tensA", "not an object");
    expect_bad("nodtype.safetensors", "{\"tensA\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, F,
               "tensA", "dtype");
    expect_bad("dtypenum.safetensors", "{\"tensA\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, F, "tensA", "dtype");
    expect_bad("f64.safetensors", "{\"tensA\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
               8, U, "tensA", "F64");
    expect_bad("fp8.safetensors",
               "{\"tensA\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, U, "tensA",
               "F8_E4M3");
    expect_bad("lowercase.safetensors",
               "{\"tensA\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, U, "tensA",
               "unsupported dtype");
    expect_bad("noshape.safetensors", "{\"tensA\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, F,
               "tensA", "shape");
    expect_bad("shapeint.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, F, "tensA", "shape");
    expect_bad("shapeneg.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, F, "tensA",
               "shape");
    expect_bad("shapefrac.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, F, "tensA",
               "shape");
    expect_bad("shapestr.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, F, "tensA",
               "shape");
    expect_bad("shapehuge.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,1]}}", 1, F, "tensA",
               "shape");
    expect_bad("shape2p53.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[9007199254740994],\"data_offsets\":[0,1]}}", 1, F,
               "tensA", "shape");
    expect_bad("ninedims.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, U,
               "tensA", "dims");
    expect_bad("nooffs.safetensors", "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, F, "tensA",
               "data_offsets");
    expect_bad("offs3.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1, F, "tensA",
               "data_offsets");
    expect_bad("offsneg.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, F, "tensA",
               "data_offsets");
    expect_bad("offsobj.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{\"a\":0,\"b\":1}}}", 1, F,
               "tensA", "data_offsets");
    expect_bad("offsrev.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1, F, "tensA",
               "begin > end");
    expect_bad("dupfield.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"dtype\":\"I8\"}}", 1, F,
               "tensA", "duplicate field");

    /* Offsets and sizes. */
    expect_bad("outside.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[5368709120],\"data_offsets\":[0,5368709120]}}",
               16, F, "tensA", "outside");
    expect_bad("mismatch.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, F, "tensA",
               "size mismatch");
    expect_bad("mismatch16.safetensors",
               "{\"tensA\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 4, F, "tensA",
               "size mismatch");
    expect_bad("overflow.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,8]}}",
               8, F, "tensA", "overflow");
    expect_bad("overflow0.safetensors",
               "{\"tensA\":{\"dtype\":\"I64\",\"shape\":[4294967296,4294967296,0],"
               "\"data_offsets\":[0,0]}}",
               0, F, "tensA", "overflow");
    expect_bad("overlap.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"tensB\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, F, "overlap", "tensB");
    expect_bad("samerange.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"tensB\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               4, F, "overlap", NULL);
    expect_bad("hole.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"tensB\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, F, "hole", "tensB");
    expect_bad("leadhole.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, F, "hole",
               "tensA");
    expect_bad("trailing.safetensors",
               "{\"tensA\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, F, "trailing",
               NULL);
    expect_bad("trailnone.safetensors", "{}", 3, F, "trailing", NULL);

    /* Duplicates and metadata. */
    expect_bad("dupname.safetensors",
               "{\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"tensA\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, F, "duplicate", "tensA");
    expect_bad("dupmeta.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, F, "duplicate",
               "__metadata__");
    expect_bad("metaarray.safetensors", "{\"__metadata__\":[\"pt\"]}", 0, F, "__metadata__",
               "not an object");
    expect_bad("metastr.safetensors", "{\"__metadata__\":\"pt\"}", 0, F, "__metadata__",
               "not an object");
    expect_bad("metanum.safetensors", "{\"__metadata__\":{\"format\":\"pt\",\"total\":5}}", 0, F,
               "__metadata__", "not a string");
    expect_bad("metanest.safetensors", "{\"__metadata__\":{\"format\":{\"x\":\"pt\"}}}", 0, F,
               "__metadata__", "not a string");
    expect_bad("metadupkey.safetensors", "{\"__metadata__\":{\"format\":\"pt\",\"format\":\"tf\"}}", 0,
               F, "__metadata__", "duplicate");
}

/* ------------------------------------------------------------ writer errors */

static void expect_write_fail(const char *label, const whale_st_item *items, int n,
                              const char *const *meta, whale_code code, const char *word) {
    const char *path = in_tmp("wfail.safetensors");
    whale_err err = {0};
    whale_code rc = whale_st_write(path, items, n, meta, &err);
    CHECK(rc == code, "%s: got %s (%s)", label, whale_code_name(rc), err.msg);
    CHECK(strstr(err.msg, "wfail.safetensors") && strstr(err.msg, word), "%s: message: %s", label,
          err.msg);
    CHECK(!exists(path) && !exists(in_tmp("wfail.safetensors.tmp")), "%s: file left behind", label);
}

static void test_write_errors(void) {
    const whale_code A = WHALE_ERR_ARG;
    float v[4] = {0};
    int64_t s2[] = {2}, neg[] = {-1}, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t huge[] = {INT64_MAX, INT64_MAX};

    whale_st_item dup[] = {{"w", WHALE_F32, 1, s2, v}, {"w", WHALE_F32, 1, s2, v}};
    expect_write_fail("duplicate", dup, 2, NULL, A, "duplicate");
    whale_st_item bad_dtype[] = {{"w", WHALE_DTYPE_COUNT, 1, s2, v}};
    expect_write_fail("dtype", bad_dtype, 1, NULL, A, "dtype");
    whale_st_item bad_dim[] = {{"w", WHALE_F32, 1, neg, v}};
    expect_write_fail("negative dim", bad_dim, 1, NULL, A, "shape");
    whale_st_item bad_ndim[] = {{"w", WHALE_F32, 9, nine, v}};
    expect_write_fail("ndim", bad_ndim, 1, NULL, A, "ndim");
    whale_st_item no_shape[] = {{"w", WHALE_F32, 1, NULL, v}};
    expect_write_fail("no shape", no_shape, 1, NULL, A, "shape");
    whale_st_item overflow[] = {{"w", WHALE_F32, 2, huge, v}};
    expect_write_fail("overflow", overflow, 1, NULL, A, "shape");
    whale_st_item no_data[] = {{"w", WHALE_F32, 1, s2, NULL}};
    expect_write_fail("no data", no_data, 1, NULL, A, "data");
    whale_st_item no_name[] = {{NULL, WHALE_F32, 1, s2, v}};
    expect_write_fail("no name", no_name, 1, NULL, A, "name");
    whale_st_item reserved[] = {{"__metadata__", WHALE_F32, 1, s2, v}};
    expect_write_fail("reserved name", reserved, 1, NULL, A, "reserved");
    whale_st_item bad_utf8[] = {{"w\xff", WHALE_F32, 1, s2, v}};
    expect_write_fail("bad utf8 name", bad_utf8, 1, NULL, A, "UTF-8");
    whale_st_item ok[] = {{"w", WHALE_F32, 1, s2, v}};
    expect_write_fail("negative n", ok, -1, NULL, A, "n = -1");
    const char *meta_novalue[] = {"k", NULL, NULL};
    expect_write_fail("meta without value", ok, 1, meta_novalue, A, "no value");
    const char *meta_format[] = {"format", "tf", NULL};
    expect_write_fail("meta format", ok, 1, meta_format, A, "reserved");
    const char *meta_dup[] = {"k", "1", "k", "2", NULL};
    expect_write_fail("meta duplicate", ok, 1, meta_dup, A, "duplicate");

    /* Unwritable destination: a directory that does not exist. */
    char path[1024];
    snprintf(path, sizeof path, "%s/no-such-dir/out.safetensors", tmpdir);
    whale_err err = {0};
    whale_code rc = whale_st_write(path, ok, 1, NULL, &err);
    CHECK(rc == WHALE_ERR_IO, "unwritable: got %s", whale_code_name(rc));
    CHECK(strstr(err.msg, path), "unwritable: message does not name the path: %s", err.msg);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!exists(path) && !exists(tmp), "unwritable: file left behind");

    /* A destination that is a directory: the rename fails and the
     * temporary file is removed. */
    snprintf(path, sizeof path, "%s/isdir.safetensors", tmpdir);
    mkdir(path, 0755);
    rc = whale_st_write(path, ok, 1, NULL, &err);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(rc == WHALE_ERR_IO && strstr(err.msg, "isdir.safetensors"), "rename onto dir: %s", err.msg);
    CHECK(!exists(tmp), "rename onto dir: temporary file left behind");
    rmdir(path);
}

/* ------------------------------------------------------------ directories */

static void write_index(const char *dir, const char *json) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_bytes(path, json, strlen(json));
}

static void expect_dir_fail(const char *label, const char *dir, whale_code code, const char *word,
                            const char *word2) {
    whale_st *st = (whale_st *)1;
    whale_err err = {0};
    whale_code rc = whale_st_open_dir(dir, &st, &err);
    CHECK(rc == code, "%s: got %s (%s), want %s", label, whale_code_name(rc), err.msg,
          whale_code_name(code));
    CHECK(st == NULL, "%s: out not cleared", label);
    CHECK(strstr(err.msg, word), "%s: message lacks '%s': %s", label, word, err.msg);
    if (word2) CHECK(strstr(err.msg, word2), "%s: message lacks '%s': %s", label, word2, err.msg);
    if (rc == WHALE_OK) whale_st_close(st);
}

static void test_dirs(void) {
    whale_err err = {0};
    whale_st *st = NULL;
    char dir[600];

    /* Neither file present. */
    snprintf(dir, sizeof dir, "%s/emptydir", tmpdir);
    mkdir(dir, 0755);
    expect_dir_fail("empty dir", dir, WHALE_ERR_IO, "emptydir", "neither");

    /* A single model.safetensors. */
    snprintf(dir, sizeof dir, "%s/single", tmpdir);
    mkdir(dir, 0755);
    float w[3] = {1, 2, 3};
    int64_t s3[] = {3};
    whale_st_item one[] = {{"w", WHALE_F32, 1, s3, w}};
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(whale_st_write(path, one, 1, NULL, &err) == WHALE_OK, "write single: %s", err.msg);
    CHECK(whale_st_open_dir(dir, &st, &err) == WHALE_OK, "open single dir: %s", err.msg);
    if (st) {
        const whale_st_entry *e = whale_st_find(st, "w");
        CHECK(e && ((const float *)e->data)[2] == 3.0f && strcmp(e->file, path) == 0, "single dir entry");
        whale_st_close(st);
        st = NULL;
    }

    /* Two shards and an index written by hand. */
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0755);
    int32_t a[2] = {1, 2}, c[4] = {5, 6, 7, 8};
    uint8_t b[3] = {9, 10, 11};
    int64_t s2[] = {2}, s2x2[] = {2, 2};
    whale_st_item shard1[] = {{"a", WHALE_I32, 1, s2, a}, {"b", WHALE_U8, 1, s3, b}};
    whale_st_item shard2[] = {{"c", WHALE_I32, 2, s2x2, c}};
    char p1[1024], p2[1024];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    const char *m1[] = {"shard", "one", NULL}, *m2[] = {"shard", "two", "only2", "yes", NULL};
    CHECK(whale_st_write(p1, shard1, 2, m1, &err) == WHALE_OK, "write shard 1: %s", err.msg);
    CHECK(whale_st_write(p2, shard2, 1, m2, &err) == WHALE_OK, "write shard 2: %s", err.msg);
    /* Listed out of order, so shard order must come from the names. */
    write_index(dir, "{\"metadata\":{\"total_size\":27},\"weight_map\":{"
                     "\"c\":\"model-00002-of-00002.safetensors\","
                     "\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\"}}");
    whale_code rc = whale_st_open_dir(dir, &st, &err);
    CHECK(rc == WHALE_OK, "open sharded: %s", err.msg);
    if (!rc) {
        CHECK(whale_st_count(st) == 3, "sharded count %d", whale_st_count(st));
        const char *order[] = {"a", "b", "c"};
        for (int i = 0; i < 3; i++) {
            const whale_st_entry *e = whale_st_at(st, i);
            CHECK(e && strcmp(e->name, order[i]) == 0, "sharded order %d", i);
        }
        const whale_st_entry *ea = whale_st_find(st, "a"), *eb = whale_st_find(st, "b"),
                             *ec = whale_st_find(st, "c");
        CHECK(ea && strcmp(ea->file, p1) == 0 && memcmp(ea->data, a, sizeof a) == 0, "a");
        CHECK(eb && strcmp(eb->file, p1) == 0 && memcmp(eb->data, b, sizeof b) == 0, "b");
        CHECK(ec && strcmp(ec->file, p2) == 0 && memcmp(ec->data, c, sizeof c) == 0 &&
                  ec->shape[1] == 2,
              "c");
        CHECK(whale_st_metadata(st, "shard") && strcmp(whale_st_metadata(st, "shard"), "one") == 0,
              "first shard's metadata wins");
        CHECK(whale_st_metadata(st, "only2") != NULL, "later shard's metadata is visible");
        whale_st_close(st);
    }

    /* Index problems, one at a time, in the same directory. */
    const char *IDX = "model.safetensors.index.json";
    write_index(dir, "{\"weight_map\":{\"a\":");
    expect_dir_fail("index bad json", dir, WHALE_ERR_FORMAT, IDX, "not valid JSON");
    write_index(dir, "[]");
    expect_dir_fail("index array", dir, WHALE_ERR_FORMAT, IDX, "weight_map");
    write_index(dir, "{\"metadata\":{}}");
    expect_dir_fail("no weight_map", dir, WHALE_ERR_FORMAT, IDX, "weight_map");
    write_index(dir, "{\"weight_map\":[\"model-00001-of-00002.safetensors\"]}");
    expect_dir_fail("weight_map array", dir, WHALE_ERR_FORMAT, IDX, "weight_map");
    write_index(dir, "{\"weight_map\":{\"a\":1}}");
    expect_dir_fail("shard not a string", dir, WHALE_ERR_FORMAT, IDX, "not a string");
    write_index(dir, "{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}");
    expect_dir_fail("shard escapes", dir, WHALE_ERR_FORMAT, IDX, "plain file name");
    write_index(dir, "{\"weight_map\":{\"a\":\"..\"}}");
    expect_dir_fail("shard is ..", dir, WHALE_ERR_FORMAT, IDX, "plain file name");
    write_index(dir, "{\"weight_map\":{\"a\":\"/etc/passwd\"}}");
    expect_dir_fail("shard absolute", dir, WHALE_ERR_FORMAT, IDX, "plain file name");
    write_index(dir, "{\"weight_map\":{\"a\":\"\"}}");
    expect_dir_fail("shard empty name", dir, WHALE_ERR_FORMAT, IDX, "plain file name");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00003-of-00003.safetensors\"}}");
    expect_dir_fail("missing shard", dir, WHALE_ERR_IO, "model-00003-of-00003.safetensors",
                    "cannot open");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\","
                     "\"d\":\"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail("tensor not in shard", dir, WHALE_ERR_FORMAT, "'d'", "does not hold");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail("unlisted tensor", dir, WHALE_ERR_FORMAT, "model-00001-of-00002.safetensors",
                    "'b' that");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00002-of-00002.safetensors\","
                     "\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail("tensor in the wrong shard", dir, WHALE_ERR_FORMAT, "'b' that",
                    "listed for model-00002-of-00002.safetensors");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00001-of-00002.safetensors\"}}");
    expect_dir_fail("tensor listed for a shard without it", dir, WHALE_ERR_FORMAT, "'c'",
                    "does not hold");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\xff\"}}");
    expect_dir_fail("index not UTF-8", dir, WHALE_ERR_FORMAT, IDX, "UTF-8");
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\"}}");
    expect_dir_fail("index lists a tensor twice", dir, WHALE_ERR_FORMAT, IDX, "twice");

    /* A corrupt shard is reported by its own name. */
    char p3[1024];
    snprintf(p3, sizeof p3, "%s/model-00003-of-00003.safetensors", dir);
    craft(p3, 4, "{]}x", 4, 0);
    write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                     "\"b\":\"model-00001-of-00002.safetensors\","
                     "\"c\":\"model-00003-of-00003.safetensors\"}}");
    expect_dir_fail("corrupt shard", dir, WHALE_ERR_FORMAT, "model-00003-of-00003.safetensors",
                    "not valid JSON");
}

/* ------------------------------------------------------------ main */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

int main(void) {
    test_tmpdir("safetensors", tmpdir, sizeof tmpdir);
    test_round_trip();
    test_many();
    test_accepts();
    test_bad_files();
    test_write_errors();
    test_dirs();
    nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_finish("test_safetensors");
}
