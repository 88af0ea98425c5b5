/* whale plot: SVG charts of metrics.jsonl runs. Small runs are written to a
 * temporary folder and plotted; the SVG is checked for balanced tags, the
 * run names, one path per drawn line, gaps at NaN, and no non-finite
 * coordinates; then the error cases (empty file, malformed line, ...). */
#include "testutil.h"

#include "whale_plot.h"
#include "whale.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[512];

static const char *put(const char *rel, const char *text) {
    static char path[8][640];
    static int slot;
    char *p = path[slot++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", tmp, rel);
    for (char *slash = p + strlen(tmp) + 1; (slash = strchr(slash, '/')) != NULL; *slash++ = '/') {
        *slash = '\0';
        mkdir(p, 0755); /* parent folders; fine if they exist */
    }
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *in(const char *rel) {
    static char path[8][640];
    static int slot;
    char *p = path[slot++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", tmp, rel);
    return p;
}

/* Append printf-style text to a buffer holding a string. */
static void app(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void app(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Tags balance, attribute values are quoted, '&' starts an entity, and no
 * number is NaN or infinite: enough to trust a browser or rsvg to read it. */
static int well_formed(const char *svg, char *why, size_t cap) {
    const char *stack[64];
    size_t lens[64];
    int depth = 0;
    size_t n = strlen(svg);
    if (strncmp(svg, "<svg ", 5) || n < 7 || strcmp(svg + n - 7, "</svg>\n"))
        return snprintf(why, cap, "does not start with <svg and end with </svg>"), 0;
    for (const char *p = svg; *p; p++) {
        if (*p == '&') {
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) && strncmp(p, "&quot;", 6))
                return snprintf(why, cap, "bare & at %ld", (long)(p - svg)), 0;
            continue;
        }
        if (*p == '>') return snprintf(why, cap, "stray > at %ld", (long)(p - svg)), 0;
        if (*p != '<') continue;
        const char *end = p + 1;
        int quote = 0;
        while (*end && (quote || *end != '>')) {
            if (*end == '"') quote = !quote;
            if (*end == '<' && !quote) return snprintf(why, cap, "< inside a tag at %ld", (long)(end - svg)), 0;
            end++;
        }
        if (!*end) return snprintf(why, cap, "unterminated tag"), 0;
        if (p[1] == '/') {
            size_t len = (size_t)(end - p - 2);
            if (!depth || lens[depth - 1] != len || strncmp(stack[depth - 1], p + 2, len))
                return snprintf(why, cap, "mismatched </%.*s>", (int)len, p + 2), 0;
            depth--;
        } else if (end[-1] != '/') {
            if (depth == 64) return snprintf(why, cap, "too deep"), 0;
            const char *name = p + 1;
            size_t len = 0;
            while (isalnum((unsigned char)name[len])) len++;
            stack[depth] = name;
            lens[depth++] = len;
        }
        p = end;
    }
    if (depth) return snprintf(why, cap, "%d unclosed tags", depth), 0;
    /* numbers only: run names are checked not to contain these */
    for (const char *p = svg; *p; p++)
        if (!strncasecmp(p, "nan", 3) || !strncasecmp(p, "inf", 3))
            return snprintf(why, cap, "non-finite value at %ld: %.20s", (long)(p - svg), p), 0;
    return 1;
}

/* The d attribute of the path whose tooltip is `title` (malloc'd), or NULL. */
static char *path_of(const char *svg, const char *title) {
    char key[256];
    snprintf(key, sizeof key, "<title>%s</title></path>", title);
    const char *t = strstr(svg, key);
    if (!t) return NULL;
    const char *p = t;
    while (p > svg && strncmp(p, "<path d=\"", 9)) p--;
    if (p == svg) return NULL;
    p += 9;
    const char *q = strchr(p, '"');
    char *d = malloc((size_t)(q - p) + 1);
    memcpy(d, p, (size_t)(q - p));
    d[q - p] = '\0';
    return d;
}

static char *render(const char *const *inputs, int n, const whale_plot_opts *o, whale_err *err) {
    char *svg = NULL;
    size_t len = 0;
    if (whale_plot_render(inputs, n, o, &svg, &len, err) != WHALE_OK) return NULL;
    CHECK(len == strlen(svg), "length %zu vs %zu", len, strlen(svg));
    char why[200];
    CHECK(well_formed(svg, why, sizeof why), "%s", why);
    return svg;
}

static void test_two_runs(void) {
    /* run "alpha": a folder with train, val, a checkpoint event and extra keys */
    char text[16384] = "";
    for (int s = 1; s <= 50; s++) {
        app(text, sizeof text,
            "{\"step\": %d, \"loss\": %.4f, \"lr\": 3e-4, \"grad_norm\": 0.8, \"tokens\": %d, "
            "\"tokens_per_s\": 1500, \"elapsed_s\": %.1f}\n",
            s * 10, 6.0 - s * 0.05, s * 4096, s * 0.3);
        if (s % 10 == 0)
            app(text, sizeof text, "{\"step\": %d, \"val_loss\": %.3f, \"val_ppl\": 100}\n", s * 10, 5.9 - s * 0.05);
        if (s == 25) app(text, sizeof text, "{\"event\": \"checkpoint\", \"step\": 250}\n");
    }
    put("alpha/metrics.jsonl", text);
    /* run "beta": a file, shorter, with NaN / Infinity / null gaps, out of
     * order and a repeated step (the later line wins) */
    text[0] = '\0';
    for (int s = 1; s <= 30; s++) {
        if (s == 12) app(text, sizeof text, "{\"step\": %d, \"loss\": NaN}\n", s * 10);
        else if (s == 13) app(text, sizeof text, "{\"step\": %d, \"loss\": -Infinity}\n", s * 10);
        else if (s == 20) app(text, sizeof text, "{\"step\": %d, \"loss\": null}\n", s * 10);
        else app(text, sizeof text, "{\"step\": %d, \"loss\": %.4f}\n", s * 10, 5.0 - s * 0.04);
    }
    app(text, sizeof text, "{\"step\": 50, \"loss\": 9.5}\n{\"step\": 100, \"val_loss\": 4.5}\n");
    app(text, sizeof text, "{\"step\": 200, \"val_loss\": nan}\n{\"step\": 300, \"val_loss\": 4.1}\n");
    put("beta.jsonl", text);

    const char *inputs[2] = {in("alpha"), in("beta.jsonl")};
    whale_err err;
    char *svg = render(inputs, 2, NULL, &err);
    CHECK(svg, "%s", err.msg);
    if (!svg) return;
    CHECK(strstr(svg, ">alpha</text>") && strstr(svg, ">beta</text>"), "run names in the legend");
    CHECK(strstr(svg, ">train</text>") && strstr(svg, ">val</text>"), "train / val key");
    CHECK(strstr(svg, ">step</text>") && strstr(svg, ">loss</text>"), "axis labels");
    /* alpha: train, its moving average, val; beta: train and its average
     * (its val points are isolated by a NaN: markers only) */
    CHECK(count(svg, "<path ") == 5, "%d paths", count(svg, "<path "));
    CHECK(count(svg, "<title>alpha loss</title>") == 1, "alpha's train loss");
    CHECK(count(svg, "<title>alpha loss (moving average)</title>") == 1, "alpha's average");
    CHECK(count(svg, "<title>alpha val_loss</title>") == 1, "alpha's val loss");
    char *d = path_of(svg, "beta loss");
    CHECK(d && count(d, "M") == 3, "beta's train loss in 3 pieces (gaps at 120-130 and 200): %s", d ? d : "none");
    CHECK(d && count(d, "L") == 30 - 3 - 3, "beta has 27 finite points: %s", d ? d : "none");
    free(d);
    d = path_of(svg, "beta val_loss");
    CHECK(!d, "beta's val loss is two isolated points, no line");
    free(d);
    CHECK(count(svg, "<circle") == 5 + 2 + 1, "markers: 5 alpha val, 2 beta val, 1 in the key");
    /* the repeated step 50: 9.5 is the highest loss, so the y axis reaches 9 */
    CHECK(strstr(svg, ">9</text>"), "later line wins for a repeated step");
    free(svg);

    /* atomic write gives the same text and leaves no temporary file */
    whale_plot_opts opt = {.title = "Runs & <things>", .width = 640, .height = 400};
    char out[640], tmpf[700];
    snprintf(out, sizeof out, "%s/loss.svg", tmp);
    snprintf(tmpf, sizeof tmpf, "%s.tmp", out);
    CHECK(whale_plot_svg(inputs, 2, &opt, out, &err) == WHALE_OK, "%s", err.msg);
    FILE *f = fopen(out, "rb");
    CHECK(f, "output written");
    if (f) {
        char *file = calloc(1, 1 << 20);
        size_t n = fread(file, 1, (1 << 20) - 1, f);
        fclose(f);
        char *again = render(inputs, 2, &opt, &err);
        CHECK(again && n == strlen(again) && !strcmp(file, again), "file equals rendered text");
        CHECK(strstr(file, "width=\"640\" height=\"400\""), "size option");
        CHECK(strstr(file, ">Runs &amp; &lt;things&gt;</text>"), "title escaped");
        free(again);
        free(file);
    }
    CHECK(access(tmpf, F_OK) != 0, "no .tmp left behind");
    snprintf(out, sizeof out, "%s/no/such/dir/x.svg", tmp);
    CHECK(whale_plot_svg(inputs, 2, NULL, out, &err) == WHALE_ERR_IO, "unwritable output: %s", err.msg);

    /* other metrics: lines only, no smoothing, the key as y label */
    whale_plot_opts lr = {.metric = "lr"};
    svg = render(inputs, 2, &lr, &err);
    CHECK(svg, "%s", err.msg);
    if (svg) {
        CHECK(count(svg, "<path ") == 1, "lr: only alpha has lr (%d paths)", count(svg, "<path "));
        CHECK(strstr(svg, ">beta (no data)</text>"), "a run without the key is marked");
        CHECK(strstr(svg, ">lr</text>"), "y label");
        free(svg);
    }
    whale_plot_opts vp = {.metric = "val_ppl", .log_y = 1};
    svg = render(inputs, 1, &vp, &err);
    CHECK(svg, "%s", err.msg);
    if (svg) {
        CHECK(count(svg, "<circle") == 5, "val_* metrics get markers");
        CHECK(strstr(svg, "val_ppl (log scale)"), "log label");
        free(svg);
    }
    whale_plot_opts sm = {.smooth = 1, .log_y = 1};
    svg = render(inputs, 2, &sm, &err);
    CHECK(svg && count(svg, "<path ") == 3, "--smooth 1 turns the average off");
    free(svg);
}

static void test_edges(void) {
    whale_err err;
    /* one point: no line, a marker; x and y ranges widened around it */
    const char *one[1] = {put("one.jsonl", "{\"step\": 0, \"loss\": 3.5}\n")};
    char *svg = render(one, 1, NULL, &err);
    CHECK(svg, "%s", err.msg);
    if (svg) {
        CHECK(count(svg, "<path ") == 0 && count(svg, "<circle") == 1, "single point is a marker");
        CHECK(strstr(svg, ">3.5</text>") || strstr(svg, ">3.50</text>"), "tick at the value");
        free(svg);
    }
    /* identical values, on a log axis too */
    const char *flat[1] = {put("flat.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2}\n"
                                             "{\"step\": 3, \"loss\": 2}\n")};
    for (int lg = 0; lg < 2; lg++) {
        whale_plot_opts o = {.log_y = lg};
        svg = render(flat, 1, &o, &err);
        CHECK(svg && count(svg, "<path ") == 1, "flat line (log %d): %s", lg, svg ? "" : err.msg);
        free(svg);
    }
    /* negative values vanish from a log axis; lines from different lengths */
    const char *neg[2] = {put("neg.jsonl", "{\"step\": 1, \"loss\": -1}\n{\"step\": 2, \"loss\": 0.5}\n"
                                           "{\"step\": 3, \"loss\": 0.25}\n{\"step\": 4, \"loss\": 0}\n"),
                          put("long.jsonl", "{\"step\": 1, \"loss\": 1}\n{\"step\": 1000, \"loss\": 0.001}\n")};
    whale_plot_opts lg = {.log_y = 1};
    svg = render(neg, 2, &lg, &err);
    CHECK(svg, "%s", err.msg);
    if (svg) {
        CHECK(count(svg, "<path ") == 2, "two lines");
        CHECK(strstr(svg, ">0.001</text>") && strstr(svg, ">1</text>"), "decade ticks");
        CHECK(strstr(svg, ">1000</text>"), "x axis covers the longer run");
        free(svg);
    }
    /* a half-written last line is what a running trainer leaves: ignored */
    const char *part[1] = {put("part.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 1.5}\n"
                                             "{\"step\": 3, \"lo")};
    svg = render(part, 1, NULL, &err);
    CHECK(svg && count(svg, "<path ") == 1, "unterminated last line skipped: %s", svg ? "" : err.msg);
    free(svg);
    /* metrics.jsonl given directly is named after its folder; equal names are told apart */
    put("x/gamma/metrics.jsonl", "{\"step\": 1, \"loss\": 2}\n");
    put("y/gamma/metrics.jsonl", "{\"step\": 1, \"loss\": 3}\n");
    put("a&b/metrics.jsonl", "{\"step\": 1, \"loss\": 3}\n");
    const char *names[3] = {in("x/gamma/metrics.jsonl"), in("y/gamma/"), in("a&b")};
    svg = render(names, 3, NULL, &err);
    CHECK(svg, "%s", err.msg);
    if (svg) {
        CHECK(strstr(svg, ">gamma</text>") && strstr(svg, ">gamma (2)</text>"), "names from folders, made unique");
        CHECK(strstr(svg, ">a&amp;b</text>"), "names escaped");
        free(svg);
    }
}

static void expect_error(const char *const *inputs, int n, const whale_plot_opts *o, whale_code code,
                         const char *fragment) {
    whale_err err = {0};
    char *svg = NULL;
    whale_code rc = whale_plot_render(inputs, n, o, &svg, NULL, &err);
    CHECK(rc == code, "expected %s, got %s (%s)", whale_code_name(code), whale_code_name(rc), err.msg);
    CHECK(!svg, "no output on error");
    CHECK(strstr(err.msg, fragment) && !strchr(err.msg, '\n'), "message \"%s\" should name \"%s\"", err.msg, fragment);
    free(svg);
}

static void test_errors(void) {
    const char *good = put("good.jsonl", "{\"step\": 1, \"loss\": 2}\n");
    const char *a[2] = {good, put("empty.jsonl", "")};
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "empty.jsonl: empty");
    a[1] = put("blank.jsonl", "\n  \n");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "blank.jsonl: empty");
    a[1] = put("bad.jsonl", "{\"step\": 1, \"loss\": 2}\n\n{\"step\": 2, \"loss\": }\n{\"step\": 3, \"loss\": 1}\n");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "bad.jsonl:3: invalid JSON");
    a[1] = put("arr.jsonl", "[1, 2]\n");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "arr.jsonl:1: not a JSON object");
    a[1] = put("garbage.jsonl", "loss=2");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "garbage.jsonl:1: invalid JSON");
    a[1] = put("nostep.jsonl", "{\"loss\": 2}\n");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "nostep.jsonl:1: \"loss\" without a numeric \"step\"");
    a[1] = put("str.jsonl", "{\"step\": 1, \"val_loss\": \"low\"}\n");
    expect_error(a, 2, NULL, WHALE_ERR_FORMAT, "str.jsonl:1: \"val_loss\" is not a number");
    a[1] = in("missing.jsonl");
    expect_error(a, 2, NULL, WHALE_ERR_IO, "missing.jsonl: cannot open");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/nometrics", tmp);
    mkdir(dir, 0755);
    a[1] = dir;
    expect_error(a, 2, NULL, WHALE_ERR_IO, "no metrics.jsonl");
    const char *nan[1] = {put("nan.jsonl", "{\"step\": 1, \"loss\": NaN, \"val_loss\": Infinity}\n")};
    expect_error(nan, 1, NULL, WHALE_ERR_FORMAT, "no finite \"loss\" or \"val_loss\" values");
    whale_plot_opts o = {.metric = "perplexity"};
    expect_error(a, 1, &o, WHALE_ERR_FORMAT, "no finite \"perplexity\" values");
    const char *negs[1] = {put("negs.jsonl", "{\"step\": 1, \"loss\": -2}\n")};
    whale_plot_opts lg = {.log_y = 1};
    expect_error(negs, 1, &lg, WHALE_ERR_FORMAT, "no positive");
    expect_error(a, 0, NULL, WHALE_ERR_ARG, "no inputs");
    whale_plot_opts tiny = {.width = 10, .height = 10};
    expect_error(a, 1, &tiny, WHALE_ERR_ARG, "size");
}

int main(void) {
    test_tmpdir("plot", tmp, sizeof tmp);
    test_two_runs();
    test_edges();
    test_errors();
    if (!test_failures) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    return test_finish("test_plot");
}
